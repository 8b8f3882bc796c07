"""A controller on a Spark whose host was power-cycled picks up its own open
incident from its history, and finds the node recovered by another controller
meanwhile: it closes the incident and sends nothing. The case *X is down* of
docs/design.md, "Why one recovery per freeze".

The story: order [spark-1, spark-2], spark-3 runs an agent only. spark-1's
controller was recovering a frozen spark-3 when its own host froze;
spark-2's controller cycled spark-1 and, once spark-1's controller had been
silent for takeover_after, recovered spark-3 too. spark-1's controller starts
again with its incident for spark-3 open at whatever step it reached, and
spark-3's agent answers with a new boot id. The whole controller runs (its
loop, its resume, its ladders) on fakes of its seams: every agent answers,
every outlet reads on and keeps any command it is sent, the serving runner
keeps what it is asked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.config.controller import ControllerConfig, NodeConfig, parse_controller_config
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.io import ControllerIO
from spark_watchdog.controller.look.http_client import SILENCE, HttpAnswer, HttpError
from spark_watchdog.controller.look.witness import WitnessReport
from spark_watchdog.controller.serving.serving_restart import ServingRestartReport
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.power.base import PowerState, PowerTiming, SendGate, StepHook, VerifiedPower
from spark_watchdog.power.paths import PowerPath
from spark_watchdog.power.send_window import SendWindow
from spark_watchdog.power.ssh_banner import BannerResult
from spark_watchdog.steps import StepName

FROZEN_BOOT, NEW_BOOT = "b" * 32, "c" * 32
# Real seconds the controller may take to settle the incident (it polls every 0.1 s).
SETTLE_S = 20.0


def _secret(path: Path, value: str) -> str:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return str(path)


def _config(tmp_path: Path) -> ControllerConfig:
    community = _secret(tmp_path / "community", "private")
    nodes = [
        {
            "name": f"spark-{i}",
            "agent": f"http://10.0.0.{i}:9720",
            "ssh_host": f"10.0.0.{i}",
            "power": [
                {
                    "type": "snmp",
                    "host": "10.0.0.100",
                    "outlet": i,
                    "vendor": "apc_rpdu2",
                    "community_file": community,
                }
            ],
        }
        for i in (1, 2, 3)
    ]
    return parse_controller_config(
        {
            "nodes": nodes,
            "detection": {"poll_interval": 0.1, "agent_timeout": 0.2},
            "serving": {"head": "spark-1", "token_file": _secret(tmp_path / "token", "t0ken")},
            "listen": {"address": "0.0.0.0", "port": 9721},
            "colocated": {"controllers": [{"node": "spark-1"}, {"node": "spark-2"}]},
            "history": str(tmp_path / "history.db"),
        },
        "test",
    )


class Agents:
    """Every node's agent answers; spark-3's with the boot after its cycle (or,
    ``dark``, not at all: its outlet is off)."""

    def __init__(self, dark: bool = False) -> None:
        self.seq = 0
        self.dark = dark

    async def get(self, node: NodeConfig, path: str, timeout: float) -> HttpAnswer:
        if self.dark and node.name == "spark-3":
            raise HttpError("timed out", kind=SILENCE)
        if path == "/v1/boots":
            return HttpAnswer(200, b'{"boots": []}')
        self.seq += 1
        now = datetime.now(timezone.utc).isoformat()
        body = {
            "seq": self.seq,
            "boot_id": NEW_BOOT if node.name == "spark-3" else f"boot-of-{node.name}",
            "started_at": "agent-1",
            "observed_at": now,
            "probes": {
                "vllm": {"state": "progressing", "observed_at": now},
                "gpu": {"state": "ok"},
            },
        }
        return HttpAnswer(200, json.dumps(body).encode())


class Outlet:
    """An outlet that reads on (or ``off``) and keeps every command it is sent."""

    def __init__(self, node: str, sent: list[tuple[str, str]], off: bool = False) -> None:
        self.node, self.sent, self.off = node, sent, off

    @property
    def name(self) -> str:
        return f"outlet of {self.node}"

    @property
    def limiter_key(self) -> str:
        return "pdu"

    async def read_state(self) -> PowerState:
        return PowerState.OFF if self.off else PowerState.ON

    async def command(self, target: PowerState) -> None:
        self.sent.append((self.node, target.value))

    async def aclose(self) -> None:
        pass


def _io(
    config: ControllerConfig,
    sent: list[tuple[str, str]],
    served: list[str],
    claims: Sequence[str] = (),
) -> ControllerIO:
    """``claims``: what spark-2's controller is recovering now (its off on spark-3
    in force: spark-3 dark, its outlet off)."""
    production = ControllerIO.production(config)
    dark = "spark-3" in claims

    def power(
        path: PowerPath,
        timing: PowerTiming,
        on_step: StepHook,
        gate: SendGate,
        window: SendWindow | None,
    ) -> VerifiedPower:
        outlet = Outlet(path.node, sent, off=dark and path.node == "spark-3")
        return VerifiedPower(outlet, timing, on_step=on_step, gate=gate, send_window=window)

    async def banner(host: str, port: int, timeout: float) -> BannerResult:
        return BannerResult("banner", "SSH-2.0-OpenSSH_9.6", 0.001, 0.001)

    async def witness(targets: Sequence[str], timeout: float) -> WitnessReport:
        return WitnessReport(True, tuple(targets), ())

    async def serving(
        head: Any, workers: Any, token: str, timeout: float, profile: str, heard: Any
    ) -> ServingRestartReport:
        served.append(profile)
        return ServingRestartReport(profile, result="succeeded", step_durations={})

    async def nothing(device: Any) -> Any:
        raise AssertionError(f"nothing is sent over SSH here ({device})")

    ticks = iter(range(1, 1_000_000))

    async def spark_2(url: str, timeout: float) -> HttpAnswer:
        """spark-2's controller: alive, done with spark-3 (or recovering ``claims``)."""
        order = ["spark-1", "spark-2"]
        placed = {"node": "spark-2", "order": order, "claims": list(claims), "holds": []}
        body = {"ticks": next(ticks), "started_at": 1.0, "colocated": placed}
        return HttpAnswer(200, json.dumps(body).encode())

    return ControllerIO(
        clock=production.clock,
        agents=Agents(dark),
        banner=banner,
        witness=witness,
        power_factory=power,
        serving=serving,
        agent_restart=nothing,
        blocking=production.blocking,
        forced_reboot=nothing,
        halt=nothing,
        controllers=spark_2,
    )


