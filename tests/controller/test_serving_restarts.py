"""The serving restarts as a part of their own (controller/serving/serving_policy.py),
built from only what they work with: the config, the I/O seams (a clock, a
serving runner that keeps what it was asked), a real history, a notifier that
keeps what it was told, the node watches and the flight recorder."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from part_fakes import StepClock, Told, inline

from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.controller.decide.node_states import NodeEvent
from spark_watchdog.controller.io import ControllerIO
from spark_watchdog.controller.look.flight_recorder import FlightRecorder
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.pair.fence import LONE
from spark_watchdog.controller.record.ledger import Ledger
from spark_watchdog.controller.record.notify import Notifier
from spark_watchdog.controller.serving.serving_policy import PROFILE_SETTING, ServingRestarts
from spark_watchdog.controller.serving.serving_restart import ServingRestartReport
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.steps import StepName


class Runner:
    """The serving seam: every restart it was asked for, each one succeeding."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, list[str], str]] = []

    async def __call__(
        self, head: Any, workers: list[Any], token: str, timeout: float, profile: str, heard: Any
    ) -> ServingRestartReport:
        self.asked.append((head.name, [w.name for w in workers], profile))
        return ServingRestartReport(profile, result="succeeded", step_durations={"start": 1.0})


def _serving(tmp_path: Path) -> tuple[ServingRestarts, dict[str, NodeWatch], Runner, Told]:
    token = tmp_path / "token"
    token.write_text("s3cret-token-value\n")
    token.chmod(0o600)
    nodes = [{"name": f"spark-{i}", "agent": f"http://127.0.0.1:{9000 + i}"} for i in (1, 2, 3)]
    config = parse_controller_config(
        {
            "nodes": nodes,
            "serving": {"head": "spark-1", "token_file": str(token)},
            "history": str(tmp_path / "history.db"),
        },
        "test",
    )
    clock, told, runner = StepClock(), Told(), Runner()
    io = cast(ControllerIO, SimpleNamespace(clock=clock, fence=LONE, serving=runner))
    ledger = Ledger(HistoryStore(config.history), cast(Notifier, told), inline)
    watches = {n.name: NodeWatch(n, clock.now) for n in config.nodes}
    serving = ServingRestarts(
        config, io, ledger, cast(Notifier, told), watches, FlightRecorder(60.0)
    )
    return serving, watches, runner, told


def _incident(serving: ServingRestarts, node: str) -> int:
    store = serving.ledger.store
    return store.open_incident("host_frozen", [node], evidence={}).id


def test_a_recoverys_restart_waits_while_another_node_is_still_being_recovered(
    tmp_path: Path,
) -> None:
    serving, watches, runner, _ = _serving(tmp_path)
    incident = _incident(serving, "spark-2")
    watches["spark-3"].apply(NodeEvent.FROZEN_CONFIRMED)  # its own rung runs

    assert asyncio.run(serving.restart_after(incident, "spark-2 recovered")) is True

    assert runner.asked == []  # spark-3's recovery ends with the restart
    steps = serving.ledger.store.steps(incident)
    deferred = [s for s in steps if s.step == StepName.SERVING_RESTART_DEFERRED.value]
    assert [s.detail for s in deferred] == [{"waiting_for": ["spark-3"]}]
    safe = serving.config.serving.safe_profile
    setting = serving.ledger.store.setting(PROFILE_SETTING)
    assert setting is not None and setting.value == safe  # the safe profile is in force


def test_the_last_recovery_restarts_serving_on_every_node(tmp_path: Path) -> None:
    serving, _, runner, told = _serving(tmp_path)
    incident = _incident(serving, "spark-2")

    assert asyncio.run(serving.restart_after(incident, "spark-2 recovered")) is True

    safe = serving.config.serving.safe_profile
    assert runner.asked == [("spark-1", ["spark-2", "spark-3"], safe)]
    names = [s.step for s in serving.ledger.store.steps(incident)]
    assert StepName.SERVING_RESTART_STARTED.value in names
    assert StepName.SERVING_RESTART_DONE.value in names
    assert told.kinds[-1] == "serving_restarted"
