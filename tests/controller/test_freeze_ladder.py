"""The freeze ladder built from only what it works with (controller/act/recovery.py,
controller/act/rung.py): a real history and real holds, the look, the power path
and serving as small fakes, a clock that only moves when the ladder waits."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from part_fakes import StepClock, Told, inline

from spark_watchdog.config.controller import ControllerConfig, parse_controller_config
from spark_watchdog.controller.act.holds import Holds
from spark_watchdog.controller.act.power_actions import RungPath, freeze_rungs
from spark_watchdog.controller.act.recovery import FreezeLadder, FreezeTools, RungOutcome
from spark_watchdog.controller.decide.node_states import NodeEvent, NodeState
from spark_watchdog.controller.decide.planner import Block, Blocked
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record import incident_log
from spark_watchdog.controller.record.ledger import Ledger
from spark_watchdog.controller.record.notify import Notifier
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.power.base import PowerState


@dataclass
class Look:
    """The monitor's last look before a cut, and the boots after one."""

    frozen: bool = True

    async def still_frozen(self, watch: NodeWatch) -> tuple[bool, str]:
        return self.frozen, "silent" if self.frozen else "the agent answered"

    async def boots(self, watch: NodeWatch) -> list[dict[str, Any]]:
        return []


@dataclass
class Outlet:
    """One power path: its state, the cycles sent, and a node that boots after one."""

    watch: NodeWatch
    state: PowerState = PowerState.ON
    cycles: list[float] = field(default_factory=list)
    name: str = "pdu outlet 1"
    asked: list[tuple[str, int]] = field(default_factory=list)  # (power path, rung) asked for
    counted: list[int] = field(default_factory=list)  # the actions counted against the budgets

    @property
    def backend(self) -> Outlet:
        return self

    async def aclose(self) -> None:
        pass

    async def power_state(self) -> PowerState:
        return self.state

    async def cycle(self, off_seconds: float, *, timed: bool) -> Any:
        self.cycles.append(off_seconds)
        self.watch.boot_id = "boot-2"  # the node comes back with a new boot
        self.watch.snapshot = {"boot_id": "boot-2"}

        @dataclass
        class Cycled:
            off_held_s: float | None = off_seconds

        return Cycled()


class Budgets:
    """The cycles a rung counts against the budgets once it is recorded."""

    def __init__(self, counted: list[int]) -> None:
        self.counted = counted

    def note_cycle(self, node: str, action_id: int) -> None:
        self.counted.append(action_id)


class PowerPathFake:
    """What the ladder asks of the power actions: the rungs, the slot, the lock, the
    path, the guard."""

    def __init__(self, outlet: Outlet, rungs: dict[str, tuple[RungPath, ...]]) -> None:
        self.rungs = rungs
        self.slot = asyncio.Semaphore(1)
        self.budget_lock = asyncio.Lock()
        self.outlet = outlet
        self.budgets = Budgets(outlet.counted)

    def power_for(self, path: RungPath, rung: int, watch: NodeWatch, incident_id: int) -> Any:
        self.outlet.asked.append((path.path.key_path, rung))
        outlet = self.outlet

        class Power:
            name = outlet.name
            backend = outlet

            async def state(self) -> PowerState:
                return await outlet.power_state()

            async def cycle(self, off_seconds: float, *, timed: bool) -> Any:
                return await outlet.cycle(off_seconds, timed=timed)

        return Power()

    # Why another controller on the Sparks acts for the node (None: this one does).
    not_mine: str | None = None

    async def rung_blocked(self, watch: NodeWatch) -> Blocked | None:
        return None if self.not_mine is None else Blocked(Block.NOT_MINE, self.not_mine)


class Serving:
    def __init__(self) -> None:
        self.restarts: list[int | None] = []

    async def restart_after(self, incident_id: int | None, reason: str) -> bool:
        self.restarts.append(incident_id)
        return True


