"""What the power stand-ins of Home Assistant and Kasa share: their server
on a thread of its own while the stand-in is entered, and at the end the
switches still to come cancelled and the requests held open let go."""

from __future__ import annotations

import socketserver
import threading
from types import TracebackType
from typing import TypeVar

S = TypeVar("S", bound="Served")


class Served:
    """Serves ``_server`` between ``__enter__`` and ``__exit__``.

    The stand-in sets ``_server``, ``_lock``, ``_timers`` (delayed switches,
    appended under ``_lock``) and ``_stopping`` (set at exit: a request made
    to hang waits on it) in its ``__init__``, and names its thread."""

    _server: socketserver.TCPServer
    _lock: threading.Lock
    _timers: list[threading.Timer]
    _stopping: threading.Event
    _thread: threading.Thread | None = None

    def thread_name(self) -> str:
        return type(self).__name__

    def __enter__(self: S) -> S:
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=self.thread_name(),
            daemon=True,
        )
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
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join()
        self._server.server_close()
