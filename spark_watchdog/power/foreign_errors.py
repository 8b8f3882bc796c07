"""Exceptions that are not the product's own, raised inside a power path (a
library's internal error, an encoding, a number no socket takes), as the
PowerError that says what they mean for the ladder (power/base.py): a read
that failed, or a command that certainly did not leave, fails the path (the
next one may go); a command that may have left is ``Ambiguous`` (read back,
never sent again)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from spark_watchdog.errors import Ambiguous, PowerError, Unreachable
from spark_watchdog.redact import redact_text

T = TypeVar("T")

# Raised while a request is prepared (an encoding, a number no socket takes),
# before any byte of it leaves: such a command certainly did not reach the device.
# Not a decoding error: that is about bytes that came back (a redirect's
# Location that is not UTF-8), so the command had left.
_RAISED_BEFORE_SENDING = (UnicodeEncodeError, OverflowError)


def unexpected(device: str, exc: Exception, what: str, kind: type[PowerError]) -> PowerError:
    """An exception that is not one of the product's own, as a ``kind`` naming it."""
    detail = " ".join(redact_text(str(exc)).split())[:300]
    return kind(device, f"{what}: {type(exc).__name__}: {detail}")


def command_error(device: str, exc: Exception) -> PowerError:
    """An unexpected exception from a command: ``Unreachable`` when it was raised before
    anything could leave (:data:`_RAISED_BEFORE_SENDING`), else ``Ambiguous`` (it may
    have left: read back, never sent again)."""
    if isinstance(exc, _RAISED_BEFORE_SENDING):
        return unexpected(
            device, exc, "the command could not be prepared; nothing was sent", Unreachable
        )
    return unexpected(device, exc, "the command failed unexpectedly; it may have left", Ambiguous)


def read_error(device: str, exc: Exception) -> PowerError:
    """An unexpected exception from a state read: nothing was sent, the path failed."""
    return unexpected(device, exc, "a state read failed", Unreachable)


async def guarded(
    device: str, call: Awaitable[T], judge: Callable[[str, Exception], PowerError]
) -> T:
    """``await call``; an exception not of ours raised as ``judge`` names it."""
    try:
        return await call
    except PowerError:
        raise
    except Exception as exc:
        raise judge(device, exc) from exc