def _config(tmp_path: Path) -> ControllerConfig:
    community = tmp_path / "community"
    community.write_text("private\n")
    community.chmod(0o600)
    return parse_controller_config(
        {
            "nodes": [
                {
                    "name": "spark-3",
                    "agent": "http://127.0.0.1:9",
                    "ssh_host": "127.0.0.1",
                    "power": [
                        {
                            "type": "snmp",
                            "host": "127.0.0.1",
                            "outlet": 1,
                            "vendor": "apc_rpdu2",
                            "community_file": str(community),
                        }
                    ],
                }
            ],
            "history": str(tmp_path / "history.db"),
        },
        "test",
    )


async def _run(
    tmp_path: Path, look: Look, not_mine: str | None = None
) -> tuple[RungOutcome, NodeWatch, Any, Told, Serving]:
    config, clock, told, serving = _config(tmp_path), StepClock(), Told(), Serving()
    store = HistoryStore(config.history)

    ledger = Ledger(store, cast(Notifier, told), inline)
    watch = NodeWatch(config.nodes[0], clock.monotonic())
    watch.boot_id = "boot-1"
    watches = {watch.name: watch}
    holds = Holds(config, ledger, cast(Notifier, told), clock, watches)
    outlet = Outlet(watch)
    incident = await incident_log.open_incident(ledger, "host_frozen", [watch.name], evidence={})
    watch.conduct.incident_opened(incident.id)
    watch.apply(NodeEvent.FROZEN_CONFIRMED)
    power = PowerPathFake(outlet, freeze_rungs(config))
    power.not_mine = not_mine
    tools = FreezeTools(
        config,
        clock,
        ledger,
        cast(Notifier, told),
        cast(Any, look),
        holds,
        cast(Any, power),
        cast(Any, serving),
    )
    outcome = await FreezeLadder(tools, watch, incident.id).run()
    return outcome, watch, (store, incident.id, outlet), told, serving


def test_a_host_that_answers_at_the_last_look_is_a_false_alarm_and_nothing_is_sent(
    tmp_path: Path,
) -> None:
    outcome, watch, (store, incident_id, outlet), told, serving = asyncio.run(
        _run(tmp_path, Look(frozen=False))
    )
    assert outcome is RungOutcome.FALSE_ALARM
    assert outlet.cycles == []
    assert watch.state is NodeState.WATCHING and watch.conduct.incident_id is None
    assert store.incident(incident_id).incident.resolution == "false_alarm"
    assert told.kinds == ["false_alarm"]
    assert serving.restarts == []


def test_a_frozen_host_is_cycled_once_recorded_first_and_recovered_by_its_new_boot(
    tmp_path: Path,
) -> None:
    outcome, watch, (store, incident_id, outlet), told, serving = asyncio.run(
        _run(tmp_path, Look(frozen=True))
    )
    assert outcome is RungOutcome.RECOVERED
    assert len(outlet.cycles) == 1
    assert outlet.asked == [("nodes[0].power[0]", 0)]  # the node's first rung, by the plan
    assert outlet.counted == [a.id for a in store.actions(node=watch.name, limit=None)] != []
    steps = [s.step for s in store.steps(incident_id)]
    assert steps.index("rung_started") < steps.index("new_boot_seen")
    assert store.incident(incident_id).incident.resolution == "recovered"
    assert serving.restarts == [incident_id]
    assert watch.conduct.incident_id is None and watch.conduct.rungs_done == frozenset()
    assert told.kinds == ["power_restored", "recovered"]


def test_a_rung_that_finds_the_node_another_controllers_sends_nothing_and_holds_nothing(
    tmp_path: Path,
) -> None:
    """Right before its off, a controller on a Spark hears that another one acts
    for the node now: it hands the node over, its incident closed, nothing held."""
    why = "the controller on spark-1 is recovering it (heard 1s ago)"
    outcome, watch, (store, incident_id, outlet), told, serving = asyncio.run(
        _run(tmp_path, Look(frozen=True), not_mine=why)
    )
    assert outcome is RungOutcome.FALSE_ALARM
    assert outlet.cycles == [] and outlet.counted == []
    assert watch.state is NodeState.WATCHING and watch.conduct.incident_id is None
    resolved = store.incident(incident_id).incident
    assert resolved.resolution == "gave_up"
    assert store.active_holds() == []
    assert told.kinds == [] and serving.restarts == []
