"""How far a controller may act: alone, always; one of a pair, while its lease lets it.

A ``Fence`` is one part of ``ControllerIO`` (controller/io.py). A lone
controller's fence (``LONE``) refuses nothing. A pair's (controller/pair/pair.py)
asks the lease (history/leadership.py) before a command leaves, writes a
record that lets nothing out without the send margin, says who leads for
``/v1/status``, and, once the lease is lost, says so at once: from then on the
controller sends no alert about nodes and starts nothing
(docs/design.md, "Controller pair").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar

from spark_watchdog.controller.record.ledger import NotLeading

P = ParamSpec("P")
T = TypeVar("T")


class RecordingOnly(Protocol):
    """A pair's ``Lease.recording_only``: a store write, fenced without the send margin."""

    def __call__(self, fn: Callable[P, T], /) -> Callable[P, T]: ...


def _never() -> bool:
    return False


@dataclass(frozen=True)
class Fence:
    # Right before a command leaves: why it may not (None: it may). None: a lone
    # controller, whose commands only the guards stop.
    send_refusal: Callable[[], str | None] | None = None
    # How a step that says a command did *not* leave is written (None: as any other).
    recording_only: RecordingOnly | None = None
    # Who leads, for /v1/status (None: no pair).
    leadership: Callable[[], dict[str, Any]] | None = None
    # True once this controller led and lost its lease: it is being stopped.
    deposed: Callable[[], bool] = _never

    @property
    def in_pair(self) -> bool:
        """One of a controller pair: whatever leaves is fenced by the lease."""
        return self.send_refusal is not None

    def refusal(self) -> str | None:
        """Why nothing may leave now (None: it may, or this is a lone controller)."""
        return None if self.send_refusal is None else self.send_refusal()

    def check_leading(self) -> None:
        """Right before anything leaves.

        :raises NotLeading: a controller of a pair may not send now; the action
            does not happen and its incident stays open.
        """
        refused = self.refusal()
        if refused is not None:
            raise NotLeading(refused)


LONE = Fence()
