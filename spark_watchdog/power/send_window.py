"""The last check before a command's bytes leave (docs/design.md, "Controller pair").

A controller of a pair may send a command only within its send deadline of
the step that precedes it. The send gate checks that before the backend is
called, but a backend still awaits between the gate and its socket write
(an address lookup, a socket being opened, a thread): a controller paused
there (SIGSTOP, a stalled VM) would wake past its deadline, perhaps after
another controller took over, and send all the same.

So the caller of a backend's ``command`` names the check for the duration of
the call (:func:`checking`), and the backend asks it at the last moment it
can: an SNMP SET in its command socket, right before each datagram
(power/snmp_command.py); a plug in its worker thread right before the
request; IPMI right before ipmitool starts. A lone controller names no
check (None): its commands leave as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from spark_watchdog.errors import SendRefused

# Why a command may not leave now (None: it may). Synchronous and cheap: it
# runs between two lines of the socket code.
SendWindow = Callable[[], "str | None"]

_WINDOW: ContextVar[SendWindow | None] = ContextVar("send_window", default=None)


@contextmanager
def checking(window: SendWindow | None) -> Iterator[None]:
    """Within this block, a backend's command asks ``window`` right before it leaves."""
    token = _WINDOW.set(window)
    try:
        yield
    finally:
        _WINDOW.reset(token)


def current() -> SendWindow | None:
    """The check the running command must pass (None: there is none)."""
    return _WINDOW.get()


def enforce(device: str) -> None:
    """Right before a command's bytes leave.

    :raises SendRefused: the running command may not leave now; nothing was sent.
    """
    window = _WINDOW.get()
    why = None if window is None else window()
    if why is not None:
        raise SendRefused(device, why)
