"""One controller per history: the instance lock, against real processes and a real flock."""

from __future__ import annotations

import os
import re
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pytest

from spark_watchdog.errors import HistoryLocked, WatchdogError
from spark_watchdog.history import StoreError
from spark_watchdog.history.instance_lock import InstanceLock, lock_path_for

HOLDER = textwrap.dedent(
    """
    import sys, time
    from spark_watchdog.history.instance_lock import InstanceLock

    lock = InstanceLock(sys.argv[1])
    lock.acquire()
    print("held", flush=True)
    time.sleep(600)
    """
)


def lock_file_of(db_path: Path) -> Path:
    """Where the lock of ``db_path`` lives: beside the real file (tmp_path may be a symlink)."""
    return Path(os.path.realpath(db_path) + ".lock")


LINE = re.compile(r"^pid (\d+) on host (\S+) since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


@pytest.fixture
def holder(db_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the lock on ``db_path``, like a running controller."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if line.strip() != "held":
            process.kill()
            _, err = process.communicate(timeout=10)
            pytest.fail(f"lock holder did not start: {line!r} {err}")
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def test_a_second_controller_is_refused_naming_the_holder(
    db_path: Path, holder: subprocess.Popen[str]
) -> None:
    lock_file = lock_file_of(db_path)
    written = lock_file.read_text()
    lock = InstanceLock(db_path)
    with pytest.raises(HistoryLocked) as caught:
        lock.acquire()
    error = caught.value
    assert isinstance(error, WatchdogError)
    assert error.path == str(lock_file)
    assert error.holder == written.strip()
    match = LINE.match(error.holder)
    assert match is not None, error.holder
    assert int(match.group(1)) == holder.pid
    assert match.group(2) == socket.gethostname()
    message = str(error)
    assert message.startswith(f"{lock_file}: another controller is running on this history: ")
    assert f"pid {holder.pid} on host" in message
    assert "stop it first (systemctl stop spark-watchdog-controller)" in message
    assert "or point this one at another history" in message
    # The loser neither took the lock nor touched the holder's line.
    assert not lock.held
    assert lock_file.read_text() == written


def test_sigkill_of_the_holder_frees_the_lock(db_path: Path, holder: subprocess.Popen[str]) -> None:
    with pytest.raises(HistoryLocked):
        InstanceLock(db_path).acquire()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    # No cleanup ran in the holder: the kernel dropped its flock with its descriptors.
    with InstanceLock(db_path) as lock:
        assert lock.held
        text = lock_file_of(db_path).read_text()
        assert text == f"{lock.holder}\n"
        assert text.startswith(f"pid {os.getpid()} on host {socket.gethostname()} since ")


def test_the_lock_file_is_0600_and_names_the_holder(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old_umask = os.umask(0)  # even with no umask to help
    try:
        since = datetime(2026, 12, 1, 8, 0, 0, tzinfo=timezone.utc).timestamp()
        monkeypatch.setattr(socket, "gethostname", lambda: "mgmt-1")
        with InstanceLock(db_path, clock=lambda: since) as lock:
            lock_file = lock_file_of(db_path)
            assert lock.path == str(lock_file)
            assert stat.S_IMODE(lock_file.stat().st_mode) == 0o600
            expected = f"pid {os.getpid()} on host mgmt-1 since 2026-12-01T08:00:00Z"
            assert lock.holder == expected
            assert lock_file.read_text() == expected + "\n"
    finally:
        os.umask(old_umask)
    # Released, not deleted: deleting a flock file lets two processes both "hold" it.
    assert lock_file.exists() and not lock.held


def test_a_stale_longer_line_is_truncated_and_loose_modes_tightened(db_path: Path) -> None:
    lock_file = lock_file_of(db_path)
    lock_file.write_text("pid 99999999 on host a-much-longer-hostname-from-before since then\n")
    lock_file.chmod(0o644)
    with InstanceLock(db_path) as lock:
        assert lock_file.read_text() == f"{lock.holder}\n"
        assert stat.S_IMODE(lock_file.stat().st_mode) == 0o600


def test_two_locks_in_one_process_conflict_until_released(db_path: Path) -> None:
    first = InstanceLock(db_path)
    second = InstanceLock(db_path)
    with first:
        with pytest.raises(HistoryLocked, match=f"pid {os.getpid()} on host"):
            second.acquire()
        with pytest.raises(RuntimeError, match="already held"):
            first.acquire()
    second.acquire()
    second.release()
    second.release()  # twice is fine
    assert not second.held


def test_two_spellings_of_one_history_share_one_lock(
    tmp_path: Path, db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = tmp_path / "link.db"
    link.symlink_to(db_path)
    monkeypatch.chdir(tmp_path)
    assert lock_path_for(link) == lock_path_for("history.db") == str(lock_file_of(db_path))
    with InstanceLock("history.db"), pytest.raises(HistoryLocked):
        InstanceLock(link).acquire()


def test_an_in_memory_history_needs_no_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert lock_path_for(":memory:") is None
    with InstanceLock(":memory:") as first, InstanceLock(":memory:") as second:
        assert (first.held, second.held, first.path) == (True, True, None)
    assert not first.held
    assert list(tmp_path.iterdir()) == []


def test_an_unopenable_lock_file_is_a_store_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-dir" / "history.db"
    with pytest.raises(StoreError, match="cannot open the controller's instance lock") as caught:
        InstanceLock(missing).acquire()
    assert caught.value.path == f"{os.path.realpath(missing)}.lock"
