"""A stand-in for vLLM's API server, for tests and the lab.

It serves what the watchdog reads from a real head: ``/metrics`` with vLLM's
metric names and types (docs/facts.md, "Metrics"), ``/health``, ``/v1/models`` and
``POST /v1/completions``, with synthetic load running in a background thread.
Faults are switched at runtime with :meth:`VllmStandin.set_mode` or, from
another process, ``POST /_standin/mode`` with ``{"mode": ..., "engine": N}``:

- ``progressing`` / ``idle`` / ``wedged`` / ``hung``: what the engines do (one
  or all). Wedged is the failure the watchdog exists for: requests stay
  running, every counter freezes, ``/health`` keeps answering 200 and
  completions hang. Hung is the idle hang: nothing runs, no engine step, and a
  new completion queues as waiting (``num_requests_running`` stays 0) and hangs.
- ``dead``: ``/health`` answers 503 (EngineDeadError) and counters freeze.
- ``exit``: what real vLLM does when its EngineCore dies: ``dead`` for
  :data:`EXIT_DELAY` seconds, then the API server goes away (its port refuses
  connections); run as a process, it exits with code 0.
- ``slow``: every answer is dripped one byte at a time.
- ``drop``: the request is read, then the connection closed without an answer.
- ``restart``: counters start again from zero (a restarted vLLM), then progressing.

``/_standin/redirect/<path>`` answers 302 to ``/<path>``, for redirect tests.

Given its tensor-parallel group (``group``; ``--fabric-rank`` on the command
line), the engines step only while every rank answers over the fabric
(lab/hardware/rank_group.py): a rank gone, frozen or cut off stalls them, as
it stalls a real TP engine. A worker started with ``--fabric-listen`` answers
for its rank there.

Run as ``python -m spark_watchdog.lab.hardware vllm --port N``; it prints a
config line the way vLLM's engine does at startup, echoing the
``--speculative-config`` / ``--compilation-config`` it was given, and accepts
(and echoes) vLLM flags it does not know. ``--headless`` serves nothing and
just runs, like a worker rank > 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType, TracebackType
from typing import Any, cast

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from spark_watchdog.lab.hardware.rank_group import GroupReach, RankEndpoint, parse_address

ENGINE_MODES = ("progressing", "idle", "wedged", "hung")
FAULT_MODES = ("dead", "slow", "drop")
MODES = (*ENGINE_MODES, *FAULT_MODES, "restart", "exit")
# Real vLLM's API server exits about a second after EngineDeadError.
EXIT_DELAY = 1.0
CONTROL_PATH = "/_standin/mode"
REDIRECT_PREFIX = "/_standin/redirect/"

# vLLM sizes these buckets from max_num_batched_tokens; powers of two are close.
_ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# A completion waits at most this long for a wedged engine before giving up.
_HANG_LIMIT = 300.0


@dataclass
class _Engine:
    index: int
    mode: str = "progressing"
    running: int = 0
    waiting: int = 0
    steps: int = 0


class _Metrics:
    """The series vLLM's metrics logger exports, in their own registry."""

    def __init__(self, old_names: bool) -> None:
        self.registry = CollectorRegistry()
        # vLLM before the V1 engine had no data-parallel engines and no
        # ``engine`` label, and called KV usage gpu_cache_usage_perc.
        labels = ["model_name"] if old_names else ["model_name", "engine"]
        kv_name = "vllm:gpu_cache_usage_perc" if old_names else "vllm:kv_cache_usage_perc"
        reg = self.registry
        self.running = Gauge("vllm:num_requests_running", "Running requests", labels, registry=reg)
        self.waiting = Gauge("vllm:num_requests_waiting", "Waiting requests", labels, registry=reg)
        self.kv_usage = Gauge(kv_name, "KV-cache usage, 1 = full", labels, registry=reg)
        # prometheus_client appends _total to counter names on exposition.
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens", labels, registry=reg)
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Generated tokens", labels, registry=reg
        )
        self.request_success = Counter(
            "vllm:request_success",
            "Finished requests",
            [*labels, "finished_reason"],
            registry=reg,
        )
        self.preemptions = Counter("vllm:num_preemptions", "Preemptions", labels, registry=reg)
        self.iteration_tokens = Histogram(
            "vllm:iteration_tokens_total",
            "Tokens per engine step",
            labels,
            buckets=_ITERATION_BUCKETS,
            registry=reg,
        )

    def declare(self, labels: tuple[str, ...]) -> None:
        """Create an engine's series at zero, as vLLM does at startup: a restarted
        engine shows counters back at 0, not missing."""
        for metric in (self.prompt_tokens, self.generation_tokens, self.preemptions):
            metric.labels(*labels)
        self.iteration_tokens.labels(*labels)
        for reason in ("stop", "length", "abort"):
            self.request_success.labels(*labels, reason)


