"""A serving restart judges the config the head really runs: a config that is not
the profile's and not known to be as safe fails it (``profile_mismatch``); one that
differs but captures no CUDA graphs at all (vLLM's CPU build) succeeds, with a note."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from spark_watchdog.controller.serving.serving_restart import ServingNode, ServingRestart

pytestmark = pytest.mark.integration


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="milliseconds")


class ServingHead:
    """A head agent on loopback: every start is taken and starts a new rank
    (``started_at``), /v1/state shows a progressing vLLM and the given
    ``serving`` block, read after the rank started; for ``old_reports`` reads
    after a start it still shows the rank from before the stop, as an agent
    does until its probe reads again."""

    def __init__(self) -> None:
        self.serving: dict[str, Any] = {}
        self.old_serving: dict[str, Any] = {}
        self.stop_answer: dict[str, Any] = {}
        self.rank_started = self.previous_started = time.time() - 3600.0
        self.old_reports = 0
        head = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                rank = {"started_at": _iso(head.rank_started)}
                if self.path == "/v1/serving":  # the preflight: serving on, the profile known
                    self._send({"enabled": True, "profiles": ["plain", "safe"], **rank})
                    return
                if head.old_reports > 0:
                    head.old_reports -= 1
                    observed, serving = head.previous_started + 60.0, head.old_serving
                    rank = {"started_at": _iso(head.previous_started)}
                else:
                    observed, serving = time.time(), head.serving
                vllm = {"state": "progressing", "observed_at": _iso(observed)}
                self._send({"probes": {"vllm": vllm}, "serving": {**serving, **rank}})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.endswith("/start"):
                    head.previous_started, head.rank_started = head.rank_started, time.time()
                self._send(head.stop_answer if self.path.endswith("/stop") else {})

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"


class VirtualClock:
    """Sleeps advance a virtual monotonic time at once: the restart's waits cost nothing."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


@pytest.fixture
def head() -> Iterator[ServingHead]:
    agent = ServingHead()
    yield agent
    agent.server.shutdown()
    agent.server.server_close()


def _restart(head: ServingHead, serving: dict[str, Any]) -> Any:
    head.serving = serving
    restart = ServingRestart(
        ServingNode("spark-1", head.base), [], "token", timeout=10.0, clock=VirtualClock()
    )
    return asyncio.run(restart.run("safe"))


def _serving(mode: str, matches: bool | None, safe: bool | str | None) -> dict[str, Any]:
    block: dict[str, Any] = {
        "state": "running",
        "requested": {"cudagraph_mode": "FULL_DECODE_ONLY", "enable_adaptive_verification": None},
        "effective": {"cudagraph_mode": mode, "enable_adaptive_verification": None},
        "effective_matches_profile": matches,
    }
    if safe != "absent":
        block["effective_safe"] = safe
    return block


def test_a_graph_mode_other_than_asked_fails_the_restart(head: ServingHead) -> None:
    report = _restart(head, _serving("FULL_AND_PIECEWISE", False, False))
    assert report.result == "profile_mismatch"
    assert "spark-1" in (report.error or "")


def test_a_build_without_cuda_graphs_succeeds_with_a_note(head: ServingHead) -> None:
    report = _restart(head, _serving("NONE", False, True))
    assert report.result == "succeeded", report.error
    assert report.note is not None
    assert "differs from profile safe but is as safe" in report.note
    assert "cudagraph_mode NONE" in report.note


def test_an_agent_that_predates_the_safety_field_is_judged_by_the_values_it_read(
    head: ServingHead,
) -> None:
    assert _restart(head, _serving("FULL_AND_PIECEWISE", False, "absent")).result == (
        "profile_mismatch"
    )
    assert _restart(head, _serving("NONE", False, "absent")).result == "succeeded"
    assert _restart(head, _serving("FULL_DECODE_ONLY", True, "absent")).result == "succeeded"


