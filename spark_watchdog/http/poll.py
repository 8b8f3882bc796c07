"""What the HTTP server's loop waits on: Linux's epoll, level-triggered, each
descriptor registered with what it stands for (the listener, the wake-up
socket, a connection).

``selectors`` does the same through a key object per descriptor and a dozen
Python steps per event; an agent's server wakes for every peer's pulse, every
second, for as long as it runs (docs/design.md, "Peers"), so the loop reads
epoll's answer directly. Events are ``READ`` and ``WRITE``; an error or a
hang-up on a descriptor counts as both, as in ``selectors``, so the reader or
the writer finds out what happened.
"""

from __future__ import annotations

import select
import socket
from typing import Any

READ = 1
WRITE = 2

_EPOLL_OF = {
    READ: select.EPOLLIN,
    WRITE: select.EPOLLOUT,
    READ | WRITE: select.EPOLLIN | select.EPOLLOUT,
}


class Poller:
    """One epoll set; used from the server's thread only."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._data: dict[int, Any] = {}

    def register(self, sock: socket.socket, events: int, data: Any) -> None:
        fd = sock.fileno()
        self._epoll.register(fd, _EPOLL_OF[events])
        self._data[fd] = data

    def modify(self, sock: socket.socket, events: int, data: Any) -> None:
        fd = sock.fileno()
        self._epoll.modify(fd, _EPOLL_OF[events])
        self._data[fd] = data

    def change(self, sock: socket.socket, was: int, events: int, data: Any) -> None:
        """``sock`` watched for ``events`` where it was for ``was`` (0: not at all)."""
        if not was:
            self.register(sock, events, data)
        elif not events:
            self.unregister(sock)
        else:
            self.modify(sock, events, data)

    def unregister(self, sock: socket.socket) -> None:
        fd = sock.fileno()
        del self._data[fd]
        self._epoll.unregister(fd)

    def poll(self, timeout: float) -> list[tuple[Any, int]]:
        """What is ready within ``timeout`` seconds: (data, READ | WRITE) each."""
        ready = []
        for fd, mask in self._epoll.poll(timeout):
            data = self._data.get(fd)
            if data is None:
                continue  # not registered through this poller: never the case
            events = 0
            if mask & ~select.EPOLLOUT:
                events |= READ
            if mask & ~select.EPOLLIN:
                events |= WRITE
            ready.append((data, events))
        return ready

    def close(self) -> None:
        self._epoll.close()
        self._data.clear()
