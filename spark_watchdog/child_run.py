"""One child process, bounded in bytes and in time, and never left behind.

Every program the product runs on an operator's behalf (a vendor's power
command, ipmitool, ssh) goes through :func:`run_child`, and those run from a
thread (py-spy before a serving stop, systemctl, doctor's look at the
watchdog) through :func:`run_child_blocking`:

- an argv, no shell, stdin from ``/dev/null``, in a session (and so a
  process group) of its own;
- stdout and stderr each bounded: the first ``head_bytes`` and the last
  ``tail_bytes`` are kept, what lies between is read and dropped (so the
  child never blocks on a full pipe), and the result says how much was cut;
- bounded in time: past ``timeout`` the whole process group is killed
  (SIGKILL: a grandchild holding the pipe goes too) and reaped; the readers
  get a short grace to see the pipes close, then the pipes are closed;
- cancelled (the caller's own deadline, a shutdown): the group is killed
  and reaped the same way before the cancellation goes on.

The result says how the run ended (exited, killed by a signal, or ran over
its time). Nothing here raises for what the child does; a program that cannot
be started raises :class:`ChildNotStarted`. docs/power.md ("exec") describes
the bounds the power paths use.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

HEAD_BYTES = 64 * 1024  # kept from the start of each stream
TAIL_BYTES = 4 * 1024  # kept from its end (an exec status answers on its last line)
_READ_CHUNK = 64 * 1024
# After the kill: how long the readers may take to see the pipes close.
REAP_GRACE_S = 1.0


class ChildNotStarted(Exception):
    """The program could not be started (missing, not executable, NUL in argv): nothing ran.

    ``missing``: there is no such program (ENOENT).
    """

    def __init__(self, reason: str, *, missing: bool = False) -> None:
        super().__init__(reason)
        self.missing = missing


@dataclass(frozen=True)
class Captured:
    """What one stream carried: its first and last bytes, and how many between were dropped."""

    head: bytes
    tail: bytes
    dropped: int

    @property
    def kept(self) -> int:
        return len(self.head) + len(self.tail)

    def text(self) -> str:
        """The kept bytes as text (UTF-8, bad bytes replaced), a cut marked in the middle."""
        head = self.head.decode("utf-8", "replace")
        if not self.dropped and not self.tail:
            return head
        tail = self.tail.decode("utf-8", "replace")
        if not self.dropped:
            return head + tail
        return f"{head}\n[… {self.dropped} bytes cut …]\n{tail}"


@dataclass(frozen=True)
class ChildRun:
    """How one run ended, and what it wrote.

    ``returncode``: the exit status (negative: the signal that ended it), or
    None when it ran over ``timeout`` and was killed.
    """

    returncode: int | None
    stdout: Captured
    stderr: Captured
    elapsed_s: float
    timeout: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    @property
    def cut(self) -> bool:
        return bool(self.stdout.dropped or self.stderr.dropped)

    def ended(self) -> str:
        """In words: ``exited 3``, ``was killed by signal 9``, ``ran over its 3s timeout...``."""
        if self.returncode is None:
            return f"ran over its {self.timeout:g}s timeout and was killed with its process group"
        if self.returncode < 0:
            return f"was killed by signal {-self.returncode}"
        return f"exited {self.returncode}"


class _Capture:
    """The bounded reader of one stream."""

    def __init__(self, head_bytes: int, tail_bytes: int) -> None:
        self._head_bytes = head_bytes
        self._tail_bytes = tail_bytes
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def take(self, chunk: bytes) -> None:
        room = self._head_bytes - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk:
            return
        self.tail += chunk
        over = len(self.tail) - self._tail_bytes
        if over > 0:
            del self.tail[:over]
            self.dropped += over

    async def read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(_READ_CHUNK):
            self.take(chunk)

    def result(self) -> Captured:
        return Captured(bytes(self.head), bytes(self.tail), self.dropped)


async def run_child(
    argv: Sequence[str],
    *,
    timeout: float,
    environment: Mapping[str, str],
    head_bytes: int = HEAD_BYTES,
    tail_bytes: int = TAIL_BYTES,
) -> ChildRun:
    """Run ``argv`` once within ``timeout`` seconds (module doc); never raises for the child.

    :raises ChildNotStarted: it could not be started; nothing ran.
    """
    if not timeout > 0:
        raise ValueError(f"timeout: expected seconds > 0, got {timeout}")
    started = time.monotonic()
    process = await _start(argv, environment)
    assert process.stdout is not None and process.stderr is not None
    out, err = _Capture(head_bytes, tail_bytes), _Capture(head_bytes, tail_bytes)
    readers = {
        asyncio.ensure_future(out.read(process.stdout)),
        asyncio.ensure_future(err.read(process.stderr)),
    }
    exited = asyncio.ensure_future(process.wait())
    try:
        # asyncio.wait, not wait_for: on a timeout the readers keep what came.
        _, pending = await asyncio.wait({exited, *readers}, timeout=timeout)
        if pending:
            await kill_group(process)
            await asyncio.wait(readers, timeout=REAP_GRACE_S)
    except BaseException:  # cancelled: never leave the child (or its children) behind
        await kill_group(process)
        raise
    finally:
        for task in (exited, *readers):
            task.cancel()
        _close_pipes(process)
    return ChildRun(
        None if pending else process.returncode,
        out.result(),
        err.result(),
        time.monotonic() - started,
        timeout,
    )


async def _start(argv: Sequence[str], environment: Mapping[str, str]) -> asyncio.subprocess.Process:
    _check_argv(argv)
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(environment),
            start_new_session=True,  # its own process group: killed as a whole
        )
    except (OSError, ValueError) as exc:
        raise _not_started(exc) from None


async def kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the child's whole process group and reap the child."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    # Shielded and bounded: a second cancellation must not skip the reaping,
    # and a SIGKILLed child is reaped at once (the loop's watcher does it otherwise).
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(asyncio.shield(process.wait()), REAP_GRACE_S)


def _close_pipes(process: asyncio.subprocess.Process) -> None:
    """Close our ends of the pipes: a grandchild that left the group may still hold them."""
    for stream in (process.stdout, process.stderr):
        transport = getattr(stream, "_transport", None)
        if transport is not None:
            transport.close()


def run_child_blocking(
    argv: Sequence[str],
    *,
    timeout: float,
    environment: Mapping[str, str] | None = None,
    head_bytes: int = HEAD_BYTES,
    tail_bytes: int = TAIL_BYTES,
) -> ChildRun:
    """:func:`run_child` for a thread without an event loop (the agent's
    serving stop, doctor): the same bounds, the same kill of the whole group.
    ``environment`` None: this process's own.

    :raises ChildNotStarted: it could not be started; nothing ran.
    """
    if not timeout > 0:
        raise ValueError(f"timeout: expected seconds > 0, got {timeout}")
    _check_argv(argv)
    started = time.monotonic()
    try:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=None if environment is None else dict(environment),
            start_new_session=True,
        )
    except (OSError, ValueError) as exc:
        raise _not_started(exc) from None
    assert process.stdout is not None and process.stderr is not None
    captures = {
        process.stdout: _Capture(head_bytes, tail_bytes),
        process.stderr: _Capture(head_bytes, tail_bytes),
    }
    deadline = started + timeout
    held = _read_until(captures, deadline)
    timed_out = False
    try:
        process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        timed_out = True
    if timed_out or held:  # the whole group goes: a grandchild may hold the pipe
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(REAP_GRACE_S)
    for stream in captures:
        stream.close()
    out, err = (capture.result() for capture in captures.values())
    return ChildRun(
        None if timed_out else process.returncode,
        out,
        err,
        time.monotonic() - started,
        timeout,
    )


def _read_until(captures: dict[Any, _Capture], deadline: float) -> bool:
    """Read the pipes into their captures until both close or ``deadline``;
    True when one was still open then (something holds it)."""
    with selectors.DefaultSelector() as selector:
        for stream in captures:
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, _READ_CHUNK)
                if chunk:
                    captures[key.fileobj].take(chunk)
                else:
                    selector.unregister(key.fileobj)
        return bool(selector.get_map())


def _check_argv(argv: Sequence[str]) -> None:
    if not argv:
        raise ChildNotStarted("no program given")
    if any("\0" in arg for arg in argv):
        raise ChildNotStarted("an argument holds a NUL byte")


def _not_started(exc: OSError | ValueError) -> ChildNotStarted:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return ChildNotStarted(reason, missing=isinstance(exc, FileNotFoundError))


def completed(
    argv: Sequence[str], timeout: float, head_bytes: int
) -> subprocess.CompletedProcess[str]:
    """:func:`run_child_blocking` as ``subprocess.run`` answers, for callers that
    speak its language: ``OSError`` when it could not start, ``TimeoutExpired``
    past ``timeout`` (its group killed), else its exit and its text."""
    try:
        ran = run_child_blocking(argv, timeout=timeout, head_bytes=head_bytes, tail_bytes=0)
    except ChildNotStarted as exc:
        raise OSError(0, str(exc)) from None
    if ran.returncode is None:
        raise subprocess.TimeoutExpired(list(argv), timeout)
    return subprocess.CompletedProcess(
        list(argv), ran.returncode, ran.stdout.text(), ran.stderr.text()
    )
