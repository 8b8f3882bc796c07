"""What a controller on a Spark hears of the others (controller/look/controller_peers.py):
bad answers are silence, a loop that stood still is silence, a gap in its own loop
starts a listening spell; and one real controller's /v1/status read over HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.config.controller import (
    ControllerConfig,
    ControllerListenConfig,
    parse_controller_config,
)
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.io import ControllerIO, ask_controller
from spark_watchdog.controller.look.controller_peers import BadAnswer, ControllerPeers, read_answer
from spark_watchdog.controller.look.http_client import HttpAnswer, HttpError
from spark_watchdog.controller.page.status_api import StatusEndpoint
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.ports import free_port

ORDER = ["spark-1", "spark-2"]


def _config(tmp_path: Path, urls: dict[str, str] | None = None) -> ControllerConfig:
    urls = urls or {}
    return parse_controller_config(
        {
            "nodes": [
                {"name": n, "agent": f"http://10.9.0.{i}:9720"} for i, n in enumerate(ORDER, 1)
            ],
            "listen": {"address": "0.0.0.0", "port": 9721},
            "history": str(tmp_path / "history.db"),
            "colocated": {
                "controllers": [
                    {"node": n, **({"urls": [urls[n]]} if n in urls else {})} for n in ORDER
                ],
            },
        },
        "test",
    )


class _Clock:
    """The controller's clock, standing still (the sweeps are given their times)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_800_000_000.0 + self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


def _answer(body: Any, status: int = 200) -> HttpAnswer:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return HttpAnswer(status, raw)


def _status(node: str = "spark-2", ticks: int = 5, **colocated: Any) -> dict[str, Any]:
    return {
        "started_at": 1.0,
        "ticks": ticks,
        "colocated": {"node": node, "order": ORDER, "claims": [], "holds": [], **colocated},
    }


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (_answer(_status(), status=503), "status 503"),
        (_answer(b"<html>"), "not JSON"),
        (_answer([1, 2]), "not a JSON object"),
        (_answer({"ticks": 3}), "no colocated section"),
        (_answer({**_status(), "ticks": True}), "no ticks"),
        (_answer(_status(node="spark-9\x1b[2J")), "spark-9\\x1b[2J"),
        (_answer(_status(order="spark-1")), "not lists"),
        (_answer(_status(holds=None)), "not lists"),
        (_answer(_status(claims=["spark-1", 7])), "not lists of node names"),
        (_answer(_status(holds=[""])), "not lists of node names"),
        (_answer(_status(claims=["x"] * 5000)), "not lists of node names"),
    ],
)
def test_an_answer_that_is_not_the_expected_controller_is_silence(
    answer: HttpAnswer, said: str
) -> None:
    with pytest.raises(BadAnswer, match=None) as caught:
        read_answer(answer, "spark-2")
    assert said in str(caught.value)
    assert "\x1b" not in str(caught.value)


def _peers(tmp_path: Path, answers: list[Any]) -> ControllerPeers:
    async def get(url: str, timeout: float) -> HttpAnswer:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return _answer(answer)

    return ControllerPeers(_config(tmp_path), "spark-1", get, _Clock())


def test_a_controller_is_heard_only_while_its_loop_moves_on(tmp_path: Path) -> None:
    peers = _peers(tmp_path, [_status(ticks=1), _status(ticks=1), _status(ticks=2)])
    asyncio.run(peers.sweep(1.0))
    assert peers.heard["spark-2"].heard_at == 1.0
    asyncio.run(peers.sweep(2.0))  # the same ticks: a live HTTP thread, a loop that stood still
    assert peers.heard["spark-2"].heard_at == 1.0
    assert "not moved on" in peers.detail["spark-2"]
    asyncio.run(peers.sweep(3.0))
    assert peers.heard["spark-2"].heard_at == 3.0


def test_claims_holds_and_order_are_kept_from_the_answer(tmp_path: Path) -> None:
    peers = _peers(tmp_path, [_status(claims=["spark-1"], holds=["*"])])
    asyncio.run(peers.sweep(1.0))
    assert peers.heard["spark-2"].claims == {"spark-1"}
    assert peers.heard["spark-2"].holds == {"*"}
    assert peers.heard["spark-2"].order == tuple(ORDER)


def test_a_failed_ask_keeps_the_last_hearing_and_says_why(tmp_path: Path) -> None:
    peers = _peers(tmp_path, [_status(ticks=1), HttpError("connection refused")])
    asyncio.run(peers.sweep(1.0))
    asyncio.run(peers.sweep(2.0))
    assert peers.heard["spark-2"].heard_at == 1.0
    assert "connection refused" in peers.detail["spark-2"]


