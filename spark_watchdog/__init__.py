"""spark_watchdog: freeze watchdog for vLLM on NVIDIA DGX Spark clusters."""

__version__ = "0.2.0"