class VllmStandin:
    """The stand-in server, in-process. Use as a context manager::

    with VllmStandin(engines=2) as vllm:
        vllm.set_mode("wedged", engine=1)
        scrape(vllm.url)
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        engines: int = 1,
        model: str = "standin-model",
        old_names: bool = False,
        mode: str = "progressing",
        step_rate: float = 30.0,
        drip_interval: float = 0.2,
        seed: int | None = None,
        api_key: str | None = None,
        group: Callable[[], bool] | None = None,
    ) -> None:
        if engines < 1:
            raise ValueError(f"engines: expected ≥ 1, got {engines}")
        if old_names and engines > 1:
            raise ValueError("old_names emulates vLLM before V1, which had one engine")
        if step_rate <= 0:
            raise ValueError(f"step_rate: expected steps per second > 0, got {step_rate}")
        self.model = model
        # vLLM's --api-key: every /v1 route wants "Authorization: Bearer KEY".
        self.api_key = api_key
        self.old_names = old_names
        self.step_rate = step_rate
        # Whether every rank of the engine's TP group answers: no step without it.
        self._group = group
        self.drip_interval = drip_interval
        self._random = random.Random(seed)
        self._lock = threading.Condition()  # an RLock inside: mode is read under it too
        self._stopping = threading.Event()
        self._engines = [_Engine(i) for i in range(engines)]
        self._fault: str | None = None
        self._next_engine = 0
        self._completions = 0
        self._metrics = self._new_metrics()
        self.set_mode(mode)  # before binding: a bad mode leaks no socket
        self._server = _StandinServer((host, port), _StandinHandler, self)
        self._serving: threading.Thread | None = None
        self._load: threading.Thread | None = None
        # Set once the API server went away on its own (mode ``exit``).
        self.exited = threading.Event()

    # --- lifecycle ---------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else host
        return f"http://[{name}]:{port}" if ":" in name else f"http://{name}:{port}"

    def start(self) -> VllmStandin:
        self._serving = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name="vllm-standin-http",
            daemon=True,
        )
        self._load = threading.Thread(target=self._run_load, name="vllm-standin-load", daemon=True)
        self._serving.start()
        self._load.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self._lock:
            self._lock.notify_all()
        if self._serving is not None:
            self._server.shutdown()
            self._serving.join()
        self._server.server_close()
        if self._load is not None:
            self._load.join()

    def _exit(self) -> None:
        """The API server goes away: the port refuses from now on."""
        if self._serving is not None:
            self._server.shutdown()
        self._server.server_close()
        self.exited.set()

    def __enter__(self) -> VllmStandin:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- control -----------------------------------------------------------

    def set_mode(self, mode: str, engine: int | None = None) -> None:
        """Switch behaviour; ``engine`` limits an engine mode to one engine."""
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}, got {mode!r}")
        if engine is not None and mode not in ENGINE_MODES:
            raise ValueError(f"mode {mode!r} applies to the whole server, not to one engine")
        if engine is not None and not 0 <= engine < len(self._engines):
            raise ValueError(f"engine: expected 0..{len(self._engines) - 1}, got {engine}")
        with self._lock:
            if mode in FAULT_MODES:
                self._fault = mode
            elif mode == "exit":
                self._fault = "dead"
                _log("EngineDeadError: EngineCore encountered an issue; shutting down")
                timer = threading.Timer(EXIT_DELAY, self._exit)
                timer.daemon = True
                timer.start()
            elif mode == "restart":
                self._metrics = self._new_metrics()
                self._fault = None
                for each in self._engines:
                    each.mode, each.running, each.waiting, each.steps = "progressing", 0, 0, 0
                    self._publish(each)
            else:
                if engine is None:
                    self._fault = None
                for each in self._engines:
                    if engine is None or each.index == engine:
                        each.mode = mode
                        self._enter_engine_mode(each)
            self._lock.notify_all()

    @property
    def mode(self) -> str:
        """The fault if one is set, else the engines' shared mode, else ``mixed``."""
        with self._lock:
            if self._fault is not None:
                return self._fault
            modes = {each.mode for each in self._engines}
            return modes.pop() if len(modes) == 1 else "mixed"

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "mode": self.mode,
                "fault": self._fault,
                "model": self.model,
                "old_names": self.old_names,
                "completions": self._completions,
                "engines": [
                    {"engine": e.index, "mode": e.mode, "running": e.running, "steps": e.steps}
                    for e in self._engines
                ],
            }

    def advance(self, steps: int = 1) -> None:
        """Run ``steps`` engine steps now on every progressing engine, as the
        load thread does on its own; for tests that want exact counts."""
        with self._lock:
            for _ in range(steps):
                for each in self._engines:
                    if each.mode == "progressing":
                        self._step(each)
            self._lock.notify_all()

    def exposition(self) -> bytes:
        """The ``/metrics`` body as served now."""
        with self._lock:
            registry = self._metrics.registry
        return generate_latest(registry)

    def engine_steps(self, engine: int = 0) -> int:
        with self._lock:
            return self._engines[engine].steps

    # --- synthetic load ----------------------------------------------------

    def _run_load(self) -> None:
        period = 1.0 / self.step_rate
        next_tick = time.monotonic()
        while not self._stopping.is_set():
            with self._lock:
                if self._fault != "dead" and self._group_answers():
                    self.advance()
            next_tick += period
            delay = next_tick - time.monotonic()
            if delay < -1.0:  # fell far behind (suspended): don't burst to catch up
                next_tick = time.monotonic()
            self._stopping.wait(max(delay, 0.0))

    def _group_answers(self) -> bool:
        return self._group is None or self._group()

    def _new_metrics(self) -> _Metrics:
        metrics = _Metrics(self.old_names)
        for each in self._engines:
            metrics.declare(self._labels(each))
        return metrics

    def _enter_engine_mode(self, engine: _Engine) -> None:
        if engine.mode in ("idle", "hung"):
            engine.running = engine.waiting = 0
        elif engine.mode == "wedged" and engine.running == 0:
            # A wedge is only visible with requests stuck in the engine.
            engine.running, engine.waiting = 4, 2
        self._publish(engine)

    def _step(self, engine: _Engine, canary: bool = False) -> None:
        """One engine step: every running request gets a token; sometimes one
        finishes and a waiting or new one is admitted with its prompt."""
        metrics, labels, rng = self._metrics, self._labels(engine), self._random
        if engine.running == 0 and not canary:
            engine.running, engine.waiting = rng.randint(2, 8), rng.randint(0, 3)
        prefill = 0
        decoding = engine.running + (1 if canary else 0)
        if canary or rng.random() < 0.05:
            prefill = rng.randint(16, 512)
            metrics.prompt_tokens.labels(*labels).inc(prefill)
            reason = "length" if canary or rng.random() < 0.3 else "stop"
            metrics.request_success.labels(*labels, reason).inc()
            if not canary and engine.waiting:
                engine.waiting -= 1
            elif not canary:
                engine.waiting = rng.randint(0, 3)
        if rng.random() < 0.002:
            metrics.preemptions.labels(*labels).inc()
        metrics.generation_tokens.labels(*labels).inc(decoding)
        metrics.iteration_tokens.labels(*labels).observe(decoding + prefill)
        engine.steps += 1
        self._publish(engine)

    def _publish(self, engine: _Engine) -> None:
        labels = self._labels(engine)
        self._metrics.running.labels(*labels).set(engine.running)
        self._metrics.waiting.labels(*labels).set(engine.waiting)
        usage = min(0.95, engine.running * 0.07 + engine.waiting * 0.01)
        self._metrics.kv_usage.labels(*labels).set(usage)

    def _labels(self, engine: _Engine) -> tuple[str, ...]:
        return (self.model,) if self.old_names else (self.model, str(engine.index))

    # --- what the handler asks --------------------------------------------

    def _fault_now(self) -> str | None:
        with self._lock:
            return self._fault

    def _complete(self) -> tuple[HTTPStatus, dict[str, Any]]:
        """Serve one completion: wait for the engine to step, like vLLM does."""
        give_up = time.monotonic() + _HANG_LIMIT
        with self._lock:
            engine = self._engines[self._next_engine % len(self._engines)]
            self._next_engine += 1
            queued = False  # counted as waiting on a hung engine
            try:
                # A step needs the whole group: a rank out of reach holds it like a wedge.
                while (
                    self._fault == "dead"
                    or engine.mode in ("wedged", "hung")
                    or not self._group_answers()
                ):
                    if self._fault == "dead":
                        return HTTPStatus.INTERNAL_SERVER_ERROR, _error(
                            "EngineDeadError: EngineCore encountered an issue",
                            "InternalServerError",
                        )
                    if engine.mode == "hung" and not queued:
                        engine.waiting += 1
                        queued = True
                        self._publish(engine)
                    left = give_up - time.monotonic()
                    if left <= 0 or self._stopping.is_set():
                        return HTTPStatus.GATEWAY_TIMEOUT, _error("engine never stepped", "Timeout")
                    self._lock.wait(min(left, 1.0))
            finally:
                if queued:
                    engine.waiting = max(0, engine.waiting - 1)
                    self._publish(engine)
            self._step(engine, canary=True)
            self._completions += 1
            number = self._completions
        return HTTPStatus.OK, {
            "id": f"cmpl-standin-{number}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "text": " pong", "logprobs": None, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }

    def _models(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": self.model,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": self.model,
                    "parent": None,
                }
            ],
        }


