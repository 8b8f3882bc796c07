"""The freezes of a run with controllers on the Sparks, and the two
invariants about them (docs/simulation.md, "Controllers on the Sparks"):

- **I16** never two power cycles for one freeze: the offs that land on a
  node during one of its boots come from one incident of one controller;
- **I17** a single freeze is recovered within its bound (``freeze_bound``).

A *spell* is one freeze of a node's host, from the freeze to its next boot
(or its thaw). It is *single* (the design's promise) while nothing else is
wrong: no other node down, no fault of the network, the power or the
history, no hold, budget left, not a dry run, a freeze for good. A
controller killed or paused on another host is within the promise: it
widens the bound. A double fault the design does not promise to survive
(docs/design.md's residual case: another host down, or two live controllers
unheard by each other on every path) excuses two cycles; the report counts
those, and the freezes beyond the promise, rather than calling them violations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.look.monitor import LATE_BANNER_INTERVAL_S
from spark_watchdog.power.base import TIMED_ON_MARGIN_S
from spark_watchdog.simulation.world import World

# The simulated boot after power comes back (world.py): POST for 2-8 s, then the kernel 1-10 s.
LONGEST_BOOT_S = 8.0 + 10.0
# Slack for a command's answer, a tick's order of nodes and the watcher's one-second look.
MARGIN_S = 10.0
# Faults that leave a freeze single: a controller on another host killed or
# paused (the bound widens), the fabric alone, a serving fault.
WITHIN_PROMISE = frozenset(
    {
        "controller-kill",
        "controller-pause",
        "controller-pause-40",
        "fabric-cable-pulled",
        "fabric-partition",
        "mem-collapse",
        "serving-start-fails",
    }
)


def freeze_bound(config: ControllerConfig, node: str) -> float:
    """Seconds from a single freeze of ``node`` to its next boot, at most:

    freeze_after + banner_misses x (late banner interval + banner_timeout)
    + 2 poll intervals + agent_timeout (found frozen)
    + fence_delay, if the node runs the first controller of the order (the next
      one waits for its cut to land first)
    + agent_timeout + banner_timeout (the last look)
    + 2 power_timeout + 2 min_command_interval + power_off_seconds + the timed
      on's margin + 2 power poll intervals (the cycle)
    + the longest simulated boot (18 s) + 10 s + 2 poll intervals (margins).

    A controller killed or paused meanwhile widens it (``widening``), as does
    the listening spell of a controller that just started.
    """
    d, p = config.detection, config.policy
    placed = config.colocated
    assert placed is not None
    found = (
        d.freeze_after
        + d.banner_misses * (LATE_BANNER_INTERVAL_S + d.banner_timeout)
        + 2 * d.poll_interval
        + d.agent_timeout
    )
    fence = placed.fence_delay if placed.order[0] == node else 0.0
    look = d.agent_timeout + d.banner_timeout
    cycle = (
        2 * p.power_timeout
        + 2 * p.min_command_interval
        + p.power_off_seconds
        + TIMED_ON_MARGIN_S
        + 2 * p.power_poll_interval
    )
    return found + fence + look + cycle + LONGEST_BOOT_S + MARGIN_S + 2 * d.poll_interval


def widening(config: ControllerConfig, seconds: float) -> float:
    """What a controller killed or paused for ``seconds`` adds to the bound: the
    stop, systemd's restart, the others' wait (takeover_after), its own
    listening after it (takeover_after) and a fence delay."""
    placed = config.colocated
    assert placed is not None
    return seconds + 5.0 + 2 * placed.takeover_after + placed.fence_delay


@dataclass
class Spell:
    node: str
    began: float
    boot: int
    bound: float
    single: bool  # the design's promise holds so far
    double_fault: bool = False  # a double fault beyond it overlapped the spell
    ended: float | None = None
    recovered: bool = False  # ended by a boot
    late: bool = False


@dataclass
class Cycle:
    """An off that landed: when, on which boot, and whose (host, incident)."""

    at: float
    boot: int
    sender: tuple[str, int | None]


@dataclass
class Spells:
    """Every freeze of the run, the double faults seen, and the landed offs."""

    world: World
    config: ControllerConfig
    violate: Callable[[str], None]
    spells: list[Spell] = field(default_factory=list)
    open: dict[str, Spell] = field(default_factory=dict)
    cycles: dict[str, list[Cycle]] = field(default_factory=dict)
    # (when, nodes down, pairs of live controllers unheard on every path), when any.
    doubles: list[tuple[float, frozenset[str], frozenset[frozenset[str]]]] = field(
        default_factory=list
    )
    # (host, from, to) of each controller killed or paused by a fault.
    stops: list[tuple[str, float, float]] = field(default_factory=list)
    starts: list[tuple[str, float]] = field(default_factory=list)
    excused_cycles: int = 0  # second cycles of one freeze in a double fault

    # -- what happens -------------------------------------------------------------

    def landed_off(self, node: str, sender: tuple[str, int | None], now: float) -> None:
        """I16 for an off that landed on ``node``, sent by ``sender`` (host, incident)."""
        boot = self.world.nodes[node].boot
        mine = self.cycles.setdefault(node, [])
        other = next((c for c in mine if c.boot == boot and c.sender != sender), None)
        mine.append(Cycle(now, boot, sender))
        if other is None:
            return
        assert self.config.colocated is not None
        since = other.at - self.config.colocated.takeover_after
        if self.double_fault(node, since, now):
            self.excused_cycles += 1
            return
        self.violate(
            f"I16 at {now:.1f}s: a second cycle of {node} on one boot, from {sender[0]}'s "
            f"controller (incident {sender[1]}), after {other.sender[0]}'s "
            f"(incident {other.sender[1]}) at {other.at:.1f}s"
        )

    def double_fault(self, node: str, since: float, until: float) -> bool:
        """Between the two times, another host was down, or two live controllers
        (not the node's own) heard each other on no path."""
        return any(
            since <= at <= until and (down - {node} or any(node not in pair for pair in unheard))
            for at, down, unheard in self.doubles
        )

    def injected(self, fault: str) -> None:
        """A fault now: beyond the promise for every freeze open, unless it is within it."""
        if fault not in WITHIN_PROMISE:
            for spell in self.open.values():
                spell.single = False

    def stopped(self, host: str, seconds: float) -> None:
        now = self.world.now()
        self.stops.append((host, now, now + seconds))

    def started(self, host: str) -> None:
        self.starts.append((host, self.world.now()))

    # -- each look ----------------------------------------------------------------

    def look(
        self,
        unheard: frozenset[frozenset[str]],
        fit: Callable[[str], bool],
        calm: Callable[[str], bool],
    ) -> None:
        """The world now: spells begin and end, double faults are noted, and I17
        is checked. ``fit(node)``: at its freeze, the promise holds for it (no
        hold, budget left); ``calm(node)``: nothing but its freeze is wrong now."""
        now, nodes = self.world.now(), self.world.nodes
        down = frozenset(n for n, node in nodes.items() if node.phase != "up")
        if down or unheard:
            self.doubles.append((now, down, unheard))
        for name, node in nodes.items():
            spell = self.open.get(name)
            if spell is not None and (node.boot != spell.boot or node.phase == "up"):
                spell.ended, spell.recovered = now, node.boot != spell.boot
                del self.open[name]
            if spell is None and node.phase == "frozen":
                single = node.thaw_at == float("inf") and fit(name)
                began = Spell(name, now, node.boot, freeze_bound(self.config, name), single)
                self.open[name] = began
                self.spells.append(began)
        for spell in self.open.values():
            self._judge(spell, down, unheard, calm)

    def _judge(
        self,
        spell: Spell,
        down: frozenset[str],
        unheard: frozenset[frozenset[str]],
        calm: Callable[[str], bool],
    ) -> None:
        if down - {spell.node} or any(spell.node not in pair for pair in unheard):
            spell.double_fault = True
            spell.single = False
        spell.single = spell.single and calm(spell.node)
        now = self.world.now()
        if spell.single and not spell.late and now > spell.began + self.bound(spell):
            spell.late = True
            self.violate(
                f"I17 at {now:.1f}s: {spell.node} frozen at {spell.began:.1f}s, a single "
                f"freeze, not recovered within its bound ({self.bound(spell):.0f}s)"
            )

    def bound(self, spell: Spell) -> float:
        """The spell's bound, widened by every controller on another host stopped
        or started while it lasted."""
        assert self.config.colocated is not None
        listening = self.config.colocated.takeover_after
        bound, seen = spell.bound, -1.0
        while bound != seen:
            seen, end = bound, spell.began + bound
            stops = [
                b - a
                for host, a, b in self.stops
                if host != spell.node and a < end and b > spell.began - listening
            ]
            started = any(
                host != spell.node and spell.began - listening <= at < end
                for host, at in self.starts
            )
            bound = spell.bound + sum(widening(self.config, s) for s in stops)
            bound += listening if started else 0.0
        return bound

    # -- the end ------------------------------------------------------------------

    def at_end(self) -> None:
        """I17 for the spells still open."""
        for spell in list(self.open.values()):
            self._judge(spell, frozenset(), frozenset(), lambda _: True)

    def figures(self) -> dict[str, float]:
        """For the report: freezes, single ones, recovered within the bound, the
        worst share of its bound one took, the double faults."""
        single = [s for s in self.spells if s.single]
        ratios = [(s.ended - s.began) / self.bound(s) for s in single if s.ended and s.recovered]
        return {
            "freezes": len(self.spells),
            "single_freezes": len(single),
            "recovered_in_bound": sum(1 for r in ratios if r <= 1.0),
            "worst_share_of_bound": round(max(ratios, default=0.0), 3),
            "freezes_in_double_faults": sum(1 for s in self.spells if s.double_fault),
            "freezes_beyond_promise": sum(1 for s in self.spells if not s.single),
            "excused_cycles": self.excused_cycles,
        }
