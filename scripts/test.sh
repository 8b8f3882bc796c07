#!/usr/bin/env bash
# Run every check: lint, format, types, and the whole test suite (unit and
# integration tests against real components on loopback, and the real-vLLM
# tier against vLLM's CPU build, whose venv is built once and cached: about
# 3 minutes and 2.4 GB the first time). Extra arguments go to pytest, e.g.
# scripts/test.sh -k journal. SPARK_WATCHDOG_REAL_VLLM=0 skips the real-vLLM
# tier (and its build). The systemd guest tier boots a Debian image made
# with debootstrap, and the unit suite runs on Debian 13's Python 3.13
# (scripts/guest_image.py; about two minutes and 600 MB the first time,
# cached); SPARK_WATCHDOG_GUEST=0 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

echo "== ruff check" >&2
.venv/bin/ruff check spark_watchdog tests bench scripts
echo "== ruff format --check" >&2
.venv/bin/ruff format --check spark_watchdog tests bench scripts
echo "== mypy (spark_watchdog, bench, scripts, tests)" >&2
scripts/typecheck.sh
if [ "${SPARK_WATCHDOG_REAL_VLLM:-1}" != "0" ] && [ -n "${SPARK_WATCHDOG_VLLM_PYTHON:-}" ]; then
    echo "== real-vLLM environment: $SPARK_WATCHDOG_VLLM_PYTHON (SPARK_WATCHDOG_VLLM_PYTHON)" >&2
    export SPARK_WATCHDOG_REQUIRE_REAL_VLLM=1
elif [ "${SPARK_WATCHDOG_REAL_VLLM:-1}" != "0" ]; then
    echo "== real-vLLM environment" >&2
    started=$SECONDS
    status=0
    SPARK_WATCHDOG_VLLM_PYTHON=$(python3 scripts/real_vllm_env.py build) || status=$?
    if [ "$status" -eq 0 ]; then
        echo "real-vllm: ready after $((SECONDS - started)) s" >&2
        export SPARK_WATCHDOG_VLLM_PYTHON
        export SPARK_WATCHDOG_REQUIRE_REAL_VLLM=1
    elif [ "$status" -eq 3 ]; then
        echo "real-vllm: not possible on this machine; the real-vLLM tier is skipped" >&2
        unset SPARK_WATCHDOG_VLLM_PYTHON
    else
        exit "$status"
    fi
fi
if [ "${SPARK_WATCHDOG_GUEST:-1}" != "0" ]; then
    echo "== systemd guest images" >&2
    status=0
    for suite in bookworm trixie; do
        python3 scripts/guest_image.py build "$suite" >/dev/null || { status=$?; break; }
    done
    if [ "$status" -eq 0 ]; then
        export SPARK_WATCHDOG_REQUIRE_GUEST=1
    elif [ "$status" -eq 3 ]; then
        echo "guest-image: not possible on this machine; the systemd guest tier is skipped" >&2
        unset SPARK_WATCHDOG_REQUIRE_GUEST
    else
        exit "$status"
    fi
fi
# setup.sh installed PostgreSQL and psycopg: the history's PostgreSQL tier
# runs (tests/history), and fails rather than skips if it cannot.
export SPARK_WATCHDOG_REQUIRE_POSTGRES=1
echo "== pytest" >&2
# The 20 slowest tests at the end: where the suite's time goes.
exec .venv/bin/python -m pytest --durations=20 "$@"