def _left_at(store: HistoryStore, phase: str) -> int:
    """spark-1's open incident for spark-3, as its controller left it when its host froze."""
    incident = store.open_incident("host_frozen", ["spark-3"], evidence={"reasons": ["silent"]})
    if phase == "nothing_sent":
        return incident.id
    action = store.record_action(
        "spark-3",
        "cycle",
        device="outlet of spark-3",
        incident_id=incident.id,
        rung=0,
        step=StepName.RUNG_STARTED,
        step_detail={"rung": 0, "boot_id_before": FROZEN_BOOT},
    )
    store.add_step(incident.id, StepName.OFF_REQUESTED, node="spark-3")
    if phase == "off_sent":
        return incident.id
    store.add_step(incident.id, StepName.OFF_VERIFIED, node="spark-3")
    store.add_step(incident.id, StepName.HOLD_STARTED, node="spark-3")
    if phase == "off_held":
        return incident.id
    store.finish_action(action.id, "verified", step=StepName.POWER_RESTORED)
    return incident.id  # "power_restored": its boot wait was left


def _run_until_closed(controller: Controller, store: HistoryStore, incident_id: int) -> None:
    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(controller.run(stop))
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            timeline = store.incident(incident_id)
            if timeline is not None and not timeline.incident.is_open:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # a few more sweeps: nothing follows the close
        stop.set()
        await task

    asyncio.run(scenario())


@pytest.mark.parametrize("phase", ["nothing_sent", "off_sent", "off_held", "power_restored"])
def test_a_restarted_controller_closes_its_incident_for_a_node_another_recovered_sending_nothing(
    tmp_path: Path, phase: str
) -> None:
    config = _config(tmp_path)
    sent: list[tuple[str, str]] = []
    served: list[str] = []
    store = HistoryStore(config.history)
    try:
        incident_id = _left_at(store, phase)
        controller = Controller(config, store, io=_io(config, sent, served), node="spark-1")
        _run_until_closed(controller, store, incident_id)
        timeline = store.incident(incident_id)
    finally:
        store.close()
    assert timeline is not None
    steps = [s.step for s in timeline.steps]
    assert not timeline.incident.is_open, steps
    # Recovered when its record says an off may have landed; a false alarm at
    # the last look when nothing was sent. Never held for a person.
    expected = "false_alarm" if phase == "nothing_sent" else "recovered"
    assert timeline.incident.resolution == expected, steps
    assert sent == [], f"power commands sent for a node another controller recovered: {sent}"
    # Nor serving restarted: listening after its start, the serving restart is not
    # its own (docs/design.md, "Who acts for a node"); the one that restarts
    # serving does, when it finds serving down.
    assert served == [], f"serving restarted by a controller still listening: {served}"
    assert controller.holds.cluster_hold is None
    assert all(w.conduct.incident_id is None for w in controller.watches.values())


def test_a_restarted_controller_never_switches_on_a_node_another_is_cycling(
    tmp_path: Path,
) -> None:
    """Its record ends inside its own hold, the outlet reads off, and spark-2's
    controller is recovering spark-3 now: that off may be spark-2's. The resumed
    cycle sends no on; the incident is handed over (docs/design.md, "Controllers on the Sparks")."""
    config = _config(tmp_path)
    config = dataclasses.replace(
        config, policy=dataclasses.replace(config.policy, power_off_seconds=0.5)
    )
    sent: list[tuple[str, str]] = []
    served: list[str] = []
    store = HistoryStore(config.history)
    try:
        incident_id = _left_at(store, "off_held")
        io = _io(config, sent, served, claims=["spark-3"])
        controller = Controller(config, store, io=io, node="spark-1")
        _run_until_closed(controller, store, incident_id)
        timeline = store.incident(incident_id)
    finally:
        store.close()
    assert timeline is not None and not timeline.incident.is_open
    assert timeline.incident.resolution == "gave_up"
    assert sent == [], f"a command reached the outlet another controller holds off: {sent}"
    assert any("not switched on" in str(s.detail) for s in timeline.steps)
