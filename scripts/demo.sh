#!/usr/bin/env bash
# The main job on a machine without Sparks: four simulated DGX Sparks (the
# real agent on each, a vLLM rank it launched, an SSH banner, NVML, a
# journal), an SNMP PDU powering them and the real controller watching. One
# host freezes after an Xid 31; the controller cuts its outlet, sees the new
# boot and restarts serving with the safe profile. Exit 0 only if it ended in
# recovered. Extra arguments go to `spark-watchdog lab demo` (--json, --dir).
# The agent-only demo is still there: .venv/bin/spark-watchdog lab agent-demo
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/spark-watchdog lab demo "$@"
