"""One controller per freeze history: an exclusive ``flock`` beside the database.

Two controllers on one history would both fence the same nodes (each power-
cycling what the other just restored) and interleave their write-ahead logs.
SQLite's own locks do not stop that: each write is a short transaction, so
two writers take turns happily. The controller therefore holds
``<history>.lock`` (``history.db.lock``) for as long as it runs:

- ``flock(LOCK_EX | LOCK_NB)``: a second controller fails at once instead of
  waiting, with a ``HistoryLocked`` that names the holder;
- the kernel drops the lock when the holder's file descriptor closes, so a
  controller killed by SIGKILL, the OOM killer or a crash leaves no stale
  lock behind; there is no pid file to clean up and none is trusted;
- the holder writes ``pid 1234 on host mgmt-1 since 2026-12-01T08:00:00Z``
  into the file once it holds the lock, for the other one's message only;
- the file is never deleted: unlinking a lock file lets a process that opened
  the old inode and one that creates a new one both "hold" the lock.

``flock`` locks are local to one host (on NFS they are emulated, or not
shared at all); the history must be on a local disk anyway (WAL needs
shared memory). ``":memory:"`` histories are private to one process: there
the lock does nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from collections.abc import Callable
from datetime import datetime, timezone

from spark_watchdog.errors import HistoryLocked, StoreError

LOCK_SUFFIX = ".lock"
# How long a loser waits for a brand-new holder to write its line (it takes the
# lock first, then truncates and writes), so the message names it.
_HOLDER_WAIT_S = 0.2
_HOLDER_MAX_BYTES = 512


def lock_path_for(history_path: str | os.PathLike[str]) -> str | None:
    """``<history>.lock`` beside the real file, or None for an in-memory history.

    The path is resolved (symlinks, ``..``, relative paths) so that two
    spellings of one database share one lock.
    """
    path = os.fspath(history_path)
    return None if path == ":memory:" else os.path.realpath(path) + LOCK_SUFFIX


def holder_line(pid: int, host: str, since: float) -> str:
    """``pid 1234 on host mgmt-1 since 2026-12-01T08:00:00Z``."""
    at = datetime.fromtimestamp(since, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"pid {pid} on host {host} since {at}"


class InstanceLock:
    """The exclusive, non-blocking lock on one history. ``with`` it, or acquire/release.

    ``acquire`` raises ``HistoryLocked`` when another process (or another
    ``InstanceLock`` in this one) holds it, and ``StoreError`` when the lock
    file cannot be opened or locked at all (missing directory, read-only
    disk, a filesystem without flock).
    """

    def __init__(
        self,
        history_path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._history = os.fspath(history_path)
        self._path = lock_path_for(self._history)
        self._clock = clock
        self._fd: int | None = None
        self._held_memory = False
        self._holder: str | None = None

    @property
    def path(self) -> str | None:
        """The lock file, or None for an in-memory history."""
        return self._path

    @property
    def held(self) -> bool:
        return self._fd is not None or self._held_memory

    @property
    def holder(self) -> str | None:
        """What this lock wrote into the file while held."""
        return self._holder

    def acquire(self) -> None:
        if self.held:
            raise RuntimeError(f"instance lock on {self._history} is already held by this object")
        if self._path is None:
            self._held_memory = True
            return
        path = self._path
        try:
            # No O_TRUNC: the file holds the current holder's line until we own it.
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise StoreError(
                path,
                f"cannot open the controller's instance lock {path}: {exc.strerror}; "
                "the lock file lives beside the history database and needs the same "
                "writable directory",
            ) from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise HistoryLocked(path, _read_holder(fd)) from None
                raise StoreError(
                    path,
                    f"cannot lock the controller's instance lock {path}: {exc.strerror}; "
                    "keep the history on a local filesystem",
                ) from exc
            line = holder_line(os.getpid(), socket.gethostname(), self._clock())
            # Created 0600; tighten a file left looser by a person (best effort:
            # only its owner may, and the line in it is no secret).
            with contextlib.suppress(OSError):
                if os.fstat(fd).st_mode & 0o077:
                    os.fchmod(fd, 0o600)
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, (line + "\n").encode(), 0)
            except OSError as exc:
                raise StoreError(
                    path, f"cannot write the holder into {path}: {exc.strerror}"
                ) from exc
        except BaseException:
            os.close(fd)  # closing drops the flock too
            raise
        self._fd = fd
        self._holder = line

    def release(self) -> None:
        """Drop the lock. The file stays (see the module docstring). Safe to call twice."""
        self._held_memory = False
        fd, self._fd = self._fd, None
        self._holder = None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> InstanceLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        where = self._path or ":memory: (no lock file)"
        return f"InstanceLock({where!r}, {'held' if self.held else 'free'})"


def _read_holder(fd: int) -> str:
    """The holder's line, waiting briefly for a holder that has the lock but not yet written."""
    deadline = time.monotonic() + _HOLDER_WAIT_S
    while True:
        try:
            raw = os.pread(fd, _HOLDER_MAX_BYTES, 0)
        except OSError as exc:
            return f"unknown (the lock file could not be read: {exc.strerror})"
        text = " ".join(raw.decode("utf-8", errors="replace").split())
        if text or time.monotonic() >= deadline:
            return text or "unknown (the lock file names no holder)"
        time.sleep(0.02)
