"""The vLLM probe against the stand-in over real HTTP on loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from spark_watchdog.lab.hardware.vllm_standin import VllmStandin
from spark_watchdog.lab.ports import free_port
from spark_watchdog.probes.vllm import (
    Canary,
    ProgressTracker,
    VllmScraper,
    VllmStatus,
    rank_process_alive,
)

pytestmark = pytest.mark.integration

STALL_AFTER = 1.0
MAX_BODY = 8 * 1024 * 1024


@pytest.fixture
def standin() -> Iterator[VllmStandin]:
    with VllmStandin(step_rate=40.0, drip_interval=0.2) as server:
        yield server


def watch(url: str, seconds: float, timeout: float = 1.0) -> VllmStatus:
    """Scrape every 0.25 s until ``seconds`` have passed; the last verdict."""
    scraper = VllmScraper(url, timeout, MAX_BODY)
    tracker = ProgressTracker(STALL_AFTER)
    start = time.monotonic()
    while True:
        sample = scraper.scrape()
        status = tracker.update(sample, sample.observed_at)
        if sample.observed_at - start >= seconds:
            return status
        time.sleep(0.25)


def test_progressing(standin: VllmStandin) -> None:
    scraper = VllmScraper(standin.url, 1.0, MAX_BODY)
    first = scraper.scrape()
    time.sleep(0.3)
    second = scraper.scrape()
    tracker = ProgressTracker(STALL_AFTER)
    tracker.update(first, first.observed_at)
    status = tracker.update(second, second.observed_at)

    assert second.reachable, second.error
    assert second.health_status == 200
    assert second.models == ("standin-model",)
    assert status.state == "progressing"
    assert status.running is not None and status.running > 0
    assert first.engines["0"].engine_steps is not None
    assert status.engine_steps is not None
    assert status.engine_steps > first.engines["0"].engine_steps


def test_wedged_engine_is_stalled_while_health_says_200(standin: VllmStandin) -> None:
    standin.set_mode("wedged")

    status = watch(standin.url, STALL_AFTER)

    assert status.state == "stalled"
    assert status.health_status == 200
    assert status.running is not None and status.running > 0
    assert status.seconds_without_progress is not None
    assert status.seconds_without_progress >= STALL_AFTER


def test_idle(standin: VllmStandin) -> None:
    standin.set_mode("idle")

    status = watch(standin.url, STALL_AFTER)

    assert status.state == "idle"
    assert status.running == 0


def test_health_503_is_dead(standin: VllmStandin) -> None:
    standin.set_mode("dead")

    sample = VllmScraper(standin.url, 1.0, MAX_BODY).scrape()
    status = ProgressTracker(STALL_AFTER).update(sample, sample.observed_at)

    assert sample.health_status == 503
    assert status.state == "dead"


def test_dropped_connection_is_unreachable(standin: VllmStandin) -> None:
    standin.set_mode("drop")

    sample = VllmScraper(standin.url, 1.0, MAX_BODY).scrape()
    status = ProgressTracker(STALL_AFTER).update(sample, sample.observed_at)

    assert status.state == "unreachable"
    assert sample.error is not None
    assert "closed the connection without answering" in sample.error


def test_slow_drip_is_cut_at_the_deadline(standin: VllmStandin) -> None:
    standin.set_mode("slow")  # 5 bytes a second: a full answer would take a minute
    timeout = 1.0

    started = time.monotonic()
    sample = VllmScraper(standin.url, timeout, MAX_BODY).scrape()
    elapsed = time.monotonic() - started

    assert not sample.reachable
    assert sample.error is not None
    assert "no complete answer" in sample.error
    assert elapsed < timeout + 1.0  # generous: the point is "not a minute"
    assert ProgressTracker(STALL_AFTER).update(sample, 0.0).state == "unreachable"


def test_nothing_listening_is_unreachable() -> None:
    sample = VllmScraper(f"http://127.0.0.1:{free_port()}", 1.0, MAX_BODY).scrape()

    assert not sample.reachable
    assert sample.health_status is None
    assert sample.error is not None
    assert "connection refused" in sample.error


def test_body_cut_short_is_unreachable() -> None:
    # /health answers; /metrics promises 1000 bytes, sends a valid-looking
    # beginning, and closes: a truncated body must not pass as a smaller one.
    partial = b'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
    answers = [
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n" + partial,
    ]
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def serve() -> None:
            for answer in answers:
                connection, _ = listener.accept()
                with connection:
                    connection.recv(65536)
                    connection.sendall(answer)

        server = threading.Thread(target=serve, daemon=True)
        server.start()
        port = listener.getsockname()[1]
        sample = VllmScraper(f"http://127.0.0.1:{port}", 2.0, MAX_BODY).scrape()
        server.join(timeout=5)

    assert sample.health_status == 200
    assert not sample.reachable
    assert sample.error is not None
    assert f"mid-answer after {len(partial)} body bytes" in sample.error


class _Redirector:
    """Answers every request with a 302 to ``target``; ``elsewhere`` is another
    listener that counts the connections it gets (a redirect followed)."""

    def __init__(self, status: int = 302) -> None:
        self.elsewhere = socket.socket()
        self.elsewhere.bind(("127.0.0.1", 0))
        self.elsewhere.listen()
        self.elsewhere.settimeout(0.5)
        self.target = f"http://127.0.0.1:{self.elsewhere.getsockname()[1]}/health"
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.listener.settimeout(0.5)
        self.status = status
        self.requests: list[bytes] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._done.is_set():
            try:
                connection, _ = self.listener.accept()
            except TimeoutError:
                continue
            with connection:
                self.requests.append(connection.recv(65536))
                connection.sendall(
                    f"HTTP/1.1 {self.status} Moved\r\nLocation: {self.target}\r\n"
                    "Content-Length: 0\r\nConnection: close\r\n\r\n".encode()
                )

    def followed(self) -> bool:
        try:
            connection, _ = self.elsewhere.accept()
        except TimeoutError:
            return False
        connection.close()
        return True

    def close(self) -> None:
        self._done.set()
        self._thread.join(5)
        self.listener.close()
        self.elsewhere.close()


@pytest.fixture
def redirector() -> Iterator[_Redirector]:
    server = _Redirector()
    yield server
    server.close()


def test_a_redirect_to_another_host_is_not_followed(redirector: _Redirector) -> None:
    sample = VllmScraper(redirector.url, 1.0, MAX_BODY).scrape()
    status = ProgressTracker(STALL_AFTER).update(sample, sample.observed_at)

    assert not redirector.followed()
    assert len(redirector.requests) == 1
    assert not sample.reachable
    assert sample.health_status is None
    assert sample.error == (
        f"GET /health: {redirector.url}/health answered HTTP 302 (a redirect to "
        f"{redirector.target}); redirects are not followed: give the URL vLLM itself "
        "serves on (probes.vllm.url)"
    )
    assert status.state == "unreachable"


def test_a_redirect_on_the_same_host_is_not_followed_either(standin: VllmStandin) -> None:
    # /_standin/redirect/health answers 302 -> /health on the stand-in itself.
    sample = VllmScraper(f"{standin.url}/_standin/redirect", 1.0, MAX_BODY).scrape()

    assert not sample.reachable
    assert sample.error is not None
    assert f"answered HTTP 302 (a redirect to {standin.url}/health)" in sample.error


def test_the_canary_does_not_follow_a_redirect(redirector: _Redirector) -> None:
    result = Canary(redirector.url, "m", 1.0).run()

    assert not redirector.followed()
    assert result.outcome == "error"
    assert result.error is not None
    assert f"answered HTTP 302 (a redirect to {redirector.target})" in result.error
    assert redirector.requests[0].startswith(b"POST /v1/completions ")


def test_not_a_vllm_path_is_unreachable(standin: VllmStandin) -> None:
    sample = VllmScraper(f"{standin.url}/elsewhere", 1.0, MAX_BODY).scrape()
    status = ProgressTracker(STALL_AFTER).update(sample, sample.observed_at)

    assert sample.health_status == 404
    assert status.state == "unreachable"
    assert "HTTP 404" in status.reason


def test_body_over_the_limit_is_refused(standin: VllmStandin) -> None:
    sample = VllmScraper(standin.url, 1.0, max_body_bytes=1024).scrape()

    assert not sample.reachable
    assert sample.error is not None
    assert "1024" in sample.error


def test_old_metric_names() -> None:
    with VllmStandin(old_names=True, step_rate=40.0) as old:
        status = watch(old.url, 0.3)

    assert status.state == "progressing"
    assert list(status.engines) == ["0"]
    assert status.engines["0"].kv_cache_usage is not None


def test_restart_resets_counters_without_a_stall(standin: VllmStandin) -> None:
    scraper = VllmScraper(standin.url, 1.0, MAX_BODY)
    tracker = ProgressTracker(STALL_AFTER)
    time.sleep(0.3)
    before = scraper.scrape()
    tracker.update(before, before.observed_at)
    standin.set_mode("restart")
    after = scraper.scrape()
    status = tracker.update(after, after.observed_at)

    assert before.engines["0"].engine_steps is not None
    assert after.engines["0"].engine_steps is not None
    assert after.engines["0"].engine_steps < before.engines["0"].engine_steps
    assert status.state in ("progressing", "idle")


def test_one_wedged_engine_of_two() -> None:
    with VllmStandin(engines=2, step_rate=40.0) as server:
        server.set_mode("wedged", engine=1)
        status = watch(server.url, STALL_AFTER)

    assert status.state == "stalled"
    assert status.engines["0"].state == "progressing"
    assert status.engines["1"].state == "stalled"


def test_canary_answers_while_progressing(standin: VllmStandin) -> None:
    result = Canary(standin.url, None, timeout=2.0).run()

    assert result.outcome == "ok", result.error
    assert result.model == "standin-model"  # asked /v1/models for it


def test_canary_uses_the_model_seen_in_metrics(standin: VllmStandin) -> None:
    result = Canary(standin.url, None, timeout=2.0).run(known_models=("standin-model",))

    assert result.ok, result.error


def test_canary_times_out_when_wedged(standin: VllmStandin) -> None:
    standin.set_mode("wedged")
    timeout = 0.5

    result = Canary(standin.url, "standin-model", timeout=timeout).run()

    assert result.outcome == "timeout"
    assert result.latency < timeout + 1.0


def test_canary_reports_an_unknown_model(standin: VllmStandin) -> None:
    result = Canary(standin.url, "no-such-model", timeout=2.0).run()

    assert result.outcome == "error"
    assert result.error is not None
    assert "no-such-model" in result.error


def test_canary_refused_is_an_error_not_a_timeout() -> None:
    result = Canary(f"http://127.0.0.1:{free_port()}", "m", timeout=1.0).run()

    assert result.outcome == "error"


@pytest.fixture
def keyed_standin() -> Iterator[VllmStandin]:
    """A server started with vLLM's --api-key: its /v1 routes want the key."""
    with VllmStandin(step_rate=40.0, api_key="k3y-of-the-server") as server:
        yield server


