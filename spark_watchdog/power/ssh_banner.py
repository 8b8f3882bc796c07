"""The SSH banner check: does the host's userland still greet a new connection?

A frozen GB10 host often still completes the TCP handshake (the kernel's
listen backlog does that) while sshd, in userland, never sends its version
line (DESIGN.md §3). So "connected, but no banner" is its own outcome here,
distinct from "could not connect" and from "connected and the peer hung up".

The check connects, reads until the line starting ``SSH-`` (RFC 4253 §4.2: a
server MAY send other lines first; they are text and never start with
``SSH-``), and stops at the first of: the version line, ``timeout`` seconds
after the start, the peer closing, or ``MAX_READ_BYTES``. It never waits past
its timeout and always closes its socket. It runs for every node on every poll,
so it is one socket and a few reads, with no thread for IP literals.

After a valid banner it sends its own version line before closing: OpenSSH logs
a client that closes without one as an error (``kex_exchange_identification:
Connection closed by remote host``), one that identified itself as a one-line
info (``Connection closed by ... [preauth]``). Poll no more often than about
once a second per host: OpenSSH ≥ 9.8 penalises sources that disconnect without
authenticating (``PerSourcePenalties`` noauth, 1 s each, enforced from 15 s
accrued; sshd_config(5)) and would then refuse the controller's connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import re
import socket
import time
from dataclasses import dataclass
from typing import Any, Literal, get_args

BannerOutcome = Literal[
    "banner",  # the SSH version line arrived in time
    "no_banner",  # connected, then silence until the timeout (frozen or starved userland)
    "closed",  # connected, then the peer closed (or reset) without a byte
    "refused",  # the host's kernel answered, nothing listens on the port
    "connect_timeout",  # no TCP handshake within the timeout
    "unreachable",  # no route to the host itself (EHOSTUNREACH: ARP/ND got no answer)
    "unresolvable",  # the name does not resolve: the controller cannot look
    "no_network",  # the controller's own network is down (ENETDOWN, ENETUNREACH, ...)
    "garbage",  # bytes that are not an SSH version line
]
BANNER_OUTCOMES: tuple[BannerOutcome, ...] = get_args(BannerOutcome)

# Enough for any real pre-banner text; a peer sending more is not an SSH server.
MAX_READ_BYTES = 8 * 1024
# RFC 4253 §4.2: the version line is at most 255 characters including CR LF.
MAX_VERSION_LINE = 255
# "SSH-protoversion-softwareversion SP comments". The software part is looser
# than the RFC (which forbids "-" there) because real servers send e.g.
# "SSH-1.99-Cisco-1.25"; this check is about liveness, not conformance.
_VERSION_LINE = re.compile(r"SSH-[0-9]+\.[0-9]+-[\x21-\x7e]+( [\x20-\x7e]*)?")
# What we tell the server before hanging up (see the module docstring).
CLIENT_VERSION_LINE = b"SSH-2.0-spark_watchdog_banner_check\r\n"
_RECV_BYTES = 1024
_SHOWN_BYTES = 60
# The host did not answer on its own segment: silence, as from a dead host.
_HOST_ERRNOS = frozenset({errno.EHOSTUNREACH, errno.EHOSTDOWN})
# The controller's side is broken: it cannot look at the host at all.
_OWN_NETWORK_ERRNOS = frozenset(
    {errno.ENETUNREACH, errno.ENETDOWN, errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT}
)


@dataclass(frozen=True)
class BannerResult:
    """One banner check. Times are seconds from the start of the check."""

    outcome: BannerOutcome
    banner: str | None = None  # the version line, without CR LF
    connect_s: float | None = None  # when TCP connected; None if it never did
    total_s: float = 0.0
    error: str | None = None  # what went wrong, for anything but "banner"

    @property
    def ok(self) -> bool:
        return self.outcome == "banner"

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "ok": self.ok,
            "banner": self.banner,
            "connect_s": None if self.connect_s is None else round(self.connect_s, 4),
            "total_s": round(self.total_s, 4),
            "error": self.error,
        }


async def check_ssh_banner(host: str, port: int = 22, timeout: float = 2.0) -> BannerResult:
    """Connect to ``host:port`` and read the SSH version line within ``timeout`` seconds."""
    if not 1 <= port <= 65535:
        raise ValueError(f"port: expected 1..65535, got {port}")
    if not timeout > 0:
        raise ValueError(f"timeout: expected seconds > 0, got {timeout}")
    check = _BannerCheck(host, port, timeout)
    return await check.run()


class _BannerCheck:
    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.connect_s: float | None = None

    def _left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def _result(
        self, outcome: BannerOutcome, *, banner: str | None = None, error: str | None = None
    ) -> BannerResult:
        return BannerResult(
            outcome=outcome,
            banner=banner,
            connect_s=self.connect_s,
            total_s=time.monotonic() - self.started,
            error=error,
        )

    async def run(self) -> BannerResult:
        addresses = await self._resolve()
        if isinstance(addresses, BannerResult):
            return addresses
        connected = await self._connect(addresses)
        if isinstance(connected, BannerResult):
            return connected
        try:
            return await self._read_banner(connected)
        finally:
            connected.close()

    async def _resolve(self) -> list[tuple[int, Any]] | BannerResult:
        if "%" not in self.host:  # a scoped IPv6 literal needs getaddrinfo's scope id
            try:
                ip = ipaddress.ip_address(self.host)
            except ValueError:
                pass
            else:
                # An IP literal: no resolver thread on the every-poll path.
                if ip.version == 4:
                    return [(socket.AF_INET, (self.host, self.port))]
                return [(socket.AF_INET6, (self.host, self.port, 0, 0))]
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM),
                self._left(),
            )
        except asyncio.TimeoutError:
            return self._result(
                "unresolvable",
                error=f"resolving {self.host} did not finish within {self.timeout:g}s",
            )
        except OSError as exc:  # socket.gaierror
            return self._result("unresolvable", error=f"cannot resolve {self.host}: {exc}")
        if not infos:
            return self._result("unresolvable", error=f"{self.host} resolves to no address")
        return [(family, sockaddr) for family, _, _, _, sockaddr in infos]

    async def _connect(self, addresses: list[tuple[int, Any]]) -> socket.socket | BannerResult:
        """Try each address in turn (as OpenSSH does) until one connects or time is up."""
        loop = asyncio.get_running_loop()
        failures: list[OSError] = []
        for family, sockaddr in addresses:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                sock.setblocking(False)
                await asyncio.wait_for(loop.sock_connect(sock, sockaddr), self._left())
            except asyncio.TimeoutError:
                sock.close()
                return self._result(
                    "connect_timeout",
                    error=f"no TCP connection to {self.where} within {self.timeout:g}s",
                )
            except ConnectionResetError:
                # The handshake completed and the peer reset before we looked
                # (an accept-and-reset on loopback is that fast): it hung up.
                sock.close()
                self.connect_s = time.monotonic() - self.started
                return self._result(
                    "closed", error=f"{self.where}: the connection was reset before any banner"
                )
            except OSError as exc:
                sock.close()
                failures.append(exc)
                continue
            except BaseException:
                sock.close()
                raise
            self.connect_s = time.monotonic() - self.started
            return sock
        return self._connect_failure(failures)

    def _connect_failure(self, failures: list[OSError]) -> BannerResult:
        # A refusal means some kernel answered: the most telling of several failures.
        for exc in failures:
            if isinstance(exc, ConnectionRefusedError):
                return self._result(
                    "refused", error=f"connection to {self.where} refused: nothing listens there"
                )
        for exc in failures:
            if isinstance(exc, TimeoutError) or exc.errno == errno.ETIMEDOUT:
                return self._result(
                    "connect_timeout", error=f"TCP connection to {self.where} timed out ({exc})"
                )
        exc = failures[-1]
        why = exc.strerror or str(exc)
        if exc.errno in _OWN_NETWORK_ERRNOS:
            return self._result("no_network", error=f"cannot connect to {self.where}: {why}")
        if exc.errno not in _HOST_ERRNOS:
            why = f"{why} (errno {exc.errno})"
        return self._result("unreachable", error=f"cannot connect to {self.where}: {why}")

    async def _read_banner(self, sock: socket.socket) -> BannerResult:
        loop = asyncio.get_running_loop()
        received = bytearray()
        while True:
            try:
                chunk = await asyncio.wait_for(
                    loop.sock_recv(sock, min(_RECV_BYTES, MAX_READ_BYTES - len(received))),
                    self._left(),
                )
            except asyncio.TimeoutError:
                return self._timed_out(bytes(received))
            except OSError as exc:  # reset by peer, mostly
                return self._ended(bytes(received), f"the connection failed: {exc}")
            if not chunk:
                return self._ended(bytes(received), "the peer closed the connection")
            received += chunk
            verdict = scan_banner(bytes(received))
            if verdict is not None:
                outcome, text = verdict
                if outcome == "banner":
                    _say_goodbye(sock)
                    return self._result("banner", banner=text)
                return self._result("garbage", error=f"{self.where}: {text}")
            if len(received) >= MAX_READ_BYTES:
                return self._result(
                    "garbage",
                    error=f"{self.where} sent {len(received)} bytes without an SSH version "
                    f"line: {_show(bytes(received))}",
                )

    def _timed_out(self, received: bytes) -> BannerResult:
        if not received:
            return self._result(
                "no_banner",
                error=f"connected to {self.where} but no SSH banner within {self.timeout:g}s "
                "(the kernel answers, userland does not)",
            )
        return self._result(
            "garbage",
            error=f"{self.where} sent {len(received)} bytes but no SSH version line within "
            f"{self.timeout:g}s: {_show(received)}",
        )

    def _ended(self, received: bytes, how: str) -> BannerResult:
        if not received:
            return self._result("closed", error=f"{self.where}: {how} before any banner")
        return self._result(
            "garbage",
            error=f"{self.where}: {how} after {len(received)} bytes without an SSH version "
            f"line: {_show(received)}",
        )


def scan_banner(received: bytes) -> tuple[Literal["banner", "garbage"], str] | None:
    """Judge what a server sent so far: the version line, garbage, or None (read on).

    Lines before the version line are allowed text (RFC 4253 §4.2); the version
    line ends with CR LF, or a bare LF as OpenSSH also accepts.
    """
    if b"\x00" in received:
        return "garbage", f"a NUL byte, not SSH text: {_show(received)}"
    *complete, partial = received.split(b"\n")
    for raw in complete:
        line = raw[:-1] if raw.endswith(b"\r") else raw
        if line.startswith(b"SSH-"):
            if len(raw) + 1 > MAX_VERSION_LINE:
                return "garbage", (
                    f"a version line of {len(raw) + 1} bytes, over RFC 4253's "
                    f"{MAX_VERSION_LINE}: {_show(line)}"
                )
            text = line.decode("ascii", errors="replace")
            if not _VERSION_LINE.fullmatch(text):
                return "garbage", f"not an SSH version line: {_show(line)}"
            return "banner", text.rstrip()
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return "garbage", f"binary data, not SSH text: {_show(received)}"
    if partial.startswith(b"SSH-") and len(partial) >= MAX_VERSION_LINE:
        return "garbage", f"an unterminated version line: {_show(partial)}"
    return None


def _say_goodbye(sock: socket.socket) -> None:
    """Identify ourselves before closing, best effort, never blocking (see module doc)."""
    with contextlib.suppress(OSError):
        sock.send(CLIENT_VERSION_LINE)


def _show(data: bytes) -> str:
    shown = repr(data[:_SHOWN_BYTES])
    return shown + ("…" if len(data) > _SHOWN_BYTES else "")
