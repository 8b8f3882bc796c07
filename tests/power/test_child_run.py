"""The bounded child runner (spark_watchdog/child_run.py), with real children:
one that floods its output, one whose grandchild holds the pipe, one that
prints past the cap and exits, one that cannot start."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import pytest

from spark_watchdog.child_run import ChildNotStarted, ChildRun, run_child, run_child_blocking

ENV = {"PATH": os.defpath, "LC_ALL": "C"}
# Generous: a loaded 2-core CI machine. What it rules out is the unbounded run
# (a flood runs until its memory is gone; a held pipe until the grandchild ends).
MARGIN_S = 8.0

FLOOD = "import sys\nwhile True: sys.stdout.write('x' * 65536)"
# The child forks a grandchild that keeps the pipes and sleeps, then exits itself.
GRANDCHILD = (
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    open('{pidfile}', 'w').write(str(os.getpid())); time.sleep(600)\n"
    "else:\n"
    "    print('parent done', flush=True)\n"
)


def run(argv: list[str], timeout: float, **caps: int) -> tuple[ChildRun, float]:
    started = time.monotonic()
    ran = asyncio.run(run_child(argv, timeout=timeout, environment=ENV, **caps))
    return ran, time.monotonic() - started


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose (its parent, the child, is gone).
    status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return status != "Z"


@pytest.mark.integration
def test_a_flood_is_cut_to_its_cap_and_killed_at_its_timeout() -> None:
    ran, took = run([sys.executable, "-c", FLOOD], timeout=1.0, head_bytes=4096, tail_bytes=512)
    assert ran.timed_out and ran.returncode is None
    assert took < 1.0 + MARGIN_S
    assert ran.stdout.kept <= 4096 + 512
    assert ran.stdout.dropped > 0 and ran.cut
    assert ran.stdout.head == b"x" * 4096
    assert "ran over its 1s timeout" in ran.ended()


@pytest.mark.integration
def test_a_grandchild_holding_the_pipe_is_killed_with_the_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    code = GRANDCHILD.format(pidfile=pidfile)
    ran, took = run([sys.executable, "-c", code], timeout=1.5)
    assert ran.timed_out
    assert took < 1.5 + MARGIN_S
    assert "parent done" in ran.stdout.text()
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + MARGIN_S
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild)


@pytest.mark.integration
def test_output_past_the_cap_keeps_its_head_and_last_line() -> None:
    code = "import sys\nsys.stdout.write('a' * 200000 + '\\nlast line\\n')\nsys.exit(3)"
    ran, _ = run([sys.executable, "-c", code], timeout=30.0, head_bytes=1000, tail_bytes=100)
    assert ran.returncode == 3 and ran.ended() == "exited 3"
    assert ran.stdout.text().splitlines()[-1] == "last line"
    assert ran.stdout.dropped == 200000 + len("\nlast line\n") - 1000 - 100
    assert "bytes cut" in ran.stdout.text()


@pytest.mark.integration
def test_a_signal_is_told_as_such() -> None:
    ran, _ = run([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], timeout=30.0)
    assert ran.returncode == -9 and ran.ended() == "was killed by signal 9"


@pytest.mark.parametrize(
    "argv",
    [["/nonexistent/relay"], ["/"], ["/etc/hostname"], [sys.executable, "-c", "pass\0"], []],
    ids=["missing", "directory", "not-executable", "nul", "empty"],
)
def test_a_program_that_cannot_start_never_ran(argv: list[str]) -> None:
    with pytest.raises(ChildNotStarted):
        asyncio.run(run_child(argv, timeout=5.0, environment=ENV))


@pytest.mark.integration
def test_a_cancelled_run_leaves_no_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    code = f"import os, time\nopen('{pidfile}', 'w').write(str(os.getpid()))\ntime.sleep(600)"

    async def cancel_it() -> None:
        task = asyncio.ensure_future(
            run_child([sys.executable, "-c", code], timeout=600, environment=ENV)
        )
        deadline = time.monotonic() + MARGIN_S
        while not pidfile.exists() or not pidfile.read_text():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_it())
    assert not alive(int(pidfile.read_text()))


# -- the same bounds from a thread (run_child_blocking) ---------------------------


@pytest.mark.integration
def test_from_a_thread_a_flood_is_cut_and_killed_at_its_timeout() -> None:
    started = time.monotonic()
    ran = run_child_blocking(
        [sys.executable, "-c", FLOOD], timeout=1.0, environment=ENV, head_bytes=4096, tail_bytes=512
    )
    assert ran.timed_out and time.monotonic() - started < 1.0 + MARGIN_S
    assert ran.stdout.kept <= 4096 + 512 and ran.stdout.dropped > 0
    assert ran.stdout.head == b"x" * 4096


@pytest.mark.integration
def test_from_a_thread_a_grandchild_holding_the_pipe_goes_with_the_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    started = time.monotonic()
    ran = run_child_blocking(
        [sys.executable, "-c", GRANDCHILD.format(pidfile=pidfile)], timeout=1.5, environment=ENV
    )
    assert time.monotonic() - started < 1.5 + MARGIN_S
    assert "parent done" in ran.stdout.text() and ran.returncode == 0
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + MARGIN_S
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(grandchild)


@pytest.mark.integration
def test_from_a_thread_output_past_the_cap_keeps_its_head_and_last_line() -> None:
    code = "import sys\nsys.stdout.write('a' * 200000 + '\\nlast line\\n')\nsys.exit(3)"
    ran = run_child_blocking(
        [sys.executable, "-c", code], timeout=30.0, head_bytes=1000, tail_bytes=100
    )
    assert ran.returncode == 3 and ran.stdout.text().splitlines()[-1] == "last line"
    assert ran.stdout.dropped == 200000 + len("\nlast line\n") - 1000 - 100


@pytest.mark.parametrize(
    "argv",
    [["/nonexistent/relay"], ["/"], ["/etc/hostname"], [sys.executable, "-c", "pass\0"], []],
    ids=["missing", "directory", "not-executable", "nul", "empty"],
)
def test_from_a_thread_a_program_that_cannot_start_never_ran(argv: list[str]) -> None:
    with pytest.raises(ChildNotStarted):
        run_child_blocking(argv, timeout=5.0)