def test_a_gap_in_its_own_loop_starts_a_listening_spell(tmp_path: Path) -> None:
    peers = _peers(tmp_path, [_status(ticks=t) for t in range(1, 5)])
    takeover = 30.0
    asyncio.run(peers.sweep(takeover + 1))  # past the start's listening spell
    assert not peers.standing(takeover + 1).now < peers.observing_until
    asyncio.run(peers.sweep(takeover + 2))
    asyncio.run(peers.sweep(takeover + 2 + takeover / 2))  # paused for half of takeover_after
    assert peers.observing_until == takeover + 2 + takeover / 2 + takeover
    why = peers.refusal_for("spark-2", None, takeover + 3 + takeover / 2)
    assert why is not None and "listening" in why


def test_a_controller_never_acts_for_its_own_host_whatever_it_hears(tmp_path: Path) -> None:
    peers = _peers(tmp_path, [])
    why = peers.refusal_for("spark-1", None, 10_000.0)
    assert why is not None and "its own host" in why


def test_one_controller_reads_another_real_controllers_status_over_http(tmp_path: Path) -> None:
    """The second controller's /v1/status from its real endpoint, by the production
    request: its place, its order and what it claims, and its loop moving on."""
    port = free_port()
    config = _config(tmp_path, {"spark-2": f"http://127.0.0.1:{port}"})
    store = HistoryStore(str(tmp_path / "second.db"))
    second = Controller(
        dataclasses.replace(config, history=str(tmp_path / "second.db")),
        store,
        io=ControllerIO.production(config),
        node="spark-2",
    )
    listen = ControllerListenConfig(address="127.0.0.1", port=port)
    endpoint = StatusEndpoint(listen.address, listen.port, second)
    peers = ControllerPeers(config, "spark-1", ask_controller, _Clock())

    async def scenario() -> None:
        second.published = second.status_json()
        await peers.sweep(1.0)
        second.ticks += 1
        second.published = second.status_json()
        await peers.sweep(2.0)

    endpoint.start()
    try:
        asyncio.run(scenario())
    finally:
        endpoint.stop()
        store.close()
    heard = peers.heard["spark-2"]
    assert heard.heard_at == 2.0, peers.detail
    assert heard.order == tuple(ORDER)
    assert heard.claims == frozenset()
    placed = second.status_json()["colocated"]
    assert placed["node"] == "spark-2"
    # Listening after its start: it acts for nothing yet, never for its own host.
    assert placed["acts_for"] == [] and placed["observing"] is True


def test_a_controller_heard_with_another_order_is_told_once_while_it_lasts(
    tmp_path: Path,
) -> None:
    told: list[str] = []
    other = _status(ticks=1, order=["spark-2", "spark-1"])
    answers = [other, {**other, "ticks": 2}, _status(ticks=3), {**other, "ticks": 4}]

    async def get(url: str, timeout: float) -> HttpAnswer:
        return _answer(answers.pop(0))

    # Started long before: past its first listening spell.
    peers = ControllerPeers(_config(tmp_path), "spark-1", get, _Clock(-100.0), told.append)
    for at in (1.0, 2.0):
        asyncio.run(peers.sweep(at))
    assert len(told) == 1 and "spark-2, spark-1" in told[0] and "spark-1, spark-2" in told[0]
    why = peers.refusal_for("spark-2", None, 2.5)
    assert why is not None and "configs agree" in why
    asyncio.run(peers.sweep(3.0))  # it agrees again
    asyncio.run(peers.sweep(4.0))  # and disagrees again: told again
    assert len(told) == 2


def test_every_url_of_a_controller_is_asked_at_once(tmp_path: Path) -> None:
    """A frozen host's paths each take the whole timeout: asked one after the
    other they would make the sweep late. The management URL here answers only
    once the fabric one has been asked: one after the other, it never would."""
    config = _config(tmp_path)
    controllers = [
        {"node": "spark-1"},
        {"node": "spark-2", "urls": ["http://10.9.0.2:9721", "http://192.168.100.2:9721"]},
    ]
    data = {
        "nodes": [{"name": n, "agent": f"http://10.9.0.{i}:9720"} for i, n in enumerate(ORDER, 1)],
        "listen": {"address": "0.0.0.0", "port": 9721},
        "history": config.history,
        "colocated": {"controllers": controllers},
    }
    config = parse_controller_config(data, "test")
    fabric_asked = asyncio.Event()

    async def get(url: str, timeout: float) -> HttpAnswer:
        if "192.168.100.2" in url:
            fabric_asked.set()
            raise HttpError("timed out")
        await fabric_asked.wait()
        return _answer(_status(ticks=1))

    peers = ControllerPeers(config, "spark-1", get, _Clock())
    asyncio.run(asyncio.wait_for(peers.sweep(1.0), 5.0))
    assert peers.heard["spark-2"].heard_at == 1.0
