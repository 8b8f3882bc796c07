"""The SNMP command socket: each datagram of a SET passes the send window
right before it leaves (power/send_window.py; docs/design.md, "Controller pair").

A SET awaits between the send gate and its datagram: an address lookup in a
thread, the engine's socket opening, an SNMPv3 discovery round trip. A
controller paused anywhere in there would wake past its send deadline and,
without this check, send all the same. So every SET of a PDU goes through an
engine of its own whose UDP transport asks the window in ``sendto`` itself:
nothing awaits between that answer and the datagram. Reads use another
engine and are never checked: a read cuts no power.

One SET at a time per command engine (``CommandSocket.lock``), and nothing
leaves the socket outside a SET's ``arm`` ... ``disarm``: a request pysnmp
still holds after the SET gave up on it (and would resend on a late SNMPv3
report) is dropped, and the engine is replaced after such a SET (power/snmp.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from pysnmp.carrier.asyncio.dgram import udp

from spark_watchdog.power.send_window import SendWindow


class _CheckedDatagrams(asyncio.DatagramTransport):
    """The event loop's datagram transport, with the window asked before each ``sendto``."""

    def __init__(self, inner: Any, owner: CommandSocket) -> None:
        # ``inner``: the loop's own transport (asyncio's selector datagram
        # transport is not an ``asyncio.DatagramTransport`` subclass).
        super().__init__()
        self._inner = inner
        self._owner = owner

    def sendto(self, data: Any, addr: Any = None) -> None:
        if self._owner.may_leave():
            self._inner.sendto(data, addr)

    def close(self) -> None:
        self._inner.close()

    def abort(self) -> None:
        self._inner.abort()

    def is_closing(self) -> bool:
        return bool(self._inner.is_closing())

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._inner.get_extra_info(name, default)


class CommandSocket(udp.UdpAsyncioTransport):  # type: ignore[misc]
    """pysnmp's UDP transport for an engine that sends SETs only."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = asyncio.Lock()
        self._armed = False
        self._window: SendWindow | None = None
        self._withheld: asyncio.Future[str] | None = None
        self.left = 0  # datagrams let out since ``arm``
        self.primed = False  # its first request made (power/snmp.py)

    def arm(self, window: SendWindow | None) -> asyncio.Future[str]:
        """Check every datagram against ``window`` until ``disarm``; the future
        gets the reason of the first one held back."""
        self._armed = True
        self._window = window
        self._withheld = asyncio.get_running_loop().create_future()
        self.left = 0
        return self._withheld

    def disarm(self) -> None:
        self._armed = False
        self._window = None
        if self._withheld is not None and not self._withheld.done():
            self._withheld.cancel()
        self._withheld = None

    def may_leave(self) -> bool:
        """Right before a datagram leaves: the window's answer (held back: False)."""
        if not self._armed:
            return False  # no SET in progress: a stale resend, never let out
        window = self._window
        why = None if window is None else window()
        if why is None:
            self.left += 1
            return True
        if self._withheld is not None and not self._withheld.done():
            self._withheld.set_result(why)
        return False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Also what pysnmp queued before the socket opened leaves through the check.
        super().connection_made(_CheckedDatagrams(transport, self))
