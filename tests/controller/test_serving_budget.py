"""The serving restart budget as a part of its own (controller/serving/serving_budget.py),
built from only what it works with: the config, a clock, a real history, a
notifier that keeps what it was told."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record.ledger import Ledger
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.controller.serving.serving_budget import PROMISE_S, ServingBudget
from spark_watchdog.history.store import HistoryStore


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_800_000_000.0 + self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


class Told:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def send(self, event: Event) -> None:
        self.events.append(event)


def _budget(tmp_path: Path, *, dry_run: bool = False) -> tuple[ServingBudget, Clock, Told]:
    config = parse_controller_config(
        {
            "nodes": [{"name": "spark-1", "agent": "http://127.0.0.1:9", "ssh_host": "h"}],
            "guards": {"dry_run": dry_run},
            "history": str(tmp_path / "history.db"),
        },
        "test",
    )
    clock, told = Clock(), Told()

    async def inline(fn: Any) -> Any:
        return fn()

    ledger = Ledger(HistoryStore(config.history), cast(Notifier, told), inline)
    budget = ServingBudget(config, cast(Any, clock), ledger, cast(Notifier, told))
    return budget, clock, told


def test_a_promise_counts_at_once_is_taken_by_its_record_and_lapses_alone(
    tmp_path: Path,
) -> None:
    budget, clock, _ = _budget(tmp_path)
    assert asyncio.run(budget.count_in_window()) == 0
    budget.promise()
    assert asyncio.run(budget.count_in_window()) == 1
    budget.recorded(41)  # the promised restart is in the history now: still one
    assert asyncio.run(budget.count_in_window()) == 1
    budget.promise()
    clock.now += PROMISE_S  # a ladder that restarted nothing
    assert asyncio.run(budget.count_in_window()) == 1


def test_in_dry_run_nothing_is_promised(tmp_path: Path) -> None:
    budget, _, _ = _budget(tmp_path, dry_run=True)
    budget.promise()
    assert asyncio.run(budget.count_in_window()) == 0


def test_a_spent_budget_alerts_once_and_blocks_for_a_quarter_of_its_window(
    tmp_path: Path,
) -> None:
    budget, clock, told = _budget(tmp_path)
    watch = NodeWatch(budget.config.nodes[0], clock.now)
    budget.refuse(watch, "6 automatic serving restarts in 3600 s (budget 6)")
    assert [e.kind for e in told.events] == ["serving_budget_spent"]
    assert budget.blocked(clock.now + 899.0)
    assert not budget.blocked(clock.now + 900.0)
