"""A serving restart judges the config the head really runs: a config that is not
the profile's and not known to be as safe fails it (``profile_mismatch``); one that
differs but captures no CUDA graphs at all (vLLM's CPU build) succeeds, with a note."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from spark_watchdog.controller.serving_restart import ServingNode, ServingRestart

pytestmark = pytest.mark.integration


class ServingHead:
    """A head agent on loopback: every start is taken, /v1/state shows a
    progressing vLLM and the given ``serving`` block."""

    def __init__(self) -> None:
        self.serving: dict[str, Any] = {}
        self.stop_answer: dict[str, Any] = {}
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
                if self.path == "/v1/serving":  # the preflight: serving on, the profile known
                    self._send({"enabled": True, "profiles": ["plain", "safe"], **head.serving})
                    return
                self._send({"probes": {"vllm": {"state": "progressing"}}, "serving": head.serving})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._send(head.stop_answer if self.path.endswith("/stop") else {})

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def head() -> Iterator[ServingHead]:
    agent = ServingHead()
    yield agent
    agent.server.shutdown()
    agent.server.server_close()


def _restart(head: ServingHead, serving: dict[str, Any]) -> Any:
    head.serving = serving
    restart = ServingRestart(ServingNode("spark-1", head.base), [], "token", timeout=10.0)
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
