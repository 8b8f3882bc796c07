"""The vLLM probe's edges: scraping the head's HTTP API, the canary request, and
the local rank-process check. The judgement lives in :mod:`.vllm_progress`, the
``/metrics`` reading in :mod:`.vllm_metrics`.

Every request has a hard deadline. A socket timeout bounds each ``recv`` only,
so a server that drips a byte a second (a host thrashing on its way to a
freeze) could hold a plain client for minutes; here a timer shuts the socket
down when the deadline passes, whatever phase the exchange is in. The stdlib
``http.client`` is used rather than ``requests`` because it hands over the
socket before the response is read, which is what the timer needs. Name
resolution is the one step no timer can cut (``getaddrinfo`` blocks): give the
head as an IP address or a name in /etc/hosts.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import urljoin, urlsplit

import psutil

from spark_watchdog import __version__
from spark_watchdog.errors import MetricsFormatError, ProbeError
from spark_watchdog.probes.vllm_metrics import EngineSample, models_seen, parse_metrics
from spark_watchdog.probes.vllm_progress import ProgressTracker
from spark_watchdog.probes.vllm_sample import CanaryResult, VllmSample
from spark_watchdog.probes.vllm_status import EngineStatus, VllmState, VllmStatus

__all__ = [
    "Canary",
    "CanaryResult",
    "EngineSample",
    "EngineStatus",
    "ProgressTracker",
    "VllmSample",
    "VllmScraper",
    "VllmState",
    "VllmStatus",
    "check_base_url",
    "parse_metrics",
    "rank_process_alive",
]

_CHUNK = 64 * 1024
_USER_AGENT = f"spark-watchdog/{__version__}"


class VllmScraper:
    """Blocking scraper of one vLLM head. ``scrape()`` never raises and never
    takes (much) longer than ``timeout`` seconds for the whole scrape."""

    def __init__(self, url: str, timeout: float, max_body_bytes: int) -> None:
        check_base_url(url)
        if timeout <= 0:
            raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes: expected ≥ 1, got {max_body_bytes!r}")
        self.url = url
        self.timeout = timeout
        self.max_body_bytes = max_body_bytes
        self._health_url = _endpoint(url, "/health")
        self._metrics_url = _endpoint(url, "/metrics")

    def scrape(self) -> VllmSample:
        started = time.monotonic()
        wall = time.time()
        deadline = started + self.timeout

        def sample(
            health: int | None,
            engines: Mapping[str, EngineSample] | None = None,
            error: str | None = None,
            refused: bool = False,
        ) -> VllmSample:
            engines = engines or {}
            return VllmSample(
                url=self.url,
                observed_at=started,
                wall_time=wall,
                health_status=health,
                engines=engines,
                reachable=error is None,
                error=error,
                models=models_seen(engines.values()),
                elapsed=time.monotonic() - started,
                refused=refused,
            )

        try:
            health = _request("GET", self._health_url, deadline, self.max_body_bytes).status
        except HttpExchangeError as exc:
            return sample(None, error=f"GET /health: {exc}", refused=exc.refused)
        # /metrics is read even after a 503: the report shows the last numbers.
        try:
            reply = _request(
                "GET",
                self._metrics_url,
                deadline,
                self.max_body_bytes,
                # Plain text format, uncompressed: the body cap then counts real bytes.
                accept="text/plain; version=0.0.4",
            )
        except HttpExchangeError as exc:
            return sample(health, error=f"GET /metrics: {exc}")
        if reply.status != 200:
            return sample(health, error=f"GET {reply.url}: HTTP {reply.status}; expected 200")
        try:
            engines = parse_metrics(reply.body.decode("utf-8"))
        except UnicodeDecodeError as exc:
            return sample(health, error=f"GET {reply.url}: body is not UTF-8 ({exc.reason})")
        except MetricsFormatError as exc:
            return sample(health, error=str(exc))
        if not engines:
            return sample(
                health,
                error=f"{reply.url} has no vllm:* progress series "
                "(not a vLLM server, or one started with --disable-log-stats?)",
            )
        return sample(health, engines)


class Canary:
    """A one-token completion: the direct test that the engine still answers.

    The model is ``model`` if given, else the first one seen in ``/metrics``
    (passed to :meth:`run`), else the first id from ``GET /v1/models``.
    """

    def __init__(
        self, url: str, model: str | None, timeout: float, *, api_key: str | None = None
    ) -> None:
        check_base_url(url)
        if timeout <= 0:
            raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
        self.url = url
        self.model = model
        self.timeout = timeout
        # The server's --api-key (probes.vllm.canary.api_key_file): vLLM wants it on
        # every /v1 route; /health and /metrics answer without it.
        self._authorization = None if api_key is None else f"Bearer {api_key}"

    def __repr__(self) -> str:
        key = "set" if self._authorization else "none"
        return f"Canary(url={self.url!r}, model={self.model!r}, api key {key})"

    def run(self, known_models: Sequence[str] = ()) -> CanaryResult:
        started = time.monotonic()
        deadline = started + self.timeout
        model = self.model or (known_models[0] if known_models else None)

        def result(outcome: Literal["ok", "timeout", "error"], error: str | None) -> CanaryResult:
            end = time.monotonic()
            return CanaryResult(outcome, end - started, end, model, error)

        try:
            if model is None:
                model = self._first_served_model(deadline)
            body = json.dumps({"model": model, "prompt": "ping", "max_tokens": 1}).encode()
            reply = _request(
                "POST",
                _endpoint(self.url, "/v1/completions"),
                deadline,
                1024 * 1024,
                body=body,
                accept="application/json",
                authorization=self._authorization,
            )
        except HttpExchangeError as exc:
            return result("timeout" if exc.timed_out else "error", str(exc))
        if reply.status == 401:
            return result("error", self._unauthorized())
        if reply.status != 200:
            return result("error", f"HTTP {reply.status}: {_error_message(reply.body)}")
        try:
            choices = json.loads(reply.body)["choices"]
        except (ValueError, KeyError, TypeError):
            return result("error", f"answer is not a completion: {_excerpt(reply.body)}")
        if not isinstance(choices, list) or not choices:
            return result("error", "completion has no choices")
        return result("ok", None)

    def _first_served_model(self, deadline: float) -> str:
        reply = _request(
            "GET",
            _endpoint(self.url, "/v1/models"),
            deadline,
            1024 * 1024,
            authorization=self._authorization,
        )
        if reply.status == 401:
            raise HttpExchangeError(self._unauthorized())
        try:
            return str(json.loads(reply.body)["data"][0]["id"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise HttpExchangeError(
                f"no model to ask: /v1/models gave HTTP {reply.status} {_excerpt(reply.body)}"
            ) from exc

    def _unauthorized(self) -> str:
        if self._authorization is None:
            return (
                "HTTP 401: the server wants an API key (vLLM's --api-key); give it to the "
                "agent in probes.vllm.canary.api_key_file"
            )
        return (
            "HTTP 401: the server refused the API key of probes.vllm.canary.api_key_file "
            "(not the key of its --api-key)"
        )


class _ProcessEntry(Protocol):
    info: dict[str, Any]


def rank_process_alive(
    match: str,
    proc_iter: Callable[[list[str]], Iterable[_ProcessEntry]] = psutil.process_iter,
) -> bool:
    """Whether a live process has ``match`` in its command line.

    Zombies do not count: a rank that crashed but was not reaped yet is gone.
    This process itself does not count either (its argv may hold the pattern).
    """
    if not match:
        raise ValueError("match: expected a non-empty command-line fragment")
    me = os.getpid()
    for entry in proc_iter(["pid", "cmdline", "status"]):
        info = entry.info
        if info.get("pid") == me or info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        cmdline = info.get("cmdline") or []
        if match in " ".join(cmdline):
            return True
    return False


# --- bounded HTTP --------------------------------------------------------


class HttpExchangeError(ProbeError):
    """An HTTP exchange gave no usable answer. ``timed_out`` tells a deadline or
    socket timeout from a refusal or a dropped connection; ``refused`` marks a
    refused connection (ECONNREFUSED: nothing listens on the port)."""

    def __init__(self, message: str, *, timed_out: bool = False, refused: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.refused = refused


@dataclass(frozen=True)
class _Reply:
    url: str
    status: int
    body: bytes
    location: str | None = field(default=None, repr=False)


def _request(
    method: str,
    url: str,
    deadline: float,
    max_body_bytes: int,
    *,
    body: bytes | None = None,
    accept: str = "*/*",
    authorization: str | None = None,
) -> _Reply:
    """One request within ``deadline``. A redirect is an answer that is not
    followed: the probe talks to the vLLM it was given, never to whatever host a
    ``Location`` names, so a 3xx raises HttpExchangeError saying where it pointed."""
    reply = _exchange(method, url, deadline, max_body_bytes, body, accept, authorization)
    if 300 <= reply.status < 400:
        where = urljoin(url, reply.location)[:200] if reply.location else None
        target = f"to {where}" if where else "without a Location"
        raise HttpExchangeError(
            f"{url} answered HTTP {reply.status} (a redirect {target}); redirects are not "
            "followed: give the URL vLLM itself serves on (probes.vllm.url)"
        )
    return reply


class _DeadlineCut:
    """Shuts a connection's socket down when the deadline passes, which wakes a
    ``recv`` blocked in any phase of the exchange with end-of-file."""

    def __init__(self, connection: http.client.HTTPConnection, seconds: float) -> None:
        self.fired = False
        self._connection = connection
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True
        self._timer.start()

    def _cut(self) -> None:
        self.fired = True
        sock = self._connection.sock
        if sock is not None:
            # The plain socket's shutdown, also for TLS: SSLSocket's own would
            # tear down TLS state under the reading thread. OSError: already closed.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def cancel(self) -> None:
        self._timer.cancel()


def _exchange(
    method: str,
    url: str,
    deadline: float,
    max_body_bytes: int,
    body: bytes | None,
    accept: str,
    authorization: str | None = None,
) -> _Reply:
    connection, path, budget = _connection(method, url, deadline)
    headers = _headers(accept, body is not None, authorization)
    cut = _DeadlineCut(connection, budget)
    try:
        connection.connect()
        if cut.fired:
            raise TimeoutError("deadline passed while connecting")
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        body_read = _read_body(response, url, max_body_bytes)
        if cut.fired:  # the cut reads as end-of-file: what came may be partial
            raise TimeoutError("deadline passed while reading the body")
        return _Reply(url, response.status, body_read, response.getheader("Location"))
    except (OSError, http.client.HTTPException) as exc:
        if cut.fired:
            raise HttpExchangeError(
                f"no complete answer from {url} within {budget:.1f} s "
                "(server too slow, or dripping its answer)",
                timed_out=True,
            ) from exc
        raise HttpExchangeError(
            _describe(exc, method, url),
            timed_out=isinstance(exc, TimeoutError),
            refused=isinstance(exc, ConnectionRefusedError),
        ) from exc
    finally:
        cut.cancel()
        connection.close()


def _connection(
    method: str, url: str, deadline: float
) -> tuple[http.client.HTTPConnection, str, float]:
    """An unopened connection to ``url``'s host, the request path and the seconds left."""
    parts = urlsplit(url)
    try:
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise HttpExchangeError(f"bad URL {url}: {exc}") from exc
    if not host:
        raise HttpExchangeError(f"bad URL {url}: no host")
    budget = deadline - time.monotonic()
    if budget <= 0:
        raise HttpExchangeError(f"no time left for {method} {url}", timed_out=True)
    if parts.scheme == "https":
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            host, port, timeout=budget
        )
    else:
        connection = http.client.HTTPConnection(host, port, timeout=budget)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return connection, path, budget


