"""The systemd notify protocol (sd_notify(3)), spoken directly.

systemd-python has no watchdog helper and the protocol is small and stable:
one datagram of ``KEY=VALUE`` lines to the AF_UNIX socket named by
``$NOTIFY_SOCKET`` (a leading ``@`` means the abstract namespace).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


class SystemdNotifier:
    """Sends READY/WATCHDOG/STATUS/STOPPING; a no-op outside systemd."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        raw = env.get("NOTIFY_SOCKET", "")
        self._address: str | bytes | None = None
        if raw.startswith("@"):
            self._address = b"\0" + raw[1:].encode()
        elif raw.startswith("/"):
            self._address = raw
        self.watchdog_interval = _watchdog_interval(env)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, **fields: str) -> bool:
        """Send ``KEY=VALUE`` lines; True when a datagram was sent."""
        if self._address is None:
            return False
        message = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            try:
                # Never block the caller's loop on a receiver that is not
                # reading: a full datagram queue drops this one instead.
                sock.sendto(message, socket.MSG_DONTWAIT, self._address)
            except OSError:
                return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify(ready="1", status=status)

    def watchdog(self) -> bool:
        return self.notify(watchdog="1")

    def status(self, text: str) -> bool:
        # STATUS is one line; systemctl status shows it as is.
        return self.notify(status=text.replace("\n", " "))

    def stopping(self) -> bool:
        return self.notify(stopping="1", status="stopping")


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Seconds between pets: half of $WATCHDOG_USEC (sd_watchdog_enabled(3)).

    $WATCHDOG_PID, when set, must name this process; otherwise the watchdog
    was meant for someone else.
    """
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2 / 1_000_000 if value > 0 else None
