"""The lab: simulated Spark nodes, vLLM and power devices on one machine."""
