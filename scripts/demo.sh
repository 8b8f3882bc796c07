#!/usr/bin/env bash
# The main job on a machine without Sparks: a simulated vLLM rank, the real
# agent watching it, and a wedge (engine stops stepping while /health stays
# 200) that the agent must call `stalled`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/spark-watchdog lab agent-demo "$@"
