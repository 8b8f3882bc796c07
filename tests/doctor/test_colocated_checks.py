"""Doctor asks every controller on the Sparks for its /v1/status: real HTTP servers on
loopback answer as controllers would, with the order, node and listening crafted."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from spark_watchdog.config.controller import ControllerConfig, parse_controller_config
from spark_watchdog.doctor.colocated_checks import check_controller
from spark_watchdog.doctor.plan import controller_plan
from spark_watchdog.doctor.report import render_json, render_text
from spark_watchdog.doctor.result import DoctorReport
from spark_watchdog.doctor.runner import run_plan
from spark_watchdog.lab.ports import free_port

pytestmark = pytest.mark.integration

ORDER = ["spark-1", "spark-2"]
# A server's answer: a JSON body, raw bytes, or a number of seconds to stay silent.
Reply = dict[str, Any] | bytes | float


def status(node: str, order: list[str] | None = None, observing: bool = False) -> dict[str, Any]:
    """A controller's /v1/status, as much of it as the others read."""
    return {
        "ticks": 42,
        "started_at": 1700000000.0,
        "colocated": {
            "node": node,
            "order": ORDER if order is None else order,
            "claims": [],
            "observing": observing,
            "peers": {},
        },
    }


def _handler(reply: Reply) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if isinstance(reply, float):
                time.sleep(reply)
                return
            if self.path != "/v1/status":
                self.send_error(404)
                return
            body = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler


@pytest.fixture
def controller() -> Iterator[Callable[[Reply], str]]:
    """``controller(reply)``: the URL of a server that answers /v1/status with ``reply``."""
    servers: list[ThreadingHTTPServer] = []

    def start(reply: Reply) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(reply))
        server.daemon_threads = True
        servers.append(server)
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def _nobody() -> str:
    return f"http://127.0.0.1:{free_port()}"


def _config(urls: dict[str, list[str]], colocated: bool = True) -> ControllerConfig:
    raw: dict[str, Any] = {
        "nodes": [
            {"name": name, "agent": f"http://127.0.0.{i}:9720"}
            for i, name in enumerate(ORDER, start=1)
        ],
        "listen": {"address": "0.0.0.0", "port": free_port()},
    }
    if colocated:
        raw["colocated"] = {
            "controllers": [{"node": name, "urls": urls[name]} for name in ORDER],
            "takeover_after": 30,
            "fence_delay": 20,
        }
    return parse_controller_config(raw)


def _check(config: ControllerConfig, node: str, timeout: float = 2.0) -> Any:
    assert config.colocated is not None
    (placed,) = [p for p in config.colocated.controllers if p.node == node]
    return asyncio.run(check_controller(config, placed, timeout=timeout))


def test_controllers_of_the_same_order_done_listening_pass(
    controller: Callable[[Reply], str],
) -> None:
    first = [controller(status("spark-1")), controller(status("spark-1"))]
    config = _config({"spark-1": first, "spark-2": [controller(status("spark-2"))]})

    one, two = _check(config, "spark-1"), _check(config, "spark-2")

    assert one.status == "ok", one
    assert "place 1 of 2" in one.detail and all(url in one.detail for url in first)
    assert two.status == "ok" and "place 2 of 2" in two.detail, two


def test_an_order_that_differs_is_named_with_both_orders_and_the_node(
    controller: Callable[[Reply], str],
) -> None:
    swapped = controller(status("spark-2", order=["spark-2", "spark-1"]))
    config = _config({"spark-1": [controller(status("spark-1"))], "spark-2": [swapped]})

    found = _check(config, "spark-2")

    assert found.status == "fail"
    assert "the controller on spark-2" in found.detail
    assert "has the order spark-2, spark-1" in found.detail
    assert "this config's is spark-1, spark-2" in found.detail
    assert found.fix is not None and "copy this controller.yaml" in found.fix


def test_a_controller_that_says_it_runs_on_another_node_fails(
    controller: Callable[[Reply], str],
) -> None:
    # spark-2's URL reaches spark-1's controller (a URL copied from the other line).
    wrong = controller(status("spark-1"))
    config = _config({"spark-1": [controller(status("spark-1"))], "spark-2": [wrong]})

    found = _check(config, "spark-2")

    assert found.status == "fail"
    assert f'{wrong} answers as the controller on "spark-1", not on spark-2' in found.detail
    assert found.fix is not None and "--node spark-2" in found.fix


