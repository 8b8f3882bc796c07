"""The simulation's faults as they befall the world: a part of the run
(simulation/run.py), by the fault menu's names (spark_watchdog/fault_menu.py;
docs/simulation.md, "Fault menu")."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.errors import StoreFull, StoreLocked
from spark_watchdog.history.records import CLUSTER
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.power.base import PowerState
from spark_watchdog.simulation.fabric import PulseAttack
from spark_watchdog.simulation.pair import PAIR_FAULTS, SimPair
from spark_watchdog.simulation.placed_faults import PLACED_FAULTS
from spark_watchdog.simulation.process import Incarnation
from spark_watchdog.simulation.world import SimNode, SimOutlet, World

# The faults of a random run, drawn in this order (a seed replays its run).
FAULTS = (
    "freeze",
    "freeze-thaw",
    "reboot",
    "reboot-hang",
    "agent-crash",
    "stuck-agent",
    "slow-agent",
    "packet-loss",
    "dns-failure",
    "controller-net-down",
    "witness-down",
    "pdu-down",
    "pdu-slow",
    "pdu-refusing",
    "pdu-ambiguous",
    "pdu-lag",
    "pdu-bug",
    "partition",
    "outlet-off",
    "history-locked",
    "history-full",
    "controller-kill",
    "clock-step",
    "hold",
    "mem-collapse",
    "gpu-hang",
    "clock-latch",
    "serving-start-fails",
    "serving-stop-hangs",
    "serving-wrong-profile",
)


class FaultPlays:
    """What the run's faults need of it, and the plays themselves."""

    world: World
    rng: random.Random
    pair_rng: random.Random
    newer_rng: random.Random
    names: list[str]
    clock: Any  # the hosts' clock (simulation/run.py's _SimClock): its offset steps
    config: ControllerConfig
    store: HistoryStore
    pair: SimPair | None
    incarnation: Incarnation
    faults: dict[str, int]
    pending_heals: list[Callable[[], Any]]
    history_fault_until: float
    history_fault: type[StoreLocked] | type[StoreFull]

    def kill_quietly(self, incarnation: Incarnation | None = None) -> None:
        raise NotImplementedError

    def start_controller(self) -> None:
        raise NotImplementedError

    def inject(self, fault: str, on: str | None = None) -> None:
        world = self.world
        node = world.nodes[self.rng.choice(self.names) if on is None else on]
        outlet = world.outlets[node.name][0]
        self.faults[fault] = self.faults.get(fault, 0) + 1
        play = FAULT_PLAYS.get(fault)
        if play is None:
            raise ValueError(f"unknown simulated fault {fault!r}")
        play(self, node, outlet, world.now(), fault)

    # Each fault as it befalls the world; the random draws stay in this order,
    # so that a seed replays the same run.

    def _node_fault(self, node: SimNode, outlet: SimOutlet, now: float, fault: str) -> None:
        rng = self.rng
        if fault == "freeze":
            node.freeze(None)
        elif fault == "clock-latch":
            node.clock_latched = True
        elif fault == "freeze-thaw":
            node.freeze(rng.uniform(1.0, 40.0))
        elif fault == "thaw":  # scripted only: a frozen node comes back by itself
            node.thaw_at = min(node.thaw_at, now)
        elif fault == "ssh-bug":  # scripted only: its next reboot or halt raises
            node.ssh_bug = True
        elif fault == "reboot":
            node.planned_reboot(rng.uniform(1.0, 40.0), hang=False)
        elif fault == "reboot-hang":
            node.planned_reboot(rng.uniform(1.0, 20.0), hang=True)
        elif fault == "agent-crash":
            node.agent, node.agent_until = "crashed", now + rng.uniform(1.0, 60.0)
        elif fault == "stuck-agent":
            node.agent, node.agent_until = "stuck", now + rng.uniform(5.0, 120.0)
        elif fault == "slow-agent":
            node.agent, node.agent_until = "slow", now + rng.uniform(5.0, 60.0)
        elif fault == "mem-collapse":
            node.memory_kill(self.clock.base)
        elif fault.startswith("xid"):
            # Its own draws: Xid 31 mostly, now and then one that is evidence only
            # (scripted "xid-79": that Xid).
            _, _, said = fault.partition("-")
            xid = int(said) if said else self.newer_rng.choice((31, 31, 13, 43, 79))
            node.gpu_fault(self.clock.base, xid)
        elif fault == "gpu-hang" and node.phase == "up":
            node.gpu_wedged = True
            node.gpu_sticky = rng.random() < 0.3
        elif fault == "serving-start-fails":  # the rank exits at its next start
            node.next_start_fails = True
        elif fault == "serving-stop-hangs":  # the agent never answers its next stop
            node.next_stop_hangs = True
        elif fault == "serving-wrong-profile":  # the next start runs a config less safe
            node.next_start_unsafe = True

    def _network_fault(self, node: SimNode, outlet: SimOutlet, now: float, fault: str) -> None:
        rng, world = self.rng, self.world
        if fault == "packet-loss":
            node.loss = rng.choice([0.05, 0.3, 0.9])
            self.later(rng.uniform(5.0, 60.0), lambda: setattr(node, "loss", 0.0))
        elif fault == "dns-failure":
            node.dns_broken_until = now + rng.uniform(5.0, 60.0)
        elif fault == "controller-net-down":
            world.controller_net_down = True
            self.later(rng.uniform(2.0, 40.0), lambda: setattr(world, "controller_net_down", False))
        elif fault == "witness-down":
            world.witness_down = True
            self.later(rng.uniform(2.0, 60.0), lambda: setattr(world, "witness_down", False))
        elif fault == "partition":  # both links of one or more nodes
            until = now + rng.uniform(5.0, 90.0)
            for other in rng.sample(list(world.nodes.values()), rng.randint(1, len(self.names))):
                other.partitioned_until = other.fabric_down_until = until
        elif fault == "mgmt-partition-others-15":  # a switch's blip: all but ``node``
            for other in world.nodes.values():
                if other is not node:
                    other.partitioned_until = now + 15.0
        elif fault.startswith(("mgmt-partition", "fabric-partition")):
            # One link of one node (several, when they overlap), from the fabric's
            # own draws, so that other runs replay; scripted "-90": for 90 s.
            kind, _, said = fault.rpartition("-") if fault[-1].isdigit() else (fault, "", "")
            until = now + (float(said) if said else self.newer_rng.uniform(5.0, 120.0))
            if kind == "mgmt-partition":
                node.partitioned_until = until
            else:
                node.fabric_down_until = until
        elif fault in ("partition-3x60", "partition-3x10"):
            lasting = 60.0 if fault == "partition-3x60" else 10.0
            for other in list(world.nodes.values())[1:]:
                other.partitioned_until = other.fabric_down_until = now + lasting

    def _fabric_fault(self, node: SimNode, outlet: SimOutlet, now: float, fault: str) -> None:
        """What the peers' path met and missed once, from the newer faults' own
        draws (docs/simulation.md, "Fault menu")."""
        rng, world = self.newer_rng, self.world
        if fault == "agent-restart-mgmt-partition":
            # A new run on the same boot, then its management link dark.
            node.agent, node.agent_until = "crashed", now + rng.uniform(0.5, 3.0)
            cut_after, lasting = rng.uniform(2.0, 10.0), rng.uniform(20.0, 120.0)
            self.later(cut_after, lambda: _cut(node, world.now() + lasting))
        elif fault in ("pulse-replay", "pulse-forged"):
            kind = "replay" if fault == "pulse-replay" else "forge"
            lasting = rng.uniform(10.0, 120.0)
            world.pulse_attacks[node.name] = PulseAttack(
                kind, now + lasting, random.Random(rng.random())
            )
            self.later(lasting, lambda: world.pulse_attacks.pop(node.name, None))
        elif fault == "mgmt-partition-blip-others":
            # Its management link dark, and while it is, every other node's for a blip.
            node.partitioned_until = now + rng.uniform(30.0, 120.0)
            blip_after, blip = rng.uniform(5.0, 20.0), rng.uniform(3.0, 20.0)
            others = [n for n in world.nodes.values() if n is not node]
            self.later(blip_after, lambda: _cut_all(others, world.now() + blip))

    def _pdu_fault(self, node: SimNode, outlet: SimOutlet, now: float, fault: str) -> None:
        rng = self.rng
        if fault == "pdu-down":
            outlet.down_until = now + rng.uniform(2.0, 60.0)
        elif fault == "pdu-slow":
            outlet.slow = rng.uniform(0.5, 8.0)
            self.later(rng.uniform(5.0, 60.0), lambda: setattr(outlet, "slow", 0.0))
        elif fault == "pdu-refusing":
            outlet.refusing_until = now + rng.uniform(2.0, 60.0)
        elif fault == "pdu-ambiguous":
            outlet.ambiguous_p = 1.0
            self.later(rng.uniform(5.0, 60.0), lambda: setattr(outlet, "ambiguous_p", 0.0))
        elif fault == "pdu-lag":
            outlet.lag = rng.uniform(0.5, 10.0)
            self.later(rng.uniform(5.0, 60.0), lambda: setattr(outlet, "lag", 0.0))
        elif fault == "pdu-bug":
            outlet.bug = True

    def _controller_fault(self, node: SimNode, outlet: SimOutlet, now: float, fault: str) -> None:
        rng, world = self.rng, self.world
        if fault == "history-full-60":
            self.history_fault, self.history_fault_until = StoreFull, now + 60.0
        elif fault in ("history-locked", "history-full"):
            self.history_fault = StoreLocked if fault == "history-locked" else StoreFull
            self.history_fault_until = now + rng.uniform(1.0, 30.0)
        elif fault == "controller-kill":
            if self.incarnation.alive:
                self.kill_quietly()
                self.later(rng.uniform(0.5, 30.0), self.start_controller)
        elif fault == "clock-step":
            # Steps of 10 minutes, the total kept within ±7.5 minutes: budgets of
            # earlier controller processes are counted over a window widened by
            # 15 minutes, the largest swing this allows (docs/design.md, "Guards").
            step = rng.choice([-600.0, 600.0])
            self.clock.offset = max(-450.0, min(450.0, self.clock.offset + step))
        elif fault == "outlet-on":  # scripted only: a person switches the outlet on
            world.person_switch(node.name, PowerState.ON)
        elif fault == "outlet-off":
            world.person_switch(node.name, PowerState.OFF)
            # The person switches it back on later (or a hold says they handle it).
            self.later(
                rng.uniform(5.0, 120.0), lambda: world.person_switch(node.name, PowerState.ON)
            )
        elif fault == "hold":
            target = node.name if rng.random() < 0.7 else CLUSTER
            self.store.hold(target, "simulated operator", by="operator")
            self.later(
                rng.uniform(5.0, 120.0),
                lambda: self.store.release(target, by="operator"),
            )

    def _pair_fault(self, node: SimNode, outlet: SimOutlet, now: float, fault: str) -> None:
        # Its own draws, so that a run's other faults replay as without a pair.
        # Scripted only: "leader-pause-40" and the like last that many seconds.
        kind, _, lasting = fault.rpartition("-") if fault[-1].isdigit() else (fault, "", "")
        seconds = float(lasting) if lasting else self.pair_rng.uniform(3.0, 60.0)
        if self.pair is not None:
            self.pair.inject(kind, seconds)

    def _placed_fault(self, node: SimNode, outlet: SimOutlet, now: float, fault: str) -> None:
        """A fault of controllers on the Sparks: simulation/colocated.py plays it."""
        raise ValueError(f"{fault!r} needs controllers on the Sparks (simulate_colocated)")

    def newer_schedule(self, fault_window: float) -> list[tuple[float, str, str | None]]:
        """The newer faults, from their own draws, one node at a time: one link
        dark, the management link (the controller cannot reach the node, its
        peers can) or the fabric (the controller can, its peers cannot), a
        GPU fault that ends the node's rank (an Xid), and what the peers' path
        missed once: an agent restarted on the same boot just before its
        management link goes dark, pulses replayed or forged from the node's
        fabric address, a blip of every other node's management link while
        the node's is dark."""
        rng, t = self.newer_rng, 0.0
        schedule: list[tuple[float, str, str | None]] = []
        rate = rng.uniform(1 / 300.0, 1 / 60.0)
        while True:
            t += rng.expovariate(rate)
            if t >= fault_window:
                return schedule
            fault = rng.choice(NEWER_FAULTS)
            schedule.append((t, fault, rng.choice(self.names)))

    def later(self, delay: float, fn: Callable[[], Any]) -> None:
        assert self.world.loop is not None
        self.pending_heals.append(fn)

        def fire() -> None:
            if fn in self.pending_heals:
                self.pending_heals.remove(fn)
                fn()

        self.world.loop.call_later(delay, fire)

    def heal_all(self) -> None:
        """The quiet tail begins: every temporary fault ends now."""
        for fn in list(self.pending_heals):
            self.pending_heals.remove(fn)
            fn()
        world = self.world
        world.controller_net_down = world.witness_down = False
        self.history_fault_until = -1.0
        for node in world.nodes.values():
            node.loss, node.dns_broken_until, node.partitioned_until = 0.0, -1.0, -1.0
            node.fabric_down_until = -1.0
            if node.agent != "ok":
                node.agent_until = world.now()
            if node.phase == "hung":
                node.phase, node.phase_until = "post", world.now() + 3.0
        for outlets in world.outlets.values():
            for outlet in outlets:
                outlet.down_until = outlet.refusing_until = -1.0
                outlet.slow = outlet.lag = outlet.ambiguous_p = 0.0
                outlet.bug = False
        if self.pair is not None:
            self.pair.heal()
        elif not self.incarnation.alive:
            self.start_controller()


