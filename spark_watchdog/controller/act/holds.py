"""Holds: nothing automatic touches a held node (docs/design.md, "Guards").

A hold lives in the history, so the CLI places and releases it with or
without a controller running; ``sync`` brings each node's state in line
with the history every sweep. The controller holds a node itself when a
guard, an ambiguous power outcome or an error says a person must look
(``hold``), and the whole cluster when the circuit breaker stays open
(``latch_breaker``, decided by controller/decide/decisions.py once the
breaker stayed open): more nodes look frozen at once than a network fault
could not explain.
"""

from __future__ import annotations

import contextlib
import logging

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.decide.detector import Verdict
from spark_watchdog.controller.decide.node_states import HOLD_EVENTS, HeldBy, NodeEvent, NodeState
from spark_watchdog.controller.decide.planner import breaker_trips
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record.ledger import BY, HistoryUnwritable, Ledger
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.history.records import CLUSTER

log = logging.getLogger("spark_watchdog.controller")

# The states a hold from the history or the breaker takes at once: no power
# action is in progress (a rung stops at its next preflight, which reads the
# holds itself; a gentler ladder asks the guard before it reboots or cuts).
HOLDABLE = frozenset({NodeState.WATCHING, NodeState.UNWEDGING, NodeState.UNLATCHING})


class Holds:
    def __init__(
        self,
        config: ControllerConfig,
        ledger: Ledger,
        notifier: Notifier,
        clock: Clock,
        watches: dict[str, NodeWatch],
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.notifier = notifier
        self.clock = clock
        self.watches = watches
        # The cluster-wide hold's reason, as the history last said (None: none).
        self.cluster_hold: str | None = None
        # Since when more nodes than the breaker allows look frozen (monotonic).
        self._breaker_since: float | None = None
        # The nodes the breaker counted at its last look.
        self.breaker_trouble: tuple[str, ...] = ()
        # Nodes fencing in a rung that has sent nothing yet (its preflight, or
        # its wait for the breaker): silent by no doing of the controller's.
        self.nothing_sent: set[str] = set()

    async def hold(
        self,
        watch: NodeWatch,
        reason: str,
        event: NodeEvent,
        *,
        by_controller: bool = False,
        record: bool = True,
    ) -> None:
        """Hold a node: in memory always, in the history when ``record``.

        ``by_controller``: a hold the controller decided on (ambiguity, an
        error, a guard) is never released automatically: it is in the history
        (an operator releases it), or, while the history cannot be written,
        kept in memory and written as soon as it can be. ``record=False``: a
        pause while the history cannot be written, released by the next
        ``sync`` once it can (the incident, if any, is then resumed).
        """
        assert event in HOLD_EVENTS, event  # each leads to HELD from every state
        watch.apply(event, reason=reason, by=HeldBy.CONTROLLER if record else HeldBy.PAUSE)
        watch.conduct.held(by_controller=False)
        if record:
            try:
                await self.ledger.write(self.ledger.store.hold, watch.name, reason, by=BY)
            except HistoryUnwritable:
                watch.conduct.held(by_controller=by_controller)  # written when it can be
        self.notifier.send(Event("held", f"{watch.name} held: {reason}", watch.name))

    async def sync(self) -> None:
        """Holds live in the history, so the CLI works with or without us running."""
        try:
            holds = await self.ledger.read(self.ledger.store.active_holds)
        except HistoryUnwritable:
            return
        held = {h.node: h for h in holds}
        cluster = held.get(CLUSTER)
        self.cluster_hold = None if cluster is None else cluster.reason
        for watch in self.watches.values():
            hold = held.get(watch.name) or cluster
            if watch.conduct.held_by_controller:
                # Our own hold, not yet in the history: write it now, release never.
                with contextlib.suppress(HistoryUnwritable):
                    assert watch.held_reason is not None
                    await self.ledger.write(
                        self.ledger.store.hold, watch.name, watch.held_reason, by=BY
                    )
                    watch.conduct.held(by_controller=False)
                continue
            if hold is not None and watch.state in HOLDABLE:
                by = HeldBy.CONTROLLER if hold.created_by == BY else HeldBy.OPERATOR
                watch.apply(NodeEvent.HOLD, reason=hold.reason, by=by)
            elif hold is None and watch.state is NodeState.HELD:
                watch.apply(NodeEvent.RELEASE)

    # -- the circuit breaker ------------------------------------------------

    def breaker_open(self) -> bool:
        return self._breaker_since is not None

    def _breaker_count(self) -> list[str]:
        """Nodes whose confirmed freeze the network could explain.

        Counted: ``host_frozen`` nodes the controller is not already handling,
        or whose rung has sent nothing yet (a node in its preflight looks as
        frozen as before it), whose last miss was not a completed handshake (a
        frozen GB10 still completes TCP; a partition does not). Not counted:
        nodes it may have powered off or waits on (fencing, booting), and mere
        silence, which a blip of a few seconds produces on every node at once.
        """
        return [
            w.name
            for w in self.watches.values()
            if (w.state in HOLDABLE or w.name in self.nothing_sent)
            and w.finding.verdict is Verdict.HOST_FROZEN
            and not w.banner_reachable
            and w.off_seconds_override is None  # halted by the controller for its latch
        ]

    def note_breaker(self) -> None:
        """Count what the breaker counts, and since when it is open
        (``planner.breaker_trips``); whether it latches is decided
        (controller/decide/decisions.py, ``plan_cluster``)."""
        trouble = self._breaker_count()
        self.breaker_trouble = tuple(trouble)
        nodes = len(self.watches)
        if not breaker_trips(len(trouble), nodes, self.config.guards.max_unhealthy_fraction):
            self._breaker_since = None
            return
        if self._breaker_since is None:
            self._breaker_since = self.clock.monotonic()
            log.warning("circuit breaker open: %d/%d nodes look frozen", len(trouble), nodes)

    def breaker_open_for(self, now: float) -> float | None:
        """How long the breaker has been open (None: it is closed)."""
        return None if self._breaker_since is None else now - self._breaker_since

    async def latch_breaker(self, reason: str) -> None:
        """Hold the whole cluster: in the history, and each node that may be held now."""
        with contextlib.suppress(HistoryUnwritable):
            await self.ledger.write(self.ledger.store.hold, CLUSTER, reason, by=BY)
            self.cluster_hold = reason
        self.notifier.send(Event("circuit_breaker", reason))
        for watch in self.watches.values():
            if watch.state in HOLDABLE:
                watch.apply(NodeEvent.HOLD, reason=reason)
