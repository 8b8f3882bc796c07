"""The agent's vLLM probe against the real server: what it says for each real fault.

Each figure the probe reports here comes from real vLLM: its /metrics (names,
labels, ``_created`` samples), its /health, and how its processes behave when
the engine or a worker is stopped or killed.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from spark_watchdog.lab.hardware.real_vllm import TrafficLoad

STALL_AFTER = 5.0
DEAD_AFTER = 5.0
# How much later than stall_after the probe may call a stall (the bound),
# on top of any sampling delay the machine itself caused.
STALL_SLACK = 1.5
WORKER_TIMEOUT = 20.0


@pytest.fixture(scope="module")
def server(start_module_vllm: Callable[..., Any]) -> Any:
    """One server for the tests that leave it running, then the engine kill."""
    return start_module_vllm(execute_timeout=WORKER_TIMEOUT)


@pytest.fixture
def watch(server: Any, probe_watch: Callable[..., Any]) -> Any:
    return probe_watch(server.url, STALL_AFTER, DEAD_AFTER)


def _progressing_with_requests(status: object) -> bool:
    return (
        getattr(status, "state", None) == "progressing"
        and (getattr(status, "running", 0) or 0) >= 2
    )


def test_an_idle_server_is_idle(server: Any, watch: Any) -> None:
    states = []
    for _ in range(4):
        states.append(watch.sample().state)
        time.sleep(0.5)
    # A scrape that missed its deadline on a loaded machine says unreachable.
    assert set(states) <= {"idle", "unreachable"} and states.count("idle") >= 3, watch.story()
    status = next(s for _, s in reversed(watch.seen) if s.state == "idle")
    assert status.health_status == 200
    assert status.running == 0 and status.waiting == 0
    # The real server's own series: the engine-step heartbeat is there.
    assert status.engine_steps is not None, watch.story()
    assert "tiny" in status.models


def test_bounded_load_is_progressing(server: Any, watch: Any) -> None:
    with TrafficLoad(server.url) as load:
        watch.until(_progressing_with_requests, timeout=60)
        states = []
        for _ in range(8):
            states.append(watch.sample().state)
            time.sleep(0.5)
    # A scrape that missed its deadline on this loaded machine says unreachable;
    # nothing else than progressing may show while requests flow.
    assert set(states) <= {"progressing", "unreachable"}, watch.story()
    assert states.count("progressing") >= 6, watch.story()
    assert load.completed > 0 and load.failed == 0
    steps = [s.engine_steps for _, s in watch.seen if s.engine_steps is not None]
    assert steps[-1] > steps[0]


def test_a_stopped_engine_is_stalled_and_progresses_again_after_sigcont(
    server: Any, watch: Any
) -> None:
    engine = server.engine()
    with TrafficLoad(server.url):
        watch.until(_progressing_with_requests, timeout=60)
        engine.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            seen_at, status = watch.until(lambda s: s.state == "stalled", timeout=60)
            latency = seen_at - stopped_at
            # /health stays 200 and /metrics keeps the last running count.
            assert status.health_status == 200
            assert (status.running or 0) + (status.waiting or 0) > 0
            machine_delay = max(0.0, watch.worst_gap - watch.every)
            assert latency <= STALL_AFTER + STALL_SLACK + machine_delay, (latency, watch.story())
        finally:
            engine.send_signal(signal.SIGCONT)
        watch.until(lambda s: s.state == "progressing", timeout=60)


def test_a_killed_engine_is_dead_and_the_api_server_exits_0(server: Any, watch: Any) -> None:
    watch.until(lambda s: s.state == "idle", timeout=30)
    server.engine().send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    # Dead either way: the 503 window of /health (about 0.1 s, seen only when a
    # scrape lands in it), or the port refusing after the API server's exit.
    seen_at, _ = watch.until(lambda s: s.state == "dead", timeout=60)
    assert seen_at - killed_at <= DEAD_AFTER + 15.0, watch.story()
    # The API server exits on its own, with 0 (so Restart=on-failure never fires).
    assert server.wait_exit(30) == 0, server.tail()
    _, status = watch.until(
        lambda s: s.state == "dead" and "refuses connections" in s.reason, timeout=DEAD_AFTER + 15
    )
    assert status.health_status is None


def test_a_hung_worker_is_stalled_then_dead_after_the_execute_timeout(
    start_vllm: Callable[..., Any], probe_watch: Callable[..., Any]
) -> None:
    server = start_vllm(execute_timeout=WORKER_TIMEOUT)
    watch = probe_watch(server.url, STALL_AFTER, DEAD_AFTER)
    worker = server.worker()
    with TrafficLoad(server.url):
        watch.until(_progressing_with_requests, timeout=60)
        worker.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            stalled_at, _ = watch.until(lambda s: s.state in ("stalled", "dead"), timeout=60)
            assert watch.seen[-1][1].state == "stalled", watch.story()
            dead_at, _ = watch.until(lambda s: s.state == "dead", timeout=WORKER_TIMEOUT + 60)
        finally:
            with contextlib.suppress(psutil.NoSuchProcess):  # vLLM killed it
                worker.send_signal(signal.SIGCONT)
    assert stalled_at - stopped_at <= STALL_AFTER + STALL_SLACK + max(
        0.0, watch.worst_gap - watch.every
    ), watch.story()
    # vLLM gives up on the worker after VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS, then exits 0.
    assert dead_at - stopped_at >= WORKER_TIMEOUT, watch.story(40)
    assert server.wait_exit(30) == 0, server.tail()
    assert "EngineDeadError" in server.log.read_text(errors="replace")