def test_canary_sends_the_servers_api_key(keyed_standin: VllmStandin) -> None:
    result = Canary(keyed_standin.url, None, timeout=2.0, api_key="k3y-of-the-server").run()

    assert result.outcome == "ok", result.error


def test_canary_without_the_key_names_the_setting(keyed_standin: VllmStandin) -> None:
    asked_models = Canary(keyed_standin.url, None, timeout=2.0).run()
    named_model = Canary(keyed_standin.url, "standin-model", timeout=2.0).run()

    for result in (asked_models, named_model):
        assert result.outcome == "error"
        assert result.error is not None
        assert "401" in result.error and "api_key_file" in result.error
    # /health and /metrics need no key: the probe itself still reads the server.
    assert VllmScraper(keyed_standin.url, 1.0, MAX_BODY).scrape().health_status == 200


def test_canary_with_a_wrong_key_says_it_was_refused(keyed_standin: VllmStandin) -> None:
    canary = Canary(keyed_standin.url, "standin-model", timeout=2.0, api_key="not-the-key")

    result = canary.run()

    assert result.outcome == "error"
    assert result.error is not None and "refused the API key" in result.error
    assert "not-the-key" not in result.error and "not-the-key" not in repr(canary)


def test_answered_canary_feeds_the_tracker(standin: VllmStandin) -> None:
    standin.set_mode("idle")
    scraper = VllmScraper(standin.url, 1.0, MAX_BODY)
    before = scraper.scrape()

    result = Canary(standin.url, None, timeout=2.0).run(before.models)

    after = scraper.scrape()
    # Like vLLM, the canary's own step moves the counters.
    assert after.engines["0"].engine_steps == (before.engines["0"].engine_steps or 0) + 1
    tracker = ProgressTracker(STALL_AFTER)
    tracker.note_canary(result, result.finished_at)
    assert tracker.update(after, after.observed_at).canary == result