def _cut(node: SimNode, until: float) -> None:
    """The node's management link dark until ``until``."""
    node.partitioned_until = max(node.partitioned_until, until)


def _cut_all(nodes: list[SimNode], until: float) -> None:
    for node in nodes:
        _cut(node, until)


# The newer faults of runs whose agents pulse their peers (FaultPlays.newer_schedule).
NEWER_FAULTS = (
    "mgmt-partition",
    "fabric-partition",
    "xid",
    "agent-restart-mgmt-partition",
    "pulse-replay",
    "pulse-forged",
    "mgmt-partition-blip-others",
)

_FaultPlay = Callable[[FaultPlays, SimNode, SimOutlet, float, str], None]
_FAULT_GROUPS: tuple[tuple[_FaultPlay, tuple[str, ...]], ...] = (
    (
        FaultPlays._node_fault,
        (
            "freeze",
            "clock-latch",
            "freeze-thaw",
            "thaw",
            "ssh-bug",
            "reboot",
            "reboot-hang",
            "agent-crash",
            "stuck-agent",
            "slow-agent",
            "mem-collapse",
            "xid",
            "xid-31",
            "xid-79",
            "gpu-hang",
            "serving-start-fails",
            "serving-stop-hangs",
            "serving-wrong-profile",
        ),
    ),
    (
        FaultPlays._network_fault,
        (
            "packet-loss",
            "dns-failure",
            "controller-net-down",
            "witness-down",
            "partition",
            "partition-3x60",
            "partition-3x10",
            "mgmt-partition",
            "fabric-partition",
            "mgmt-partition-90",
            "fabric-partition-90",
            "mgmt-partition-others-15",
        ),
    ),
    (
        FaultPlays._fabric_fault,
        (
            "agent-restart-mgmt-partition",
            "pulse-replay",
            "pulse-forged",
            "mgmt-partition-blip-others",
        ),
    ),
    (
        FaultPlays._pdu_fault,
        ("pdu-down", "pdu-slow", "pdu-refusing", "pdu-ambiguous", "pdu-lag", "pdu-bug"),
    ),
    (
        FaultPlays._controller_fault,
        (
            "history-full-60",
            "history-locked",
            "history-full",
            "controller-kill",
            "clock-step",
            "outlet-off",
            "outlet-on",
            "hold",
        ),
    ),
    (FaultPlays._pair_fault, (*PAIR_FAULTS, "leader-pause-40", "leader-cut-30")),
    (FaultPlays._placed_fault, PLACED_FAULTS),
)
# Every fault a run or a script can name, and what plays it.
FAULT_PLAYS: dict[str, _FaultPlay] = {name: play for play, names in _FAULT_GROUPS for name in names}