class _StandinServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        standin: VllmStandin,
    ) -> None:
        self.standin = standin
        super().__init__(address, handler)


class _StandinHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    sys_version = ""

    @property
    def standin(self) -> VllmStandin:
        return cast(_StandinServer, self.server).standin

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a request line per scrape would bury the test output

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        self.close_connection = True
        body = self._read_body()
        path = self.path.split("?", 1)[0]
        if path == CONTROL_PATH:  # never faulted: the lab must be able to heal it
            self._control(method, body)
            return
        if self.standin._fault_now() == "drop":
            return  # request read; close without a word
        standin = self.standin
        if path.startswith("/v1") and not self._authorized():
            self._send_json(HTTPStatus.UNAUTHORIZED, {"error": "Unauthorized"})
        elif path.startswith(REDIRECT_PREFIX):
            self._send(HTTPStatus.FOUND, b"", location="/" + path[len(REDIRECT_PREFIX) :])
        elif method == "GET" and path == "/health":
            dead = standin._fault_now() == "dead"
            self._send(HTTPStatus.SERVICE_UNAVAILABLE if dead else HTTPStatus.OK, b"")
        elif method == "GET" and path == "/metrics":
            self._send(HTTPStatus.OK, standin.exposition(), CONTENT_TYPE_LATEST)
        elif method == "GET" and path == "/v1/models":
            self._send_json(HTTPStatus.OK, standin._models())
        elif method == "POST" and path == "/v1/completions":
            self._completion(body)
        else:
            self._send_json(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})

    def _authorized(self) -> bool:
        key = self.standin.api_key
        return key is None or self.headers.get("Authorization") == f"Bearer {key}"

    def _completion(self, body: bytes) -> None:
        try:
            request = json.loads(body)
            model = request["model"]
        except (ValueError, KeyError, TypeError):
            self._send_json(
                HTTPStatus.BAD_REQUEST, _error("expected a JSON body with a model", "BadRequest")
            )
            return
        if model != self.standin.model:
            message = f"The model `{model}` does not exist."
            self._send_json(HTTPStatus.NOT_FOUND, _error(message, "NotFoundError"))
            return
        status, payload = self.standin._complete()
        self._send_json(status, payload)

    def _control(self, method: str, body: bytes) -> None:
        if method == "POST":
            try:
                request = json.loads(body)
                engine = request.get("engine")
                self.standin.set_mode(str(request["mode"]), None if engine is None else int(engine))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self._send_json(HTTPStatus.BAD_REQUEST, {"error": str(exc)}, faultless=True)
                return
        self._send_json(HTTPStatus.OK, self.standin.snapshot(), faultless=True)

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def _send_json(self, status: HTTPStatus, payload: Any, faultless: bool = False) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", faultless=faultless)

    def _send(
        self,
        status: HTTPStatus,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        *,
        location: str | None = None,
        faultless: bool = False,
    ) -> None:
        head = [
            f"HTTP/1.1 {status.value} {status.phrase}",
            f"content-type: {content_type}",
            f"content-length: {len(body)}",
            "connection: close",
        ]
        if location is not None:
            head.append(f"location: {location}")
        raw = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        try:
            if not faultless and self.standin._fault_now() == "slow":
                self._drip(raw)
            else:
                self.wfile.write(raw)
        except OSError:
            pass  # the client went away: nothing to tell

    def _drip(self, raw: bytes) -> None:
        standin = self.standin
        for offset in range(len(raw)):
            if standin._fault_now() != "slow":
                self.wfile.write(raw[offset:])  # healed mid-answer: finish at once
                return
            self.wfile.write(raw[offset : offset + 1])
            if standin._stopping.wait(standin.drip_interval):
                return


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