def post_mode(url: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{url}/_standin/mode",
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_control_endpoint_switches_modes(standin: VllmStandin) -> None:
    status, body = post_mode(standin.url, {"mode": "dead"})
    assert status == 200
    assert body["mode"] == "dead"
    assert standin.mode == "dead"

    # The control endpoint works while faults are on, so the lab can heal.
    standin.set_mode("drop")
    status, body = post_mode(standin.url, {"mode": "progressing"})
    assert status == 200
    assert standin.mode == "progressing"


def test_control_endpoint_rejects_a_bad_mode(standin: VllmStandin) -> None:
    status, body = post_mode(standin.url, {"mode": "melted"})

    assert status == 400
    assert "melted" in body["error"]


def test_rank_process_alive_finds_a_real_process() -> None:
    marker = f"standin-rank-{uuid.uuid4().hex}"
    child = subprocess.Popen(
        [sys.executable, "-c", "import time, sys; time.sleep(30)", marker],
    )
    try:
        assert rank_process_alive(marker)
    finally:
        child.kill()
        child.wait()
    assert not rank_process_alive(marker)


class FakeProcess:
    def __init__(self, pid: int, cmdline: list[str] | None, status: str = "sleeping") -> None:
        self.info: dict[str, Any] = {"pid": pid, "cmdline": cmdline, "status": status}


def test_rank_process_alive_skips_zombies_and_unreadable() -> None:
    processes = [
        FakeProcess(10, None),  # access denied: psutil leaves cmdline None
        FakeProcess(11, ["vllm", "serve", "--node-rank", "1"], status="zombie"),
    ]
    assert not rank_process_alive("--node-rank 1", proc_iter=lambda attrs: processes)

    processes.append(FakeProcess(12, ["vllm", "serve", "--node-rank", "1", "--headless"]))
    assert rank_process_alive("--node-rank 1", proc_iter=lambda attrs: processes)
