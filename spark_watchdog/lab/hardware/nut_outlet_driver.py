"""A switched-outlet device behind a real ``upsd``: a NUT driver of our own, for tests.

NUT's ``dummy-ups`` (2.8.0, Debian 12) offers one instant command in its
dummy mode, ``load.off``, and changes nothing when it runs it: no
``outlet.N.load.off``, no ``load.on``. So a real ``upsd`` cannot switch an
outlet behind it. This stand-in is the hardware and its driver at once: it
speaks NUT's driver/server socket protocol (networkupstools.org, developer
guide, "Driver/server socket protocol") on the Unix socket upsd looks for
(``<statepath>/<driver>-<ups>``):

- upsd sends ``DUMPALL``; the driver answers its variables (``SETINFO
  outlet.1.status "on"``), its commands (``ADDCMD outlet.1.load.off``),
  ``DATAOK`` and ``DUMPDONE``;
- ``PING`` is answered ``PONG``;
- ``INSTCMD outlet.N.load.off`` (``load.on``) switches the outlet, after
  ``switch_delay`` as a relay would, and the change goes to upsd as a
  ``SETINFO``; with ``ignores_commands`` the outlet never follows.

The test drives it through upsd only, like the controller does.
"""

from __future__ import annotations

import contextlib
import shlex
import socket
import threading
from pathlib import Path
from types import TracebackType


class NutOutletDriver:
    """``outlets`` switched outlets, served to upsd on the Unix socket ``path``."""

    def __init__(
        self,
        path: Path,
        *,
        outlets: int = 2,
        initially_on: bool = True,
        switch_delay: float = 0.0,
    ) -> None:
        self.path = path
        self.switch_delay = switch_delay
        self.ignores_commands = False
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # one line at a time on a socket
        self._outlets = {n: "on" if initially_on else "off" for n in range(1, outlets + 1)}
        self._commands: list[str] = []
        self._clients: list[socket.socket] = []
        self._timers: list[threading.Timer] = []
        self._stopping = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._thread: threading.Thread | None = None

    def __enter__(self) -> NutOutletDriver:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._listener.bind(str(self.path))
        self._listener.listen(4)
        self._listener.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept, name="nut-outlet-driver", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stopping.set()
        with self._lock:
            for timer in self._timers:
                timer.cancel()
            for client in self._clients:
                with contextlib.suppress(OSError):
                    client.shutdown(socket.SHUT_RDWR)
                client.close()
        if self._thread is not None:
            self._thread.join()
        self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    # --- the test's hand ------------------------------------------------------

    def state(self, outlet: int = 1) -> str:
        with self._lock:
            return self._outlets[outlet]

    def set_state(self, outlet: int, state: str) -> None:
        """The outlet switched by itself (a button on the PDU): upsd hears of it."""
        self._apply(outlet, state)

    @property
    def commands(self) -> list[str]:
        with self._lock:
            return list(self._commands)

    # --- the socket protocol ----------------------------------------------------

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._clients.append(client)
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError), client.makefile("rb") as lines:
            for raw in lines:
                words = shlex.split(raw.decode("utf-8", "replace"))
                if not words:
                    continue
                verb = words[0].upper()
                if verb == "DUMPALL":
                    self._send(client, self._dump())
                elif verb == "PING":
                    self._send(client, "PONG\n")
                elif verb == "INSTCMD" and len(words) >= 2:
                    self._instcmd(words[1])
        with self._lock:
            if client in self._clients:
                self._clients.remove(client)

    def _dump(self) -> str:
        with self._lock:
            lines = [
                'SETINFO device.type "pdu"\n',
                'SETINFO device.mfr "spark-watchdog stand-in"\n',
                'SETINFO ups.status "OL"\n',
            ]
            for outlet, state in self._outlets.items():
                lines.append(f'SETINFO outlet.{outlet}.status "{state}"\n')
                lines.append(f'SETINFO outlet.{outlet}.switchable "yes"\n')
                lines.append(f"ADDCMD outlet.{outlet}.load.off\n")
                lines.append(f"ADDCMD outlet.{outlet}.load.on\n")
        return "".join(lines) + "DATAOK\nDUMPDONE\n"

    def _instcmd(self, name: str) -> None:
        parts = name.split(".")
        if len(parts) != 4 or parts[0] != "outlet" or parts[2] != "load":
            return
        outlet, state = int(parts[1]), parts[3]
        with self._lock:
            self._commands.append(name)
            if self.ignores_commands or outlet not in self._outlets or state not in ("on", "off"):
                return
            if self.switch_delay > 0:
                timer = threading.Timer(self.switch_delay, self._apply, (outlet, state))
                timer.daemon = True
                self._timers.append(timer)
                timer.start()
                return
        self._apply(outlet, state)

    def _apply(self, outlet: int, state: str) -> None:
        with self._lock:
            self._outlets[outlet] = state
            clients = list(self._clients)
        for client in clients:
            self._send(client, f'SETINFO outlet.{outlet}.status "{state}"\n')

    def _send(self, client: socket.socket, text: str) -> None:
        with self._send_lock, contextlib.suppress(OSError):
            client.sendall(text.encode("utf-8"))
