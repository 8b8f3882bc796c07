"""The write-ahead log survives a real crash of the process that wrote it.

A child process writes steps and is killed (by itself right after add_step
returns, or by the parent at an arbitrary moment mid-write); the parent
reopens the file and finds every step whose add_step had returned.

This proves durability against a process crash. Durability against a power
loss of the controller host rests on ``PRAGMA synchronous = FULL`` (asserted
in test_migrations.py), which a test cannot pull the plug on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from spark_watchdog.history import HistoryStore

pytestmark = pytest.mark.integration

# The controller's sequence for one rung, as far as the middle of the off hold.
RUNG = ["rung_started", "off_requested", "off_verified", "hold_started"]

CHILD_SELF_KILL = textwrap.dedent(
    """
    import os, signal, sys
    from spark_watchdog.history import HistoryStore

    store = HistoryStore(sys.argv[1])
    incident = store.open_incident(
        "host_frozen", ["spark-2"], detected_at=100.0, evidence={"agent": "silent"}
    )
    for step in sys.argv[2:]:
        store.add_step(incident.id, step, node="spark-2", detail={"rung": 1})
    # Killed in the middle of the off hold: no close(), no atexit, no flush.
    if os.environ.get("HOW") == "exit":
        os._exit(0)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)

CHILD_LOOP = textwrap.dedent(
    """
    import sys
    from spark_watchdog.history import HistoryStore

    store = HistoryStore(sys.argv[1])
    incident = store.open_incident("host_frozen", ["spark-2"], detected_at=1.0, evidence={})
    print(f"incident {incident.id}", flush=True)
    n = 0
    while True:
        n += 1
        step = store.add_step(incident.id, "probe", node="spark-2", detail={"n": n})
        print(step.seq, flush=True)  # only after add_step returned
    """
)


def run_child(code: str, *args: str, env: dict[str, str] | None = None) -> int:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        timeout=30,
    )
    assert done.stderr == b"", done.stderr.decode()
    return done.returncode


@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_steps_survive_the_writer_dying_mid_ladder(db_path: Path, how: str) -> None:
    rc = run_child(CHILD_SELF_KILL, str(db_path), *RUNG, env={"HOW": how})
    assert rc == (-signal.SIGKILL if how == "sigkill" else 0)
    assert Path(f"{db_path}-wal").exists()  # nothing checkpointed it: WAL replay is tested

    # The restarted controller's view: one open incident, and where it stopped.
    with HistoryStore(db_path) as store:
        (incident,) = store.open_incidents()
        assert [s.step for s in store.steps(incident.id)] == ["incident_opened", *RUNG]
        last = store.last_step(incident.id, "spark-2")
        assert last is not None and last.step == "hold_started"
        assert store.integrity_check() == []


def test_every_step_reported_written_is_there_after_sigkill_at_any_moment(
    db_path: Path,
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_LOOP, str(db_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        header = child.stdout.readline()
        assert header.startswith("incident "), child.stderr.read() if child.stderr else ""
        incident_id = int(header.split()[1])
        deadline = time.monotonic() + 10
        confirmed = 0
        # Let it write a while, then kill it wherever it is (likely mid-commit).
        while confirmed < 40 and time.monotonic() < deadline:
            confirmed = int(child.stdout.readline())
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        # Lines already in the pipe were written after a returned add_step too.
        confirmed = max([confirmed, *(int(line) for line in child.stdout.read().split())])
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()

    assert confirmed >= 40
    with HistoryStore(db_path) as store:
        seqs = [s.seq for s in store.steps(incident_id)]
        assert store.integrity_check() == []
    # Every confirmed step is there; at most the one in flight beyond them; no gaps.
    assert seqs == list(range(1, len(seqs) + 1))
    assert confirmed <= len(seqs) <= confirmed + 1
