"""The suite's own plan for running side by side (tests/support/suite_plan.py),
tried on a small suite in a pytest of its own: each module's tests on one
worker, a named group across modules on one worker, the longest groups first,
and each worker's ports in a slice of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SUPPORT = Path(__file__).resolve().parents[1] / "support"

MODULE = """import os, time
from pathlib import Path
import pytest

def _seen(name):
    worker = os.environ["PYTEST_XDIST_WORKER"]
    line = f"{{time.monotonic()}} {{worker}} {{os.environ['SPARK_WATCHDOG_PORTS']}} {{name}}\\n"
    with open(Path(__file__).with_name("seen.log"), "a") as log:
        log.write(line)
    time.sleep(0.3)

def test_one(): _seen("{module}::one")
def test_two(): _seen("{module}::two")

@pytest.mark.xdist_group("together")
def test_together(): _seen("{module}::together")
"""


def test_groups_stay_on_one_worker_and_the_longest_start_first(tmp_path: Path) -> None:
    for module in ("a", "b", "c", "d"):
        (tmp_path / f"test_{module}.py").write_text(MODULE.format(module=module))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    times = tmp_path / "times.json"
    times.write_text(json.dumps({"test_c": 50.0, "test_d": 40.0, "together": 1.0}))
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "suite_plan", "-p", "no:cacheprovider"),
            *("-n", "2", "--dist", "loadgroup", f"--group-times={tmp_path / 'out.json'}", "-q"),
        ],
        cwd=tmp_path,
        env={
            # A run of its own, also when this test runs in a worker of another.
            **{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")},
            "PYTHONPATH": str(SUPPORT),
            "SPARK_WATCHDOG_GROUP_TIMES": str(times),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seen = [line.split() for line in (tmp_path / "seen.log").read_text().splitlines()]
    seen.sort(key=lambda fields: float(fields[0]))
    worker_of: dict[str, set[str]] = {}
    for _, worker, _, name in seen:
        group = "together" if name.endswith("::together") else name.split("::")[0]
        worker_of.setdefault(group, set()).add(worker)
    assert all(len(workers) == 1 for workers in worker_of.values()), worker_of
    # The two longest groups (by the times file) are the first two to start.
    first_two = {fields[3].split("::")[0] for fields in seen[:2]}
    assert first_two == {"c", "d"}, seen
    # Two workers, two slices of ports that do not meet.
    ranges = {worker: tuple(map(int, ports.split("-"))) for _, worker, ports, _ in seen}
    (_, high_a), (low_b, _) = sorted(ranges.values())
    assert high_a < low_b
    # The run's own group times, in the form of the times file.
    written = json.loads((tmp_path / "out.json").read_text())
    assert set(written) == {"test_a", "test_b", "test_c", "test_d", "together"}
    assert "time per xdist group" in done.stdout
