"""The wedged-but-alive ladder built from only what it works with
(controller/act/wedged.py, controller/act/gentle_tools.py): a real history and real
holds; the power actions (its guards and the forced reboot over SSH) and
serving as small fakes; a clock that only moves when the ladder waits."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from part_fakes import StepClock, Told, inline

from spark_watchdog.config.controller import SshDevice, parse_controller_config
from spark_watchdog.controller.act import wedged
from spark_watchdog.controller.act.gentle_tools import GentleTools
from spark_watchdog.controller.act.holds import Holds
from spark_watchdog.controller.decide.node_states import NodeEvent, NodeState
from spark_watchdog.controller.decide.planner import Action, Guards
from spark_watchdog.controller.io import RebootAttempt
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record import incident_log
from spark_watchdog.controller.record.ledger import Ledger
from spark_watchdog.controller.record.notify import Notifier
from spark_watchdog.history.store import HistoryStore

WEDGED = {"probes": {"gpu": {"state": "timeout"}}}
ANSWERS = {"probes": {"gpu": {"state": "ok"}}}


class Power:
    """The guards (nothing held, budgets free) and the forced reboot: the node
    comes back with a new boot and a GPU that answers."""

    def __init__(self, watch: NodeWatch, not_mine: str | None = None) -> None:
        self.watch = watch
        self.reboots: list[str] = []
        self.not_mine = not_mine  # another controller on the Sparks acts for it

    async def guards(self, watch: NodeWatch, action: Action = Action.CYCLE) -> Guards:
        return Guards(not_mine=self.not_mine)

    async def forced_reboot(self, device: SshDevice) -> RebootAttempt:
        self.reboots.append(device.forced_command)
        self.watch.boot_id = "boot-2"
        self.watch.snapshot = dict(ANSWERS)
        return RebootAttempt(True, "the session dropped as the host went down")


class Serving:
    def __init__(self, watch: NodeWatch, *, clears: bool) -> None:
        self.watch = watch
        self.clears = clears
        self.kinds: list[str] = []

    async def restart_after(self, incident_id: int | None, reason: str, *, kind: str) -> bool:
        self.kinds.append(kind)
        if self.clears:
            self.watch.snapshot = dict(ANSWERS)
        return True


async def _unwedge(
    tmp_path: Path, *, clears: bool, with_serving: bool, not_mine: str | None = None
) -> tuple[str, NodeWatch, Power, Serving, HistoryStore, int]:
    key, hosts = tmp_path / "key", tmp_path / "known_hosts"
    key.write_text("k\n")
    key.chmod(0o600)
    hosts.write_text("h\n")
    ssh = {
        "type": "ssh",
        "host": "127.0.0.1",
        "user": "watchdog",
        "key_file": str(key),
        "known_hosts_file": str(hosts),
    }
    config = parse_controller_config(
        {
            "nodes": [{"name": "spark-2", "agent": "http://127.0.0.1:9", "power": [ssh]}],
            "history": str(tmp_path / "history.db"),
        },
        "test",
    )
    clock, told, store = StepClock(), Told(), HistoryStore(config.history)

    ledger = Ledger(store, cast(Notifier, told), inline)
    watch = NodeWatch(config.nodes[0], clock.now)
    watch.boot_id, watch.snapshot = "boot-1", dict(WEDGED)
    holds = Holds(config, ledger, cast(Notifier, told), cast(Any, clock), {watch.name: watch})
    power, serving = Power(watch, not_mine), Serving(watch, clears=clears)
    incident = await incident_log.open_incident(ledger, wedged.KIND, [watch.name], evidence={})
    watch.apply(NodeEvent.WEDGED_CONFIRMED, incident=incident.id)
    tools = GentleTools(
        config,
        cast(Any, clock),
        ledger,
        cast(Notifier, told),
        holds,
        cast(Any, power),
        cast(Any, serving),
    )
    outcome = await wedged.unwedge(tools, watch, incident.id, with_serving=with_serving)
    return outcome, watch, power, serving, store, incident.id


def test_a_gpu_that_answers_after_the_serving_restart_is_never_rebooted(tmp_path: Path) -> None:
    outcome, _, power, serving, store, incident_id = asyncio.run(
        _unwedge(tmp_path, clears=True, with_serving=True)
    )
    assert outcome == "recovered"
    assert serving.kinds == ["gpu_wedged"] and power.reboots == []
    timeline = store.incident(incident_id)
    assert timeline is not None and timeline.incident.resolution == "recovered"


def test_past_the_serving_budget_the_ladder_starts_at_its_forced_reboot(tmp_path: Path) -> None:
    outcome, watch, power, serving, store, incident_id = asyncio.run(
        _unwedge(tmp_path, clears=False, with_serving=False)
    )
    assert outcome == "recovered"
    assert len(power.reboots) == 1
    assert serving.kinds == ["forced_reboot"]  # serving again once the node is back
    steps = [s.step for s in store.steps(incident_id)]
    assert steps.index("reboot_requested") < steps.index("reboot_sent")
    assert "new_boot_seen" in steps and watch.state is not NodeState.HELD


def test_a_node_another_controller_acts_for_is_handed_over_not_held(tmp_path: Path) -> None:
    outcome, watch, power, _, store, incident_id = asyncio.run(
        _unwedge(tmp_path, clears=False, with_serving=False, not_mine="its own host")
    )
    assert outcome == "gave_up" and power.reboots == []
    assert watch.state is not NodeState.HELD and store.active_holds() == []
    timeline = store.incident(incident_id)
    assert timeline is not None and timeline.incident.resolution == "gave_up"
    assert any("handed over" in str(s.detail) for s in timeline.steps)