@pytest.mark.parametrize(
    ("mode", "matches", "safe"),
    [
        # The agent's verdict is not taken on trust: the values decide.
        ("FULL_AND_PIECEWISE", False, True),
        ("FULL_AND_PIECEWISE", False, None),
        ("FULL_AND_PIECEWISE", True, True),
        # Anything but a plain yes from the agent is a no.
        ("FULL_DECODE_ONLY", True, "false"),
        ("FULL_DECODE_ONLY", True, False),
    ],
)
def test_a_verdict_that_the_values_do_not_bear_out_fails_the_restart(
    head: ServingHead, mode: str, matches: bool, safe: bool | str | None
) -> None:
    assert _restart(head, _serving(mode, matches, safe)).result == "profile_mismatch"


def test_a_difference_the_agent_reports_without_the_values_fails_the_restart(
    head: ServingHead,
) -> None:
    serving = _serving("NONE", False, None)
    serving["effective"] = {"cudagraph_mode": None, "enable_adaptive_verification": None}
    assert _restart(head, serving).result == "profile_mismatch"


def test_a_confirmed_profile_succeeds_without_a_note(head: ServingHead) -> None:
    report = _restart(head, _serving("FULL_DECODE_ONLY", True, True))
    assert (report.result, report.note) == ("succeeded", None)


def test_the_stacks_each_agent_took_before_its_stop_come_back_in_the_report(
    head: ServingHead,
) -> None:
    taken = {"at": "2026-12-01T00:00:00Z", "tool": "py-spy", "processes": [], "duration_s": 0.1}
    head.stop_answer = {"state": "stopped", "stacks": taken}
    report = _restart(head, _serving("FULL_DECODE_ONLY", True, True))
    assert report.result == "succeeded" and report.stacks == {"spark-1": taken}
    head.stop_answer = {"state": "stopped", "stacks": None}  # an agent that took none
    assert _restart(head, _serving("FULL_DECODE_ONLY", True, True)).stacks == {}


def test_the_old_ranks_last_report_does_not_make_the_restart_succeed(head: ServingHead) -> None:
    # The agent still holds the old rank's report (progressing, nothing shown)
    # for a few reads after the start; the new rank runs a less safe config.
    head.old_reports = 3
    report = _restart(head, _serving("FULL_AND_PIECEWISE", False, False))
    assert report.result == "profile_mismatch", report
    assert report.effective["spark-1"]["effective"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"


def test_a_new_rank_that_never_reports_times_out_and_says_so(head: ServingHead) -> None:
    head.old_reports = 10_000
    report = _restart(head, _serving("FULL_DECODE_ONLY", True, True))
    assert report.result == "timed_out"
    assert "still shows the rank from before the restart" in (report.error or "")


def test_a_profile_the_engine_never_showed_succeeds_saying_it_is_not_confirmed(
    head: ServingHead,
) -> None:
    serving = _serving("FULL_DECODE_ONLY", None, None)
    serving["effective"] = {"cudagraph_mode": None, "enable_adaptive_verification": None}
    report = _restart(head, serving)
    assert report.result == "succeeded", report.error
    assert "the profile is not confirmed" in (report.note or "")


def test_a_new_rank_started_after_the_agent_s_clock_stepped_back_is_the_new_one() -> None:
    """A host just power-cycled: its clock synced backwards between the old
    rank's start and the new one's. Another start time is another rank."""
    from spark_watchdog.controller.serving.serving_restart import not_the_new_rank

    before = 1_800_000_000.0

    def state(started: float, observed: float) -> dict[str, Any]:
        def iso(unix: float) -> str:
            return datetime.fromtimestamp(unix, timezone.utc).isoformat()

        return {
            "serving": {"started_at": iso(started)},
            "probes": {"vllm": {"observed_at": iso(observed)}},
        }

    assert not_the_new_rank(state(before - 30.0, before - 29.0), before) is None
    assert "from before the restart" in (not_the_new_rank(state(before, before + 5), before) or "")
    assert "since its new rank started" in (
        not_the_new_rank(state(before + 10, before + 5), before) or ""
    )
