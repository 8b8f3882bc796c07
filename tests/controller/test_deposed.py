"""A deposed leader of a pair says nothing about nodes (controller/pair/fence.py):
its notifier lets only the leadership events out, and a write its lease
refuses is not a history problem to alert about."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from spark_watchdog.config.controller import NotifyConfig, WebhookConfig
from spark_watchdog.controller.record.ledger import HistoryUnwritable, Ledger, NotLeading
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.errors import NotLeader, StoreError


class Receiver:
    def __init__(self) -> None:
        self.kinds: list[str] = []
        received = self.kinds

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                received.append(json.loads(body)["kind"])
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.server.shutdown()


def _notifier(receiver: Receiver, deposed: dict[str, bool]) -> Notifier:
    config = NotifyConfig(webhooks=(WebhookConfig(url=receiver.url),), attempts=1, timeout=5.0)
    return Notifier(config, quiet=lambda: deposed["now"])


def test_a_deposed_notifier_lets_only_the_leadership_events_out(receiver: Receiver) -> None:
    deposed = {"now": False}

    async def say() -> None:
        notifier = _notifier(receiver, deposed)
        notifier.send(Event("held", "spark-2 held: before", "spark-2"))
        deposed["now"] = True
        notifier.send(Event("history_unwritable", "the leadership moved"))
        notifier.send(Event("held", "spark-2 held: after", "spark-2"))
        notifier.send(Event("leadership_lost", "this controller stopped leading"))
        await notifier.drain()

    asyncio.run(say())
    assert sorted(receiver.kinds) == ["held", "leadership_lost"]


class RefusingStore:
    """A store whose every write raises what it is given."""

    def __init__(self, error: StoreError) -> None:
        self.error = error

    def add_step(self) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("error", "raised", "alert"),
    [
        (NotLeader("history", "the leadership moved to b at epoch 2"), NotLeading, []),
        (StoreError("history", "disk full"), HistoryUnwritable, ["history_unwritable"]),
    ],
)
def test_a_refused_write_is_not_a_history_problem(
    receiver: Receiver, error: StoreError, raised: type[Exception], alert: list[str]
) -> None:
    async def write() -> tuple[type[Exception], str | None]:
        notifier = _notifier(receiver, {"now": False})
        store = RefusingStore(error)
        ledger = Ledger(store, notifier)  # type: ignore[arg-type]
        try:
            await ledger.write(store.add_step)
        except HistoryUnwritable as exc:
            caught: type[Exception] = type(exc)
        await notifier.drain()
        return caught, ledger.problem

    caught, problem = asyncio.run(write())
    assert caught is raised
    assert receiver.kinds == alert
    assert (problem is None) == (raised is NotLeading)
