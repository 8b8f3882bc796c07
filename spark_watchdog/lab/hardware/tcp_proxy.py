"""A TCP proxy on loopback whose link can fail the ways a network does.

One in front of the PostgreSQL server per controller of a pair, so a test
can cut one controller off its history and not the other:

- ``blackhole()``: nothing passes either way and nothing is refused; the
  bytes wait, like packets dropped and retransmitted, and flow again after
  ``heal()`` (new connections are accepted and wait too);
- ``reset()``: every open connection is reset (RST both ways) at once; new
  ones pass;
- ``delay(seconds)``: every chunk arrives that much later, in order;
- ``heal()``: back to passing everything at once.

It runs its own event loop in a thread; ``start()`` and ``stop()`` (or
``with``) bound it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from types import TracebackType

from spark_watchdog.lab.ports import free_port

LOOPBACK = "127.0.0.1"
_CHUNK = 65536


class TcpProxy:
    """``port`` on loopback forwards to ``target_port``."""

    def __init__(self, target_port: int, *, port: int | None = None) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._passing = asyncio.Event()
        self._delay_s = 0.0
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0  # accepted so far

    # -- the faults (any thread) -----------------------------------------------------

    def blackhole(self) -> None:
        self._call(self._passing.clear)

    def heal(self) -> None:
        def _heal() -> None:
            self._delay_s = 0.0
            self._passing.set()

        self._call(_heal)

    def delay(self, seconds: float) -> None:
        def _delay() -> None:
            self._delay_s = seconds
            self._passing.set()

        self._call(_delay)

    def reset(self) -> int:
        """Reset every open connection; how many there were."""
        return asyncio.run_coroutine_threadsafe(self._reset(), self._loop).result(10)

    # -- life ------------------------------------------------------------------------

    def start(self) -> TcpProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- inside the loop ----------------------------------------------------------------

    def _call(self, fn: object) -> None:
        assert callable(fn)
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self._loop.call_soon_threadsafe(run)
        if not done.wait(10):
            raise RuntimeError("the proxy's loop did not answer")

    async def _listen(self) -> None:
        self._passing.set()
        self._server = await asyncio.start_server(self._accept, LOOPBACK, self.port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        try:
            up_reader, up_writer = await asyncio.open_connection(LOOPBACK, self.target_port)
        except OSError:
            _abort(writer)
            return
        link = (writer, up_writer)
        self._links.add(link)
        try:
            await asyncio.gather(
                self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True
            )
        finally:
            self._links.discard(link)
            for end in link:
                end.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await self._passing.wait()
            chunk = await reader.read(_CHUNK)
            if not chunk:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            if self._delay_s > 0:
                await asyncio.sleep(self._delay_s)
            await self._passing.wait()  # a blackhole holds what was read, too
            writer.write(chunk)
            await writer.drain()

    async def _reset(self) -> int:
        links = list(self._links)
        for client, upstream in links:
            _abort(client)
            _abort(upstream)
        return len(links)

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._reset()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST, not a FIN (SO_LINGER 0), as a reset link does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