# --- command line ----------------------------------------------------------

# vLLM's CUDAGraphMode values, as its config line prints them.
_CUDAGRAPH_MODES = {
    "NONE": "0",
    "PIECEWISE": "1",
    "FULL": "2",
    "FULL_DECODE_ONLY": "(2, 0)",
    "FULL_AND_PIECEWISE": "(2, 1)",
}
_DEFAULT_CUDAGRAPH_MODE = "FULL_AND_PIECEWISE"


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r} ({exc})") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spark_watchdog.lab.hardware vllm",
        description="vLLM stand-in: /metrics, /health, /v1/models, /v1/completions with "
        "synthetic load, faults switchable via POST /_standin/mode. Unknown vLLM flags "
        "are accepted and echoed.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    parser.add_argument("--model", default="standin-model", help="served model name")
    parser.add_argument(
        "--engines",
        "--data-parallel-size",
        dest="engines",
        type=int,
        default=1,
        help="number of engines (the engine label); vLLM's data parallelism",
    )
    parser.add_argument("--old-names", action="store_true", help="pre-V1 metric names")
    parser.add_argument("--mode", choices=MODES, default="progressing")
    parser.add_argument("--step-rate", type=float, default=30.0, help="engine steps per second")
    parser.add_argument(
        "--drip-interval", type=float, default=0.2, help="seconds per byte in slow mode"
    )
    parser.add_argument("--headless", action="store_true", help="worker rank: serve nothing")
    parser.add_argument(
        "--fabric-listen",
        metavar="HOST:PORT",
        type=parse_address,
        help="worker rank: answer the head's all-reduce here (the rank's fabric address)",
    )
    parser.add_argument(
        "--fabric-rank",
        metavar="HOST:PORT",
        type=parse_address,
        action="append",
        default=[],
        help="head: a rank of its TP group (repeated); the engines step only while each answers",
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("VLLM_API_KEY"),
        help="as vLLM's: /v1 routes want this bearer token (default: $VLLM_API_KEY)",
    )
    parser.add_argument("--speculative-config", type=_json_object, default=None)
    parser.add_argument("--compilation-config", type=_json_object, default=None)
    parser.add_argument(
        "--legacy-adaptive-verification",
        action="store_true",
        help="emulate a build without vllm PR #55095: adaptive verification silently "
        "forces cudagraph_mode FULL_AND_PIECEWISE (vllm #56626)",
    )
    return parser


