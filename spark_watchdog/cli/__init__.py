"""The ``spark-watchdog`` command line."""
