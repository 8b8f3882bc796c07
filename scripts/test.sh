#!/usr/bin/env bash
# Run every check: lint, format, types, and the whole test suite (unit and
# integration tests against real components on loopback). Extra arguments go
# to pytest, e.g. scripts/test.sh -k journal
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

echo "== ruff check" >&2
.venv/bin/ruff check spark_watchdog tests bench
echo "== ruff format --check" >&2
.venv/bin/ruff format --check spark_watchdog tests bench
echo "== mypy" >&2
.venv/bin/mypy
echo "== pytest" >&2
exec .venv/bin/python -m pytest "$@"
