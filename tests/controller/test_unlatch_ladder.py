"""The clock-latch ladder built from only what it works with
(controller/act/unlatch.py, controller/act/gentle_tools.py): a real history and real
holds; the power actions (its guards and the halt over SSH) as a small fake
whose halted host falls silent, then boots again after its long cut; a clock
that only moves when the ladder waits."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from spark_watchdog.config.controller import SshDevice, parse_controller_config
from spark_watchdog.controller.act import unlatch
from spark_watchdog.controller.act.gentle_tools import GentleTools
from spark_watchdog.controller.act.holds import Holds
from spark_watchdog.controller.act.power_actions import RungPath, freeze_rungs
from spark_watchdog.controller.decide.node_states import NodeEvent, NodeState
from spark_watchdog.controller.decide.planner import Action, Guards
from spark_watchdog.controller.io import RebootAttempt
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record import incident_log
from spark_watchdog.controller.record.ledger import Ledger
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.history.store import HistoryStore


class Host:
    """The node: answering until halted, silent while halted, booting again
    once the power path has had it off (here: 300 s of the clock after the halt)."""

    def __init__(self, watch: NodeWatch, clock: Clock) -> None:
        self.watch, self.clock = watch, clock
        self.halted_at: float | None = None

    def tick(self) -> None:
        watch, now = self.watch, self.clock.now
        if self.halted_at is None:
            watch.agent_answer_at = now  # alive: it answers
        elif now - self.halted_at > 300.0:
            watch.boot_id, watch.snapshot = "boot-2", {"boot_id": "boot-2"}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.host: Host | None = None

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_800_000_000.0 + self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.01)
        if self.host is not None:
            self.host.tick()
        await asyncio.sleep(0)


class Told:
    def __init__(self) -> None:
        self.kinds: list[str] = []

    def send(self, event: Event) -> None:
        self.kinds.append(event.kind)


class Power:
    def __init__(self, host: Host, *, held: bool, rungs: dict[str, tuple[RungPath, ...]]) -> None:
        self.host, self.held, self.rungs = host, held, rungs
        self.halts: list[str] = []
        self.not_mine: str | None = None  # another controller on the Sparks acts for it

    async def guards(self, watch: NodeWatch, action: Action = Action.CYCLE) -> Guards:
        assert action is Action.LONG_CUT
        held = "by a person" if self.held else None
        return Guards(node_held=self.held, hold_reason=held, not_mine=self.not_mine)

    async def halt(self, device: SshDevice) -> RebootAttempt:
        self.halts.append(device.host)
        self.host.halted_at = self.host.clock.now
        self.host.watch.agent_answer_at = None
        return RebootAttempt(True, "the session dropped as the host went down")


async def _unlatch(
    tmp_path: Path, *, held: bool, not_mine: str | None = None
) -> tuple[str, NodeWatch, Power, Told, Any]:
    key, hosts, community = tmp_path / "key", tmp_path / "known_hosts", tmp_path / "community"
    for path in (key, hosts, community):
        path.write_text("x\n")
        path.chmod(0o600)
    config = parse_controller_config(
        {
            "nodes": [
                {
                    "name": "spark-2",
                    "agent": "http://127.0.0.1:9",
                    "power": [
                        {
                            "type": "ssh",
                            "host": "127.0.0.1",
                            "user": "watchdog",
                            "key_file": str(key),
                            "known_hosts_file": str(hosts),
                        },
                        {
                            "type": "snmp",
                            "host": "127.0.0.1",
                            "outlet": 1,
                            "vendor": "apc_rpdu2",
                            "community_file": str(community),
                        },
                    ],
                }
            ],
            "policy": {"clock_latch_off_seconds": 240.0},
            "history": str(tmp_path / "history.db"),
        },
        "test",
    )
    clock, told, store = Clock(), Told(), HistoryStore(config.history)

    async def inline(fn: Any) -> Any:
        return fn()

    ledger = Ledger(store, cast(Notifier, told), inline)
    watch = NodeWatch(config.nodes[0], clock.now)
    watch.boot_id, watch.agent_answer_at = "boot-1", clock.now
    host = clock.host = Host(watch, clock)
    holds = Holds(config, ledger, cast(Notifier, told), cast(Any, clock), {watch.name: watch})
    power = Power(host, held=held, rungs=freeze_rungs(config))
    power.not_mine = not_mine
    incident = await incident_log.open_incident(ledger, unlatch.KIND, [watch.name], evidence={})
    watch.apply(NodeEvent.LATCH_CONFIRMED, incident=incident.id)
    serving: Any = None  # the clock-latch ladder restarts no serving itself
    tools = GentleTools(
        config, cast(Any, clock), ledger, cast(Notifier, told), holds, cast(Any, power), serving
    )
    outcome = await unlatch.unlatch(tools, watch, incident.id)
    return outcome, watch, power, told, (store, incident.id)


def test_a_latched_node_is_halted_handed_over_for_its_long_cut_and_recovered_by_its_boot(
    tmp_path: Path,
) -> None:
    outcome, watch, power, told, (store, incident_id) = asyncio.run(_unlatch(tmp_path, held=False))
    assert outcome == "recovered"
    assert power.halts == ["127.0.0.1"]
    steps = [s.step for s in store.steps(incident_id)]
    assert steps.index("halt_requested") < steps.index("halt_sent")
    assert steps.index("halt_sent") < steps.index("handed_to_power_path")
    assert watch.off_seconds_override == 240.0  # the power path's next cut is the long one
    assert watch.state is NodeState.WATCHING and told.kinds == ["clock_latch_halted"]


def test_a_held_node_is_not_halted_and_the_latch_is_alerted(tmp_path: Path) -> None:
    outcome, _, power, told, _ = asyncio.run(_unlatch(tmp_path, held=True))
    assert outcome == "gave_up"
    assert power.halts == []
    assert told.kinds == ["clock_latch_not_cleared"]


def test_a_node_another_controller_acts_for_is_not_halted_and_not_alerted(tmp_path: Path) -> None:
    """Its latch is the other controller's to answer: no halt, no second alert."""
    why = "the controller on spark-1 acts for it (heard 1s ago)"
    outcome, watch, power, told, _ = asyncio.run(_unlatch(tmp_path, held=False, not_mine=why))
    assert outcome == "gave_up"
    assert power.halts == [] and told.kinds == []
    assert watch.state is not NodeState.HELD
