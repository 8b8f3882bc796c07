"""``spark-watchdog doctor``: will detection and the power path work, before an incident?

Each check reads something real (the journal, systemd, NVML, vLLM, the
agents, the power devices) and says ok, warn, fail or skip, with a concrete
fix when it is not ok. Doctor only reads: it never sends a power command.
"""
