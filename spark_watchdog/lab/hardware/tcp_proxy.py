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

The relay runs in a process of its own (``python -m spark_watchdog.lab.hardware
tcp-proxy TARGET_PORT PORT``), told what to do a line at a time on its
standard input: a healthy link must not stall while the test process that
owns it is busy. In a thread of the test's process it did: a leader's lease
renewals, relayed there, waited seconds behind the test's own threads on a
loaded 2-core machine, and the leader gave its lease up on a healthy link.
``start()`` and ``stop()`` (or ``with``) bound it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import select
import socket
import struct
import subprocess
import sys
from types import TracebackType

from spark_watchdog.lab.ports import free_port

LOOPBACK = "127.0.0.1"
_CHUNK = 65536
ANSWER_WITHIN_S = 10.0  # for the relay to start, and to carry out each command


class TcpProxy:
    """``port`` on loopback forwards to ``target_port``."""

    def __init__(self, target_port: int, *, port: int | None = None) -> None:
        self.target_port = target_port
        self.port = port or free_port()
        self._process: subprocess.Popen[str] | None = None

    # -- the faults ------------------------------------------------------------------

    def blackhole(self) -> None:
        self._tell("blackhole")

    def heal(self) -> None:
        self._tell("heal")

    def delay(self, seconds: float) -> None:
        self._tell(f"delay {seconds!r}")

    def reset(self) -> int:
        """Reset every open connection; how many there were."""
        return int(self._tell("reset"))

    # -- life ------------------------------------------------------------------------

    def start(self) -> TcpProxy:
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spark_watchdog.lab.hardware",
                "tcp-proxy",
                str(self.target_port),
                str(self.port),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._answer("starting")
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None and process.stdout is not None
        with contextlib.suppress(OSError):
            process.stdin.close()  # the relay resets its links and exits
        try:
            process.wait(ANSWER_WITHIN_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(ANSWER_WITHIN_S)
        process.stdout.close()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _tell(self, command: str) -> str:
        process = self._process
        if process is None or process.stdin is None:
            raise RuntimeError("the proxy is not running: start() it first")
        try:
            process.stdin.write(command + "\n")
            process.stdin.flush()
        except OSError as exc:
            raise RuntimeError(f"the proxy's relay is gone ({exc})") from exc
        return self._answer(command)

    def _answer(self, doing: str) -> str:
        """The relay's answer to what it was told: ``ok [VALUE]``; VALUE or ""."""
        process = self._process
        assert process is not None and process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], ANSWER_WITHIN_S)
        line = process.stdout.readline() if ready else ""
        if not line.startswith("ok"):
            raise RuntimeError(
                f"the proxy's relay did not answer {doing!r} within {ANSWER_WITHIN_S:g}s "
                f"(it said {line.strip()!r}; exit status {process.poll()})"
            )
        return line[2:].strip()


# -- the relay, in its own process ------------------------------------------------------


class _Relay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._passing = asyncio.Event()
        self._passing.set()
        self._delay_s = 0.0
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    def command(self, line: str) -> str:
        """Carry out one line of the parent's; what to answer."""
        word, *args = line.split() or [""]
        if word == "blackhole":
            self._passing.clear()
        elif word == "heal":
            self._delay_s = 0.0
            self._passing.set()
        elif word == "delay" and len(args) == 1 and _seconds(args[0]) is not None:
            self._delay_s = _seconds(args[0]) or 0.0
            self._passing.set()
        elif word == "reset":
            return f"ok {self.reset()}"
        else:
            return f"unknown command {line.strip()!r}"
        return "ok"

    def reset(self) -> int:
        links = list(self._links)
        for client, upstream in links:
            _abort(client)
            _abort(upstream)
        return len(links)

    async def accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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


def _seconds(text: str) -> float | None:
    with contextlib.suppress(ValueError):
        seconds = float(text)
        if seconds >= 0:
            return seconds
    return None


def _abort(writer: asyncio.StreamWriter) -> None:
    """Close with an RST, not a FIN (SO_LINGER 0), as a reset link does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _relay(target_port: int, port: int) -> None:
    loop = asyncio.get_running_loop()
    relay = _Relay(target_port)
    server = await asyncio.start_server(relay.accept, LOOPBACK, port)
    orders = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(orders), sys.stdin)
    print("ok", flush=True)
    while line := (await orders.readline()).decode():
        print(relay.command(line), flush=True)
    server.close()  # the parent closed our input: it is done with the link
    relay.reset()
    await asyncio.sleep(0)  # the aborts' callbacks run before the loop closes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tcp-proxy",
        description="relay PORT on loopback to TARGET_PORT; read blackhole, heal, "
        "delay SECONDS and reset a line at a time on standard input",
    )
    parser.add_argument("target_port", type=int)
    parser.add_argument("port", type=int)
    args = parser.parse_args(argv)
    asyncio.run(_relay(args.target_port, args.port))
    return 0
