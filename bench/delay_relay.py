"""A TCP relay that delays every chunk it forwards: 200 ms ± 100 ms by
default, in each direction, order kept. It stands in for ``tc netem delay``
on kernels without the netem qdisc; packet loss is done in the kernel
(iptables ``statistic`` in the node's namespace), not here."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time


class DelayRelay:
    """Listens on 127.0.0.1:<port>; each connection is relayed to ``target``."""

    def __init__(self, target: tuple[str, int], delay: float = 0.2, jitter: float = 0.1) -> None:
        self.target = target
        self.delay = delay
        self.jitter = jitter
        self.port = 0
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._run, name="delay-relay", daemon=True)

    def start(self) -> DelayRelay:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("delay relay did not start")
        return self

    def stop(self) -> None:
        async def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._relay, "127.0.0.1", 0)
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._ready.set()
        self._loop.run_forever()

    async def _relay(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            upstream_r, upstream_w = await asyncio.wait_for(
                asyncio.open_connection(*self.target), timeout=10
            )
        except (OSError, asyncio.TimeoutError):
            client_w.close()
            return
        try:
            await asyncio.gather(self._pump(client_r, upstream_w), self._pump(upstream_r, client_w))
        except asyncio.CancelledError:
            # stop() cancels open connections; asyncio's server callback would
            # otherwise print each one's CancelledError with a traceback.
            for writer in (client_w, upstream_w):
                writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                release, data = await queue.get()
                if not data:
                    break
                await asyncio.sleep(max(0.0, release - time.monotonic()))
                writer.write(data)
                with contextlib.suppress(ConnectionError):
                    await writer.drain()
            with contextlib.suppress(OSError):
                writer.close()

        sender = asyncio.get_running_loop().create_task(deliver())
        last = 0.0
        try:
            while data := await reader.read(65536):
                delay = self.delay + random.uniform(-self.jitter, self.jitter)
                last = max(last, time.monotonic() + delay)  # never reorder
                queue.put_nowait((last, data))
        except (ConnectionError, OSError):
            pass
        finally:
            queue.put_nowait((last, b""))
            with contextlib.suppress(Exception):
                await sender