def _headers(accept: str, json_body: bool, authorization: str | None) -> dict[str, str]:
    headers = {
        "Accept": accept,
        "Accept-Encoding": "identity",
        "Connection": "close",
        "User-Agent": _USER_AGENT,
    }
    if json_body:
        headers["Content-Type"] = "application/json"
    if authorization is not None:
        headers["Authorization"] = authorization
    return headers


def _read_body(response: http.client.HTTPResponse, url: str, limit: int) -> bytes:
    declared = response.getheader("Content-Length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HttpExchangeError(f"{url} announces {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    while chunk := response.read(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise HttpExchangeError(f"{url} sent more than {limit} bytes (max_body_bytes)")
        chunks.append(chunk)
    # http.client's read(amt) ends quietly at an early end-of-file when the
    # length is known (chunked bodies do raise): a truncated /metrics would
    # parse as a smaller, wrong one.
    if declared is not None and declared.isdigit() and size < int(declared):
        raise http.client.IncompleteRead(b"".join(chunks), int(declared) - size)
    return b"".join(chunks)


def _describe(exc: BaseException, method: str, url: str) -> str:
    where = urlsplit(url).netloc
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused by {where} (nothing listening there)"
    if isinstance(exc, http.client.RemoteDisconnected):
        return f"{where} closed the connection without answering {method} {url}"
    if isinstance(exc, http.client.IncompleteRead):
        return f"{where} closed the connection mid-answer after {len(exc.partial)} body bytes"
    if isinstance(exc, ConnectionResetError):
        return f"connection reset by {where} during {method} {url}"
    if isinstance(exc, TimeoutError):
        return f"timed out waiting for {where} ({method} {url})"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve {urlsplit(url).hostname}: {exc.strerror}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failure with {where}: {exc.reason or exc}"
    if isinstance(exc, http.client.HTTPException):
        return f"{where} did not answer in HTTP ({type(exc).__name__}: {exc})"
    return f"{method} {url}: {exc.strerror or exc}" if isinstance(exc, OSError) else str(exc)


def check_base_url(url: str) -> None:
    """Raise ValueError unless ``url`` is an http(s)://host[:port][/prefix] URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f'url: expected an http(s)://host[:port] URL, got "{url}"')
    try:
        _ = parts.port
    except ValueError as exc:
        raise ValueError(f'url: expected a port number 1-65535 in "{url}"') from exc


def _endpoint(base: str, path: str) -> str:
    # The base may carry a prefix (a reverse proxy's /vllm); keep it.
    return base.rstrip("/") + path


def _error_message(body: bytes) -> str:
    try:
        payload = json.loads(body)
    except ValueError:
        return _excerpt(body)
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if "message" in payload:
            return str(payload["message"])
    return _excerpt(body)


def _excerpt(body: bytes, limit: int = 200) -> str:
    text = body[:limit].decode("utf-8", errors="replace")
    return repr(text + ("..." if len(body) > limit else ""))