def effective_cudagraph_mode(args: argparse.Namespace) -> str:
    asked = str((args.compilation_config or {}).get("cudagraph_mode", _DEFAULT_CUDAGRAPH_MODE))
    asked = asked.upper()
    adaptive = bool((args.speculative_config or {}).get("enable_adaptive_verification"))
    if args.legacy_adaptive_verification and adaptive:
        return "FULL_AND_PIECEWISE"
    return asked


def config_line(args: argparse.Namespace, extra: list[str]) -> str:
    """The engine's startup config line, in the shape vLLM logs it."""
    mode = effective_cudagraph_mode(args)
    compilation = dict(args.compilation_config or {})
    compilation["cudagraph_mode"] = f"<CUDAGraphMode.{mode}: {_CUDAGRAPH_MODES.get(mode, '?')}>"
    shown = ", ".join(f"'{key}': {value}" for key, value in compilation.items())
    return (
        f"Initializing a V1 LLM engine (standin) with config: model='{args.model}', "
        f"speculative_config={args.speculative_config}, "
        f"data_parallel_size={args.engines}, headless={args.headless}, "
        f"extra_args={extra}, compilation_config={{{shown}}}"
    )


def _log(message: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"INFO {stamp} [vllm_standin.py] {message}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    given = {k: v for k, v in vars(args).items() if v != parser.get_default(k)}
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Before the first line: a launcher that stops the rank as soon as it has
    # seen the config line must get a clean exit, not death by SIGTERM.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    _log(f"non-default args: {given}{f' extra: {extra}' if extra else ''}")
    _log(config_line(args, extra))
    if args.headless:
        return _run_headless(args, stop)
    group = GroupReach(args.fabric_rank).start() if args.fabric_rank else None
    try:
        standin = VllmStandin(
            args.host,
            args.port,
            engines=args.engines,
            model=args.model,
            old_names=args.old_names,
            mode=args.mode,
            step_rate=args.step_rate,
            drip_interval=args.drip_interval,
            api_key=args.api_key,
            group=None if group is None else group.answers,
        )
    except (ValueError, OSError) as exc:
        print(f"vllm_standin: {exc}", file=sys.stderr)
        return 2
    with standin:
        print(f"INFO:     Uvicorn running on {standin.url} (Press CTRL+C to quit)", flush=True)
        print("INFO:     Application startup complete.", flush=True)
        while not stop.wait(0.1) and not standin.exited.is_set():
            pass
    if group is not None:
        group.stop()
    return 0


def _run_headless(args: argparse.Namespace, stop: threading.Event) -> int:
    """A worker rank: no API server; its end of the group's all-reduce, if given one."""
    endpoint = None
    if args.fabric_listen is not None:
        try:
            endpoint = RankEndpoint(*args.fabric_listen).start()
        except OSError as exc:
            print(f"vllm_standin: --fabric-listen {args.fabric_listen}: {exc}", file=sys.stderr)
            return 2
    _log("headless rank: no API server; engine running")
    while not stop.wait(0.5):
        pass
    if endpoint is not None:
        endpoint.stop()
    return 0
