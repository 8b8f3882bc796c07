#!/usr/bin/env bash
# Run every check: lint, format, types, and the whole test suite (unit and
# integration tests against real components on loopback, the real-vLLM tier
# against vLLM's CPU build and the systemd guest tier), tests side by side in
# pytest-xdist workers (tests/support/suite_plan.py says how they are grouped).
#
#   scripts/test.sh            everything; what CI runs (.ci/run)
#   scripts/test.sh --fast     ruff and the tests that need no real server
#                              (not -m integration), for every change: about 2 min
#
# Extra arguments go to pytest, e.g. scripts/test.sh -k journal.
# SPARK_WATCHDOG_DOCKER=0 skips the Docker tier (tests/docker).
# SPARK_WATCHDOG_TEST_WORKERS sets the number of workers (default: 6 for the
# whole suite, 4 for --fast; docs/benchmarks.md says why).
#
# The real-vLLM tier's venv is built once and cached (about 2 minutes and
# 2.4 GB the first time); SPARK_WATCHDOG_REAL_VLLM=0 skips the tier. The
# systemd guest tier boots a Debian image made with debootstrap, and the unit
# suite runs on Debian 13's Python 3.13 (scripts/guest_image.py; about two
# minutes and 600 MB the first time, cached); SPARK_WATCHDOG_GUEST=0 skips it.
# Both builds and the two images are made side by side.
set -euo pipefail
cd "$(dirname "$0")/.."

fast=0
if [ "${1:-}" = "--fast" ]; then
    fast=1
    shift
fi

scripts/setup.sh
# Compiled modules kept (__pycache__, ignored by git): every worker and every
# process the tests start (agents, controllers, stand-ins) would otherwise
# compile the project anew, seconds of CPU each time.
unset PYTHONDONTWRITEBYTECODE

echo "== ruff check" >&2
.venv/bin/ruff check spark_watchdog tests bench scripts
echo "== ruff format --check" >&2
.venv/bin/ruff format --check spark_watchdog tests bench scripts

if [ "$fast" = 1 ]; then
    echo "== pytest, not integration" >&2
    # 30 of the simulation's random seeds here (the whole suite runs 500):
    # with the controller pair in a third of them, 500 alone take two minutes.
    export SPARK_WATCHDOG_SIM_SEEDS="${SPARK_WATCHDOG_SIM_SEEDS:-30}"
    exec .venv/bin/python -m pytest -n "${SPARK_WATCHDOG_TEST_WORKERS:-4}" --dist loadgroup \
        -m "not integration" "$@"
fi

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# The builds, side by side: each writes its log and its exit status.
build() {
    local name=$1
    shift
    local status=0
    "$@" >"$logs/$name.out" 2>"$logs/$name.err" || status=$?
    echo "$status" >"$logs/$name.status"
}
builds=()
if [ "${SPARK_WATCHDOG_REAL_VLLM:-1}" != "0" ] && [ -z "${SPARK_WATCHDOG_VLLM_PYTHON:-}" ]; then
    echo "== real-vLLM environment (building or reusing, beside the guest images)" >&2
    build real-vllm python3 scripts/real_vllm_env.py build &
    builds+=(real-vllm)
fi
if [ "${SPARK_WATCHDOG_GUEST:-1}" != "0" ]; then
    echo "== systemd guest images (building or reusing)" >&2
    for suite in bookworm trixie; do
        build "guest-$suite" python3 scripts/guest_image.py build "$suite" &
        builds+=("guest-$suite")
    done
fi
started=$SECONDS
wait
for name in "${builds[@]}"; do
    cat "$logs/$name.err" >&2
done

if [ "${SPARK_WATCHDOG_REAL_VLLM:-1}" != "0" ] && [ -n "${SPARK_WATCHDOG_VLLM_PYTHON:-}" ]; then
    echo "== real-vLLM environment: $SPARK_WATCHDOG_VLLM_PYTHON (SPARK_WATCHDOG_VLLM_PYTHON)" >&2
    export SPARK_WATCHDOG_REQUIRE_REAL_VLLM=1
elif [ "${SPARK_WATCHDOG_REAL_VLLM:-1}" != "0" ]; then
    status=$(cat "$logs/real-vllm.status")
    if [ "$status" -eq 0 ]; then
        SPARK_WATCHDOG_VLLM_PYTHON=$(cat "$logs/real-vllm.out")
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
    status=0
    for suite in bookworm trixie; do
        status=$(cat "$logs/guest-$suite.status")
        [ "$status" -eq 0 ] || break
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
# setup.sh installed nut-server: the NUT power path's tier (a real upsd with
# dummy-ups, tests/power/test_nut.py) runs, and fails rather than skips if it cannot.
export SPARK_WATCHDOG_REQUIRE_NUT=1
# setup.sh installed the kasa extra (python-kasa) where Python is 3.11 or newer: the
# Kasa and Tapo path's tests (tests/power/test_kasa.py) run, and fail rather than skip.
if .venv/bin/python -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    export SPARK_WATCHDOG_REQUIRE_KASA=1
fi
# setup.sh installed chromium, chromium-driver and selenium: the operator's page
# in a real browser (tests/web/test_page_browser.py) runs, and fails rather than skips.
export SPARK_WATCHDOG_REQUIRE_BROWSER=1
# setup.sh installed docker.io: as root, the Docker tier (tests/docker) starts
# a dockerd of its own, and fails rather than skips if it cannot. Its image is
# the guest tier's root file system, so it needs that tier's image too.
if [ "${SPARK_WATCHDOG_DOCKER:-1}" != "0" ] && [ -n "${SPARK_WATCHDOG_REQUIRE_GUEST:-}" ] &&
    [ "$(id -u)" -eq 0 ] && command -v dockerd >/dev/null; then
    export SPARK_WATCHDOG_REQUIRE_DOCKER=1
fi

# mypy beside pytest: the run fails if either fails.
echo "== mypy (spark_watchdog, bench, scripts, tests), beside pytest" >&2
# At a lower priority: it waits on nothing, the tests beside it wait on clocks
# (nice 5, not 19: a machine kept busy by another job would starve it).
nice -n 5 scripts/typecheck.sh >"$logs/mypy.log" 2>&1 &
mypy_pid=$!
echo "== pytest" >&2
pytest_status=0
.venv/bin/python -m pytest -n "${SPARK_WATCHDOG_TEST_WORKERS:-6}" --dist loadgroup "$@" ||
    pytest_status=$?
mypy_status=0
wait "$mypy_pid" || mypy_status=$?
echo "== mypy" >&2
cat "$logs/mypy.log" >&2
if [ "$mypy_status" -ne 0 ]; then
    echo "mypy failed (exit $mypy_status)" >&2
fi
if [ "$pytest_status" -ne 0 ]; then
    exit "$pytest_status"
fi
exit "$mypy_status"
