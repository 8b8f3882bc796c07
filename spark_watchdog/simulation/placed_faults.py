"""The faults of a run whose controllers run on the Sparks themselves
(simulation/colocated.py), by the fault menu's names (spark_watchdog/fault_menu.py):
a host that runs a controller frozen, two hosts at once, the fabric cable pulled,
the switch gone, the plug out of one host's reach, a controller process paused,
a partition that heals while a node is being cut, and every path between the
Sparks gone at once. ``controller-kill`` kills one controller of the order here.
Each draws from the run's own stream, so that other runs replay as before.
"""

from __future__ import annotations

import random

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.simulation.hosts import HostNetwork
from spark_watchdog.simulation.pair import RESTART_AFTER_S
from spark_watchdog.simulation.world import World

# The faults only a run with controllers on the Sparks plays; the menu names each.
PLACED_FAULTS = (
    "freeze-head",
    "freeze-first-controller",
    "freeze-controller-host",
    "double-freeze",
    "fabric-cable-pulled",
    "switch-down",
    "plug-unreachable",
    "controller-pause",
    "controller-pause-40",
    "partition-heals-mid-cycle",
    "total-partition",
)
# Played by simulation/colocated.py in its runs, by simulation/fault_plays.py in the others.
REPLAYED = ("controller-kill",)

# What a random run with controllers on the Sparks draws from: these, then the
# earlier faults that mean the same with the controllers on the Sparks.
RANDOM_PLACED = (
    *(f for f in PLACED_FAULTS if f != "controller-pause-40"),
    "controller-kill",
    "freeze",
    "freeze-thaw",
    "reboot",
    "reboot-hang",
    "agent-crash",
    "stuck-agent",
    "slow-agent",
    "packet-loss",
    "witness-down",
    "pdu-down",
    "pdu-slow",
    "pdu-refusing",
    "pdu-ambiguous",
    "pdu-lag",
    "pdu-bug",
    "partition",
    "mgmt-partition",
    "fabric-partition",
    "gpu-hang",
    "clock-latch",
    "mem-collapse",
    "serving-start-fails",
)


class PlacedFaults:
    """What the faults need of the run, and the plays themselves."""

    world: World
    config: ControllerConfig
    names: list[str]
    placed_rng: random.Random

    def kill_placed(self, host: str, restart_after: float) -> None:
        raise NotImplementedError

    def pause_placed(self, host: str, seconds: float) -> None:
        raise NotImplementedError

    @property
    def order(self) -> tuple[str, ...]:
        assert self.config.colocated is not None
        return self.config.colocated.order

    @property
    def network(self) -> HostNetwork:
        assert self.world.hosts is not None
        return self.world.hosts

    def placed_schedule(self, fault_window: float) -> list[tuple[float, str, str | None]]:
        """Random faults (a Poisson process) over the fault window, of RANDOM_PLACED."""
        rng, t = self.placed_rng, 0.0
        schedule: list[tuple[float, str, str | None]] = []
        rate = rng.uniform(1 / 300.0, 1 / 40.0)
        while True:
            t += rng.expovariate(rate)
            if t >= fault_window:
                return schedule
            schedule.append((t, rng.choice(RANDOM_PLACED), None))

    def play_placed(self, fault: str, on: str | None) -> None:
        """``fault`` now; ``on``: the node (or controller host) it befalls, None: drawn."""
        rng, now, network = self.placed_rng, self.world.now(), self.network
        if fault.startswith("freeze-") or fault == "double-freeze":
            for name in self._frozen(fault, on):
                self.world.nodes[name].freeze(None)
        elif fault == "fabric-cable-pulled":
            a, b = self._pair(on)
            network.pull_cable(a, b, now + rng.uniform(10.0, 300.0))
        elif fault == "switch-down":
            network.switch_down(now + rng.uniform(5.0, 120.0))
        elif fault == "plug-unreachable":
            network.cut_plug(on or rng.choice(self.order), now + rng.uniform(5.0, 120.0))
        elif fault.startswith("controller-pause"):
            seconds = 40.0 if fault.endswith("-40") else rng.uniform(3.0, 60.0)
            self.pause_placed(on or rng.choice(self.order), seconds)
        elif fault == "controller-kill":
            self.kill_placed(on or rng.choice(self.order), RESTART_AFTER_S)
        elif fault == "partition-heals-mid-cycle":
            self._heals_mid_cycle(on or rng.choice(self.names))
        elif fault == "total-partition":
            until = now + rng.uniform(10.0, 120.0)
            network.switch_down(until)
            for i, a in enumerate(self.names):
                for b in self.names[i + 1 :]:
                    network.pull_cable(a, b, until)
        else:
            raise ValueError(f"unknown fault of controllers on the Sparks {fault!r}")

    def _frozen(self, fault: str, on: str | None) -> list[str]:
        """The hosts a freeze fault freezes."""
        rng = self.placed_rng
        if fault == "freeze-head":
            assert self.world.head is not None
            return [self.world.head]
        if fault == "freeze-first-controller":
            return [self.order[0]]
        if fault == "freeze-controller-host":
            return [on or rng.choice(self.order)]
        first = on or rng.choice(self.names)  # double-freeze: it and the next node
        return [first, self.names[(self.names.index(first) + 1) % len(self.names)]]

    def _pair(self, on: str | None) -> tuple[str, str]:
        """Two nodes joined by a fabric cable: ``on`` and the next node, or drawn."""
        if on is None:
            a, b = self.placed_rng.sample(self.names, 2)
            return a, b
        return on, self.names[(self.names.index(on) + 1) % len(self.names)]

    def _heals_mid_cycle(self, name: str) -> None:
        """Both links of ``name`` dark for about as long as a controller takes to
        find it silent and cut it: the path comes back before, during or after the cut."""
        config, node = self.config, self.world.nodes[name]
        d = config.detection
        found = d.freeze_after + d.banner_misses * d.banner_timeout + 2 * d.poll_interval
        lasting = found + self.placed_rng.uniform(0.0, config.policy.power_off_seconds + 10.0)
        until = self.world.now() + lasting
        node.partitioned_until = max(node.partitioned_until, until)
        node.fabric_down_until = max(node.fabric_down_until, until)
