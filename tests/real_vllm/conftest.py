"""The real-vLLM tier: vLLM's CPU build serving a tiny random model on loopback.

The environment comes from ``scripts/real_vllm_env.py build`` (scripts/test.sh
builds it) or ``$SPARK_WATCHDOG_VLLM_PYTHON``. Without it the tier is skipped
with that command in the reason, unless ``SPARK_WATCHDOG_REQUIRE_REAL_VLLM=1``
(scripts/test.sh sets it once the environment is there): then it fails.
``SPARK_WATCHDOG_REAL_VLLM=0`` turns the tier off.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from real_vllm_tier import vllm_python_or_skip

from spark_watchdog.lab.hardware import real_vllm
from spark_watchdog.lab.ports import free_port
from spark_watchdog.probes.vllm import ProgressTracker, VllmScraper, VllmStatus

# A start here takes 30-60 s (model load, KV cache, warm-up); on a loaded
# machine more.
START_TIMEOUT = 420.0
# How often a start asks /health: a refused connection costs nothing, and a
# server seen up a second late is a second every test waits.
HEALTH_POLL_S = 0.2


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.real_vllm)
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    return vllm_python_or_skip()


@pytest.fixture(scope="session")
def tiny_model(vllm_python: Path) -> Path:
    """Made once per machine and kept in the cache (real_vllm.tiny_model)."""
    return real_vllm.tiny_model(vllm_python)


class VllmServer:
    """One real OpenAI server in a session of its own, its output in a log file."""

    def __init__(
        self,
        python: Path,
        model: Path,
        log: Path,
        *,
        execute_timeout: float | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.argv = real_vllm.server_argv(python, model, "127.0.0.1", self.port, extra)
        self.env = real_vllm.server_environment(execute_timeout=execute_timeout)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> VllmServer:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"vLLM exited {self.process.returncode} while starting:\n{self.tail()}")
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            time.sleep(HEALTH_POLL_S)
        pytest.fail(f"vLLM not healthy after {START_TIMEOUT:.0f} s:\n{self.tail()}")

    def processes(self) -> real_vllm.ServerProcesses:
        assert self.process is not None
        return real_vllm.server_processes(self.process.pid)

    def engine(self) -> psutil.Process:
        engine = self.processes().engine
        assert engine is not None, "no VLLM::EngineCore below the API server"
        return engine

    def worker(self) -> psutil.Process:
        workers = self.processes().workers
        assert workers, "no VLLM::Worker below the engine"
        return workers[0]

    def wait_exit(self, timeout: float) -> int | None:
        assert self.process is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.process.wait(timeout)
        return None

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGCONT)  # a stopped process cannot exit
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(30)
        # Anything left of the tree (an orphaned engine or worker) goes too.
        for process in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                if os.getpgid(process.pid) == self.process.pid:
                    process.kill()


def _starter(python: Path, model: Path, directory: Path) -> Iterator[Callable[..., VllmServer]]:
    servers: list[VllmServer] = []

    def start(**kwargs: Any) -> VllmServer:
        server = VllmServer(python, model, directory / f"vllm-{len(servers)}.log", **kwargs)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def start_vllm(
    vllm_python: Path, tiny_model: Path, tmp_path: Path
) -> Iterator[Callable[..., VllmServer]]:
    """Start a real server (``execute_timeout=``, ``extra=`` argv); stopped after the test."""
    yield from _starter(vllm_python, tiny_model, tmp_path)


@pytest.fixture(scope="module")
def start_module_vllm(
    vllm_python: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., VllmServer]]:
    """As ``start_vllm``, for a server the tests of one module share."""
    yield from _starter(vllm_python, tiny_model, tmp_path_factory.mktemp("vllm"))


@pytest.fixture
def probe_watch() -> Callable[..., ProbeWatch]:
    """``probe_watch(url, stall_after, dead_after)``: the agent's probe, sampling."""
    return ProbeWatch


class ProbeWatch:
    """The agent's vLLM probe (scraper and tracker) sampling every ``every`` s,
    with the record of what it said and when."""

    def __init__(self, url: str, stall_after: float, dead_after: float, every: float = 0.5) -> None:
        self.scraper = VllmScraper(url, 2.0, 8 * 1024 * 1024)
        self.tracker = ProgressTracker(stall_after, dead_after=dead_after)
        self.every = every
        self.seen: list[tuple[float, VllmStatus]] = []
        self.worst_gap = 0.0

    def sample(self) -> VllmStatus:
        sample = self.scraper.scrape()
        status = self.tracker.update(sample, sample.observed_at)
        if self.seen:
            self.worst_gap = max(self.worst_gap, sample.observed_at - self.seen[-1][0])
        self.seen.append((sample.observed_at, status))
        return status

    def until(
        self, wanted: Callable[[VllmStatus], bool], timeout: float
    ) -> tuple[float, VllmStatus]:
        """Sample until ``wanted``; return (the sample's monotonic time, the status)."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.sample()
            if wanted(status):
                return self.seen[-1][0], status
            if time.monotonic() > deadline:
                pytest.fail(f"not seen within {timeout:.0f} s; the probe said:\n{self.story()}")
            time.sleep(self.every)

    def story(self, last: int = 12) -> str:
        if not self.seen:
            return "(nothing)"
        start = self.seen[0][0]
        return "\n".join(
            f"  {at - start:6.1f} s {s.state:<11} running={s.running} waiting={s.waiting} "
            f"steps={s.engine_steps} {s.reason}"
            for at, s in self.seen[-last:]
        )