def test_a_controller_still_listening_is_a_warning(controller: Callable[[Reply], str]) -> None:
    config = _config(
        {
            "spark-1": [controller(status("spark-1", observing=True))],
            "spark-2": [controller(status("spark-2"))],
        }
    )

    found = _check(config, "spark-1")

    assert found.status == "warn"
    assert "still listening" in found.detail and "30 s" in found.detail


def test_a_controller_reached_on_no_url_fails_and_one_path_down_warns(
    controller: Callable[[Reply], str],
) -> None:
    down = _nobody()
    config = _config({"spark-1": [_nobody()], "spark-2": [controller(status("spark-2")), down]})

    gone, half = _check(config, "spark-1"), _check(config, "spark-2")

    assert gone.status == "fail"
    assert "no answer from the controller on spark-1" in gone.detail
    assert gone.fix is not None and "spark-watchdog-controller" in gone.fix
    assert half.status == "warn"
    assert "does not answer on every path" in half.detail
    assert f"GET {down}/v1/status" in half.detail


def test_a_silent_controller_is_given_up_on_in_bounded_time(
    controller: Callable[[Reply], str],
) -> None:
    config = _config({"spark-1": [controller(5.0)], "spark-2": [controller(status("spark-2"))]})

    started = time.monotonic()
    found = _check(config, "spark-1", timeout=0.5)

    assert time.monotonic() - started < 2.0
    assert found.status == "fail" and "no answer within 0.5s" in found.detail


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        ({"ticks": 1, "colocated": None}, "runs without colocated:"),
        (b"<html>not json</html>", "not as a controller: answer is not JSON"),
        ({"colocated": {"node": "spark-1", "order": "spark-1"}}, "not a list of node names"),
        ([1, 2], "not with a status document"),
    ],
)
def test_an_answer_that_says_nothing_of_the_order_fails(
    controller: Callable[[Reply], str], reply: Any, said: str
) -> None:
    url = controller(reply)
    config = _config({"spark-1": [url], "spark-2": [controller(status("spark-2"))]})

    found = _check(config, "spark-1")

    assert found.status == "fail"
    assert f"{url} answers, but" in found.detail and said in found.detail
    assert "no answer from" not in found.detail


def test_what_a_controller_says_is_shown_escaped(controller: Callable[[Reply], str]) -> None:
    forged = "spark-9\x1b[2J\r\nOK   everything"
    evil = controller(status(forged, order=["spark-1", "\u202espark-2"]))
    config = _config({"spark-1": [controller(status("spark-1"))], "spark-2": [evil]})

    found = _check(config, "spark-2")

    assert found.status == "fail"
    assert "\x1b" not in found.detail and "\r" not in found.detail and "\n" not in found.detail
    assert "\u202e" not in found.detail
    assert "spark-9\\x1b[2J\\r\\nOK" in found.detail


def test_the_plan_asks_every_controller_of_the_order(controller: Callable[[Reply], str]) -> None:
    swapped = controller(status("spark-2", order=["spark-2", "spark-1"]))
    config = _config({"spark-1": [controller(status("spark-1"))], "spark-2": [swapped]})
    plan = [p for p in controller_plan(config) if p.name.startswith("controller.colocated.")]
    assert [p.name for p in plan] == [f"controller.colocated.{n}" for n in ORDER]
    assert all(p.timeout <= 10 for p in plan)

    report = DoctorReport(tuple(asyncio.run(run_plan(plan))))

    assert [c.status for c in report.checks] == ["ok", "fail"]
    text = render_text(report)
    assert "FAIL  controller.colocated.spark-2" in text and "fix: copy" in text
    checks = json.loads(render_json(report))["checks"]
    assert checks[1]["name"] == "controller.colocated.spark-2"
    assert "has the order spark-2, spark-1" in checks[1]["detail"]


def test_a_controller_of_its_own_host_has_no_order_to_check() -> None:
    config = _config({}, colocated=False)
    assert not [p for p in controller_plan(config) if p.name.startswith("controller.colocated")]
