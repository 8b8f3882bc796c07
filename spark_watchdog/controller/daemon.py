"""The controller's main loop: pull, check, decide, act, record.

Every ``poll_interval``: pull each agent's ``/v1/state`` (short timeout),
check SSH banners where an agent is late (and now and then otherwise),
check the witness, classify each node (pure), decide (pure: decisions.py,
from the views of views.py and the history reads it needs), and hand each
step to the part that carries it out (hands.py): a recovery ladder, a
serving restart, an agent restart, a hold. Long actions run as their own
tasks, so detection never waits on them. On start, the newest unfinished
incident of each node is resumed.

The loop lives here; each part with tasks and state of its own lives
beside it: what it sees of the nodes (monitor.py, which decides nothing),
the holds and the circuit breaker (holds.py), the freeze ladder
(recovery.py, rung.py), every power action behind its guards
(power_actions.py), the serving restarts and their budget
(serving_policy.py, serving_budget.py), the wedged and clock-latch ladders'
tasks (ladder_tasks.py), agent restarts (agent_restart.py), the power
budgets (budgets.py) and the doubt about its own view (watcher_doubt.py).
Each gets only the parts it works with, handed over explicitly, and none
reaches back into the controller.

All I/O goes through the ``ControllerIO`` it is given, and all time through
its clock (docs/design.md, "Proof"), so the simulation runs this very code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Any

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.config.history_location import is_postgres_url
from spark_watchdog.controller.act import unlatch, wedged
from spark_watchdog.controller.act.agent_restart import AgentRestarts
from spark_watchdog.controller.act.freeze_path import FreezePath
from spark_watchdog.controller.act.freeze_tools import FreezeTools
from spark_watchdog.controller.act.gentle_tools import GentleTools
from spark_watchdog.controller.act.hands import Hands
from spark_watchdog.controller.act.holds import Holds
from spark_watchdog.controller.act.ladder_tasks import UnlatchLadders, WedgedLadders
from spark_watchdog.controller.act.parts import Ladder, Parts, Work
from spark_watchdog.controller.act.power_actions import PowerActions
from spark_watchdog.controller.decide.decisions import ClusterView, needs, plan, plan_cluster
from spark_watchdog.controller.decide.detector import DetectionPolicy, Verdict
from spark_watchdog.controller.decide.node_states import NodeState
from spark_watchdog.controller.decide.planner import QUIET_STEPS, Step
from spark_watchdog.controller.decide.watcher_doubt import WatcherDoubt
from spark_watchdog.controller.io import ControllerIO
from spark_watchdog.controller.look.controller_peers import ALONE, Alone, ControllerPeers
from spark_watchdog.controller.look.monitor import Monitor
from spark_watchdog.controller.look.node_watch import NodeWatch, watch_json
from spark_watchdog.controller.record import incident_log
from spark_watchdog.controller.record.budgets import Budgets
from spark_watchdog.controller.record.incident_log import Resolution
from spark_watchdog.controller.record.ledger import HistoryUnwritable, Ledger
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.controller.record.verdict_alerts import VerdictAlerts
from spark_watchdog.controller.serving.serving_policy import ServingRestarts
from spark_watchdog.controller.views import cluster_view, history_reads, node_view
from spark_watchdog.errors import WatchdogError
from spark_watchdog.history.instance_lock import InstanceLock
from spark_watchdog.history.records import CLUSTER, Incident
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.sdnotify import SystemdNotifier

log = logging.getLogger("spark_watchdog.controller")


class Controller:
    def __init__(
        self,
        config: ControllerConfig,
        store: HistoryStore,
        *,
        io: ControllerIO | None = None,
        notifier: Notifier | None = None,
        systemd: SystemdNotifier | None = None,
        node: str | None = None,
    ) -> None:
        self.config = config
        self.io = io or ControllerIO.production(config)
        self.clock = self.io.clock
        # A lone controller's refuses nothing; a pair's is its lease (controller/pair/fence.py).
        self.fence = self.io.fence
        # A deposed leader of a pair says nothing more about nodes (controller/pair/fence.py).
        self.notifier = notifier or Notifier(config.notify, quiet=self.fence.deposed)
        self.ledger = Ledger(store, self.notifier, self.io.blocking)
        # What /metrics counts: incidents, actions, verdict changes (in memory).
        self.tallies = self.ledger.tallies
        self.tallies.seed_nodes(n.name for n in config.nodes)
        # What each verdict change tells a person and counts (controller/record/verdict_alerts.py).
        self.alerts = VerdictAlerts(
            self.notifier, self.clock, self.tallies, config.detection.freeze_after
        )
        self.policy = _policy(config)
        # A late agent: banner checks every monitor.LATE_BANNER_INTERVAL_S, and an SSH
        # refusal from then on means the host is going down.
        now, late_after = self.clock.monotonic(), self.policy.late_after
        self.watches = {n.name: NodeWatch(n, now, late_after=late_after) for n in config.nodes}
        # The other controllers when this one runs on a Spark (controller/look/controller_peers.py).
        self.peers = _placed(config, node, self.io, self.notifier)
        self._assemble()
        self.doubt = WatcherDoubt.of(config.detection)  # its loop's stalls (watcher_doubt.py)
        self._doubted: str | None = None  # why it doubts its view, when it alerted
        self.ticks = 0
        self._tick_started = 0.0
        self.last_sweep_s = 0.0
        self.started_at = self.clock.time()
        # What the HTTP threads read: rebuilt after every tick, never mutated.
        self.published: dict[str, Any] = {}
        # READY/WATCHDOG/STATUS to systemd (Type=notify); None: from the environment.
        self.systemd = systemd

    def _assemble(self) -> None:
        """The parts, each given what it works with (controller/act/parts.py)."""
        config, io, ledger = self.config, self.io, self.ledger
        notifier, watches = self.notifier, self.watches
        # Node and cluster holds, and the breaker that places one (controller/act/holds.py).
        self.holds = Holds(config, ledger, notifier, self.clock, watches)
        self.budgets = Budgets(config, ledger, self.clock)
        # Every power action behind its guards (controller/act/power_actions.py).
        self.power = PowerActions(
            config, ledger, notifier, io, self.budgets, self.holds, watches, self.peers
        )
        # What the controller sees of each node, in the watches (controller/look/monitor.py).
        self.monitor = Monitor(config, io, watches, self.policy)
        self.recorder = self.monitor.recorder
        # Every ladder's task, by kind and node (controller/act/parts.py).
        self.work = Work()
        # What the views and the ladders' tasks work with, handed over: never the controller.
        parts = Parts(
            config, io, ledger, notifier, watches, self.monitor, self.holds, self.power, self.work
        )
        self.parts = parts
        self.serving = ServingRestarts(
            config, io, ledger, notifier, watches, self.recorder, self.peers.serving_not_mine
        )
        # A frozen host's incident and its ladder (controller/act/freeze_path.py).
        freeze_tools = FreezeTools(
            config, self.clock, ledger, notifier, self.monitor, self.holds, self.power, self.serving
        )
        self.freeze = FreezePath(freeze_tools, self.work, watches, self.fence)
        tools = GentleTools(
            config, self.clock, ledger, notifier, self.holds, self.power, self.serving
        )
        self.wedged = WedgedLadders(tools, self.work, watches, self.recorder)
        self.unlatch = UnlatchLadders(tools, self.work, watches, self.recorder)
        self.agent_restarts = AgentRestarts(
            config, ledger, notifier, self.clock, io, self.fence.check_leading
        )
        # What carries out each decision (controller/act/hands.py).
        self.hands = Hands.of(tools, self.freeze, self.agent_restarts, self.wedged, self.unlatch)

    # -- the loop ---------------------------------------------------------

    async def tick(self) -> None:
        self._tick_started = self.clock.monotonic()
        self.doubt.tick_started(self._tick_started)
        for watch, before in await self._sweep():
            if self.peers.tells_of(watch):  # only the node's first heard actor tells of it
                self.alerts.changed(watch, before)
        now = self.clock.monotonic()
        self.doubt.sweep_took(now - self._tick_started, now)
        if self.fence.deposed():
            return  # a pair's lost lease: it starts nothing more (controller/pair/pair.py)
        await self.holds.sync()
        await self.serving.sync_profile()
        self.holds.note_breaker()
        cluster = self._cluster()
        cluster_steps = plan_cluster(cluster)
        for decision in cluster_steps:
            await self.hands.carry_out_cluster(decision)
        self._doubted = cluster.stalled or cluster.all_silent
        if any(d.step not in QUIET_STEPS for d in cluster_steps):
            cluster = self._cluster()
        for watch in self.watches.values():
            if await self._act(watch, cluster):
                cluster = self._cluster()
            if self.peers.tells_of(watch):
                self.alerts.tell_unreachable(watch)
        await self.freeze.refresh_offenders()
        self.alerts.count(self.watches.values())
        self.ticks += 1
        self.last_sweep_s = self.clock.monotonic() - self._tick_started
        self.published = self.status_json()

    def _cluster_parts(self) -> tuple[Parts, ServingRestarts, WatcherDoubt, float, bool]:
        return self.parts, self.serving, self.doubt, self.policy.late_after, bool(self._doubted)

    def _cluster(self) -> ClusterView:
        return cluster_view(*self._cluster_parts(), serving_not_mine=self.peers.serving_not_mine())

    async def _sweep(self) -> list[tuple[NodeWatch, Verdict]]:
        """The nodes, and the other controllers on the Sparks at the same time."""
        if self.peers is ALONE:
            return await self.monitor.sweep()
        peers = self.peers.sweep(self._tick_started)
        changed, _ = await asyncio.gather(self.monitor.sweep(), peers)
        return changed

    def _placed_json(self, now: float) -> dict[str, Any] | None:
        lives = {name: watch.last_life_at for name, watch in self.watches.items()}
        held = [n for n, w in self.watches.items() if w.state is NodeState.HELD]
        holds = ([CLUSTER] if self.holds.cluster_hold else []) + held
        return self.peers.status_json(now, _claims(self.watches, self.work), holds, lives)

    async def _act(self, watch: NodeWatch, cluster: ClusterView) -> bool:
        """Carry out what controller/decide/decisions.py decides for the node, in
        order. True when something was done that the cluster's view must be read
        again for."""
        if self.fence.deposed():
            return False  # lost in the middle of this tick: start and resume nothing (pair.py)
        watch.expire_expected_reboot(self.clock.monotonic(), self.policy.boot_timeout)
        node = node_view(watch, self.parts, self.agent_restarts, self.peers.not_mine(watch))
        reads = await history_reads(watch, needs(node, cluster), self.power, self.serving)
        steps = plan(node, cluster, reads)
        changed = False
        for decision in steps:
            if decision.step not in QUIET_STEPS:
                changed = True
            try:
                await self.hands.carry_out(watch, decision)
            except HistoryUnwritable as exc:
                # Nothing that needed a record happened; the next tick decides again.
                log.warning("%s: %s not carried out: %s", watch.name, decision.step.value, exc)
                return True
        if any(d.step is Step.HAND_TO_POWER for d in steps):
            # The freeze path has the node now: decided again at once, not a tick later.
            return await self._act(watch, self._cluster())
        return changed

    # -- start, resume, run -----------------------------------------------

    async def resume(self) -> None:
        """Continue what a previous controller left open (the write-ahead log).

        One incident per node: the newest open one is resumed, older ones are
        closed as superseded. A resumed rung goes through the same preflight
        (holds, budgets, breaker, last look) as a fresh one.
        """
        incidents = await self.ledger.read(self.ledger.store.open_incidents)
        self.tallies.seed_open(incidents)
        newest: dict[str, Incident] = {}
        for incident in sorted(incidents, key=lambda i: i.id):
            if incident.kind == wedged.KIND and not incident.dry_run:
                await self.wedged.resume(incident)
            if incident.kind == unlatch.KIND and not incident.dry_run:
                await self.unlatch.resume(incident)
            if incident.kind != "host_frozen" or incident.dry_run:
                await incident_log.resolve(
                    self.ledger,
                    incident.id,
                    Resolution.FALSE_ALARM if incident.dry_run else Resolution.GAVE_UP,
                    detail={"why": "controller restarted mid-incident"},
                )
                continue
            for name in incident.nodes:
                older = newest.get(name)
                if older is not None:
                    await self.freeze.supersede(older, incident)
                newest[name] = incident
        for name, incident in newest.items():
            watch = self.watches.get(name)
            if watch is not None:
                await self.freeze.resume_incident(watch, incident.id)

    async def run(self, stop: asyncio.Event) -> None:
        setting = await self.ledger.read(self.ledger.store.setting, "serving_profile")
        self.serving.profile = None if setting is None else setting.value
        await self.resume()
        interval = self.config.detection.poll_interval
        systemd = self.systemd or SystemdNotifier()
        status = self.status_line()
        systemd.ready(status)
        last_pet = float("-inf")
        try:
            while not stop.is_set():
                started = self.clock.monotonic()
                try:
                    await self.tick()
                except Exception:
                    log.exception("controller tick failed")
                else:
                    # Petted only after a tick that completed: a loop that is stuck
                    # or fails every sweep stops petting, and systemd restarts the
                    # controller, which resumes any recovery from the history.
                    pet_every = systemd.watchdog_interval
                    if pet_every is not None and started - last_pet >= pet_every:
                        systemd.watchdog()
                        last_pet = started
                    if (line := self.status_line()) != status:
                        status = line
                        systemd.status(status)
                elapsed = self.clock.monotonic() - started
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, interval - elapsed))
        finally:
            await asyncio.gather(*self.cancel_tasks(), return_exceptions=True)
            await self.notifier.drain()
            systemd.stopping()

    def cancel_tasks(self) -> list[asyncio.Task[Any]]:
        """Cancel every task this controller started (ladders, checks, restarts);
        those it cancelled. What ``run`` does when it ends, and a pair's lost
        lease at once (controller/pair/pair.py)."""
        pending: list[asyncio.Task[Any]] = [
            t
            for t in [
                *self.work.tasks(),
                *self.monitor.tasks(),
                *self.agent_restarts.tasks.values(),
                self.serving.task,
            ]
            if t is not None and not t.done()
        ]
        for task in pending:
            task.cancel()
        return pending

    def status_line(self) -> str:
        """One line for ``systemctl status``: the verdict counts and the history."""
        counts: dict[str, int] = {}
        for watch in self.watches.values():
            counts[watch.verdict] = counts.get(watch.verdict, 0) + 1
        verdicts = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
        line = f"{len(self.watches)} nodes: {verdicts}"
        if self.ledger.problem:
            line += "; history unwritable"
        if self.holds.cluster_hold:
            line += "; cluster held"
        return line

    def status_json(self) -> dict[str, Any]:
        now = self.clock.monotonic()
        return {
            "started_at": self.started_at,
            "ticks": self.ticks,
            "last_sweep_s": round(self.last_sweep_s, 4),
            "poll_interval_s": self.config.detection.poll_interval,
            "freeze_after_s": self.config.detection.freeze_after,
            "witness": self.monitor.witness_detail,
            "cluster_hold": self.holds.cluster_hold,
            "notifications": {
                "delivered": self.notifier.delivered,
                "dropped": self.notifier.failed,
            },
            "dry_run": self.config.guards.dry_run,
            "serving_profile": self.serving.profile,
            "history": self.ledger.problem or "ok",
            "leadership": None if self.fence.leadership is None else self.fence.leadership(),
            "colocated": self._placed_json(now),
            "nodes": [watch_json(w, now) for w in self.watches.values()],
        }


def _claims(watches: dict[str, NodeWatch], work: Work) -> list[str]:
    """The nodes this controller has an incident or a ladder for: what the other
    controllers on the Sparks leave to it."""
    return sorted(
        name
        for name, watch in watches.items()
        if watch.conduct.incident_id is not None
        or any(work.running_for(kind, name) for kind in Ladder)
    )


def _policy(config: ControllerConfig) -> DetectionPolicy:
    return DetectionPolicy(
        freeze_after=config.detection.freeze_after,
        banner_misses=config.detection.banner_misses,
        boot_timeout=config.guards.boot_timeout,
        gpu_wedged_after=config.detection.gpu_wedged_after,
    )


def _placed(
    config: ControllerConfig, node: str | None, io: ControllerIO, notifier: Notifier
) -> ControllerPeers | Alone:
    """This controller's place in the order of controllers on the Sparks (ALONE:
    it runs on a host of its own).

    :raises WatchdogError: it does not know its node, or its node has no place.
    """
    if config.colocated is None:
        return ALONE
    order = config.colocated.order
    if node not in order:
        raise WatchdogError(
            f"this controller runs on {node or 'an unnamed node'}, which has no place in "
            f"colocated.controllers ({', '.join(order)}): pass --node with one of them"
        )

    def tell(summary: str) -> None:
        notifier.send(Event("controllers_disagree", summary, node))

    return ControllerPeers(config, node, io.controllers, io.clock, tell)


async def serve(config: ControllerConfig, node: str | None = None) -> None:
    """Run until SIGTERM or SIGINT, as the only controller on this history
    (``node``: the Spark it runs on, where controllers run on the Sparks)."""
    if is_postgres_url(config.history):
        # The instance lock below is a file beside an SQLite history; nothing
        # would keep a second controller on a PostgreSQL history from acting.
        raise WatchdogError(
            "a PostgreSQL history is served by controller/pair/pair.py's serve_pair"
        )
    lock = InstanceLock(config.history)
    lock.acquire()  # HistoryLocked names the other controller
    try:
        store = HistoryStore(config.history)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        controller = Controller(config, store, node=node)
        from spark_watchdog.controller.page.page_api import page_endpoint

        endpoint = page_endpoint(config, controller, controller, lambda: loop)
        endpoint.start()
        try:
            await controller.run(stop)
        finally:
            endpoint.stop()
            store.close()
    finally:
        lock.release()
