"""What the lab tells: the demo, the fault scenarios and the agent demo, each
run on a lab cluster (``spark_watchdog.lab.cluster``, ``session``)."""
