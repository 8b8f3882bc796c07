"""The page's actions and reads, without a server: each action runs on the
controller's own event loop, handed over from the server's thread; a step
down reaches the pair's lease; a loop that is gone or busy is a 503; a
standby serves the page but neither its data nor its actions."""

from __future__ import annotations

import asyncio
import email.message
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.config.controller import ControllerConfig, parse_controller_config
from spark_watchdog.config.secrets import Secret
from spark_watchdog.controller.page.page_actions import Unavailable, run_on_loop
from spark_watchdog.controller.page.page_api import PageRoutes
from spark_watchdog.controller.page.page_auth import PageAuth
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.http.server import Request

TOKEN = "unit-page-token"


class _Ledger:
    def __init__(self, store: HistoryStore) -> None:
        self.store = store
        self.threads: list[str] = []

    async def write(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        self.threads.append(threading.current_thread().name)
        return fn(*args, **kwargs)


class _Clock:
    def monotonic(self) -> float:
        return time.monotonic()


class _Serving:
    profile: str | None = None


class _Holds:
    def breaker_open(self) -> bool:
        return False


class _Source:
    def __init__(self, config: ControllerConfig, store: HistoryStore) -> None:
        self.config = config
        self.ledger = _Ledger(store)
        self.watches: dict[str, Any] = {n.name: object() for n in config.nodes}
        self.clock = _Clock()
        self.serving = _Serving()
        self.holds = _Holds()


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    running = asyncio.new_event_loop()
    # Handed over once it runs: an action on a loop not running yet is a 503.
    ready = threading.Event()
    running.call_soon(ready.set)
    thread = threading.Thread(target=running.run_forever, name="controller-loop", daemon=True)
    thread.start()
    assert ready.wait(30), "the loop did not start"
    yield running
    running.call_soon_threadsafe(running.stop)
    thread.join(10)
    running.close()


@pytest.fixture
def source(tmp_path: Path) -> Iterator[_Source]:
    config = parse_controller_config(
        {
            "nodes": [{"name": "spark-1", "agent": "http://127.0.0.1:9", "ssh_host": "127.0.0.1"}],
            "history": str(tmp_path / "history.db"),
        },
        "test",
    )
    store = HistoryStore(config.history)
    yield _Source(config, store)
    store.close()


def _post(path: str, body: dict[str, Any]) -> Request:
    headers = email.message.Message()
    headers["Authorization"] = f"Bearer {TOKEN}"
    headers["Host"] = "127.0.0.1:9721"
    return Request("POST", path, "", headers, body)


def _get(path: str, query: str = "") -> Request:
    return Request("GET", path, query, email.message.Message())


def _routes(source: Any, loop: asyncio.AbstractEventLoop | None, **kwargs: Any) -> PageRoutes:
    return PageRoutes(source, PageAuth(Secret(TOKEN, "test")), lambda: loop, **kwargs)


def _body(reply: tuple[int, str, bytes, dict[str, str]]) -> tuple[int, dict[str, Any]]:
    return reply[0], json.loads(reply[2])


def test_a_hold_is_written_on_the_controller_s_loop(
    source: _Source, loop: asyncio.AbstractEventLoop
) -> None:
    routes = _routes(source, loop)
    status, body = _body(
        routes.answer(_post("/v1/actions/hold", {"node": "spark-1", "reason": "x"}))
    )
    assert status == 200 and body["hold"]["node"] == "spark-1"
    assert source.ledger.threads == ["controller-loop"]


def test_a_step_down_ends_the_lease_from_the_loop(
    source: _Source, loop: asyncio.AbstractEventLoop
) -> None:
    ran_on: list[str] = []

    async def step_down() -> dict[str, Any] | None:
        ran_on.append(threading.current_thread().name)
        return {"holder": "mgmt-1:1:ab", "epoch": 4}

    routes = _routes(source, loop, step_down=step_down)
    status, body = _body(routes.answer(_post("/v1/actions/step-down", {})))
    assert (status, body) == (200, {"ended": {"holder": "mgmt-1:1:ab", "epoch": 4}})
    assert ran_on == ["controller-loop"]


def test_no_loop_no_action(source: _Source) -> None:
    routes = _routes(source, None)
    status, body = _body(
        routes.answer(_post("/v1/actions/hold", {"node": "spark-1", "reason": "x"}))
    )
    assert status == 503 and "not running" in body["error"]
    assert source.ledger.store.active_holds() == []
    status, body = _body(routes.answer(_get("/v1/nodes")))
    assert status == 503


def test_a_busy_loop_is_a_503_that_says_the_write_may_still_land(
    loop: asyncio.AbstractEventLoop,
) -> None:
    async def slow() -> None:
        await asyncio.sleep(5)

    with pytest.raises(Unavailable) as busy:
        run_on_loop(lambda: loop, slow, timeout=0.2)
    assert "may still complete" in str(busy.value)


def test_a_standby_serves_the_page_but_not_its_data(loop: asyncio.AbstractEventLoop) -> None:
    routes = _routes(None, loop)
    assert routes.answer(_get("/"))[0] == 200
    for request in (
        _get("/v1/nodes"),
        _get("/v1/incidents"),
        _get("/v1/incidents/1"),
        _post("/v1/actions/hold", {"node": "spark-1", "reason": "x"}),
    ):
        status, body = _body(routes.answer(request))
        assert status == 503 and "stands by" in body["error"], request.path


def test_a_step_down_the_history_refuses_is_a_503(
    source: _Source, loop: asyncio.AbstractEventLoop
) -> None:
    from spark_watchdog.errors import StoreError

    async def step_down() -> dict[str, Any] | None:
        raise StoreError("postgresql://db/history", "connection refused")

    routes = _routes(source, loop, step_down=step_down)
    status, body = _body(routes.answer(_post("/v1/actions/step-down", {})))
    assert status == 503 and "history cannot be written" in body["error"]
