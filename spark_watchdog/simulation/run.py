"""One seeded run of the real controller against the simulated world, with invariants.

``simulate(seed)`` builds a random configuration and a random schedule of
faults, runs the controller (crashing and restarting it now and then) on
virtual time, checks the invariants (docs/simulation.md) at every power
command and at the end, and returns what it saw. Same seed, same run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Callable, Coroutine
from typing import Any, Literal, cast

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.fence import LONE, Fence
from spark_watchdog.controller.io import ControllerIO
from spark_watchdog.controller.node_states import NodeState
from spark_watchdog.controller.notify import ABOUT_LEADERSHIP, Event, Notifier
from spark_watchdog.controller.parts import Ladder
from spark_watchdog.errors import StoreFull, StoreLocked
from spark_watchdog.history.core import is_write
from spark_watchdog.history.records import CLUSTER
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.power.base import CommandSpacing, PowerState, SendGate, StepHook, VerifiedPower
from spark_watchdog.power.paths import PowerPath, timing_for
from spark_watchdog.power.send_window import SendWindow
from spark_watchdog.sdnotify import SystemdNotifier
from spark_watchdog.simulation.fault_plays import FAULT_PLAYS as FAULT_PLAYS
from spark_watchdog.simulation.fault_plays import FAULTS as FAULTS
from spark_watchdog.simulation.fault_plays import FaultPlays
from spark_watchdog.simulation.loop import VirtualLoop, run_virtual
from spark_watchdog.simulation.pair import PAIR_FAULTS, SimPair
from spark_watchdog.simulation.report import ErrorTrap, attempt_of
from spark_watchdog.simulation.report import Report as Report
from spark_watchdog.simulation.sim_config import random_config
from spark_watchdog.simulation.world import (
    PROCESS,
    Incarnation,
    InjectedBug,
    Killed,
    SimAgents,
    SimOutlet,
    World,
    sim_agent_restart,
    sim_banner,
    sim_forced_reboot,
    sim_halt,
    sim_serving,
    sim_witness,
)
from spark_watchdog.steps import StepName

SelfTimed = Literal["never", "always", "failing"]
# The share of random runs with a controller pair (simulation/pair.py).
PAIR_SHARE = 0.3
PEERS_SHARE = 0.5  # runs whose agents pulse their peers over the fabric
ALERT_KINDS = frozenset({"held", "gave_up", "circuit_breaker", "outlet_off", "ambiguous_power"})

# A gentler ladder's state, and the task that must be running while a node has it.
_GENTLE = {NodeState.UNWEDGING: Ladder.UNWEDGING, NodeState.UNLATCHING: Ladder.UNLATCHING}


class _SimClock:
    def __init__(self, world: World, base: float) -> None:
        self.world = world
        self.base = base
        self.offset = 0.0

    def monotonic(self) -> float:
        return self.world.now()

    def time(self) -> float:
        return self.base + self.world.now() + self.offset

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


class _Notifier(Notifier):
    """The real notifier (what it lets out), the receivers the run itself."""

    def __init__(
        self, config: ControllerConfig, sink: Callable[[Event], None], quiet: Callable[[], bool]
    ) -> None:
        super().__init__(config.notify, quiet=quiet)
        self.sink = sink

    def queue(self, event: Event) -> None:
        self.sink(event)


class _Store:
    """The real history, with injected write failures and crash points."""

    def __init__(self, store: HistoryStore, run: _Run, incarnation: Incarnation) -> None:
        self._store = store
        self._run = run
        self._incarnation = incarnation

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)
        if not callable(method):
            return method
        run, incarnation = self._run, self._incarnation
        writes = is_write(method)  # marked where it is written (history/core.py)

        def call(*args: Any, **kwargs: Any) -> Any:
            incarnation.check()
            if writes and run.world.now() < run.history_fault_until:
                raise run.history_fault(self._store.path, "injected history fault")
            result = method(*args, **kwargs)
            if writes:
                run.writes += 1
                if run.crash_after_write == run.writes:
                    run.kill("after a write", incarnation)
            return result

        return call


# A scripted fault: at this many simulated seconds, this fault, on this node (None: random).
Scripted = tuple[float, str, "str | None"]


class _Run(FaultPlays):
    def __init__(
        self,
        seed: int,
        minutes: float,
        crash_after_write: int | None,
        script: list[Scripted] | None = None,
        overrides: dict[str, Any] | None = None,
        prepare: Callable[[HistoryStore], None] | None = None,
        self_timed: SelfTimed | None = None,
        pair: bool | None = None,
        peers: bool | None = None,
    ) -> None:
        self.seed = seed
        self.prepare = prepare
        self.script = script
        self.overrides = overrides or {}
        self.rng = random.Random(seed)
        self.minutes = minutes
        self.crash_after_write = crash_after_write
        self.writes = 0
        rng = self.rng
        self.names = [f"spark-{i + 1}" for i in range(4)]
        self.dry_run = rng.random() < 0.08
        if "dry_run" in self.overrides.get("guards", {}):
            self.dry_run = bool(self.overrides["guards"]["dry_run"])
        self.config = random_config(rng, self.names, self.dry_run, self.overrides)
        self.world = World(self.names, rng, self.config.detection.freeze_after)
        if self_timed is not None:
            self._time_outlets(self_timed)
        self.world.on_command_hook = self._on_command
        self.events: list[Event] = []
        self.clock = _SimClock(self.world, 1_800_000_000.0)
        # A pair's own draws: a run without one replays as it did before pairs.
        self.pair_rng = random.Random(f"pair {seed}")
        if pair is None:
            pair = self.pair_rng.random() < PAIR_SHARE
        self.pair: SimPair | None = None
        # The fabric's own draws too: a run without peers replays as before them.
        self.link_rng = random.Random(f"links {seed}")
        self.world.peers_on = self.link_rng.random() < PEERS_SHARE if peers is None else peers
        self.store = self._open_history(pair)
        self.history_fault_until = -1.0
        self.history_fault: type[StoreLocked] | type[StoreFull] = StoreLocked
        self.incarnation = Incarnation(0, alive=False)
        self.incarnations = 0
        self.controller: Controller | None = None
        self.tasks: dict[int, set[asyncio.Task[Any]]] = {}
        self.crashes = 0
        self.faults: dict[str, int] = {}
        self.off_counts: dict[tuple[int, int, int], int] = {}
        self.errors: list[str] = []
        self.crash_after_command: int | None = None
        self.final_verdicts: dict[str, str] = {}
        # Temporary faults still to end (heal_all ends them at the quiet tail).
        self.pending_heals: list[Callable[[], Any]] = []
        self.spacing = CommandSpacing()
        # Serving restarts for serving faults of controller processes gone (I8).
        self.retired_serving_restarts: list[tuple[float, int]] = []

    def _time_outlets(self, self_timed: SelfTimed) -> None:
        """Every outlet can (or cannot) switch itself back on, its timer working or not."""
        for outlets in self.world.outlets.values():
            for outlet in outlets:
                outlet.self_timed = self_timed != "never"
                outlet.timer_fails = self_timed == "failing"

    def _open_history(self, pair: bool) -> HistoryStore:
        """The run's history: in memory, or a pair's shared database (then ``self.pair``)."""
        if not pair:
            return HistoryStore(":memory:", clock=lambda: self.clock.time())
        # The database server's clock: the hosts' clocks may step, not its.
        self.pair = SimPair(self, lambda: self.clock.base + self.world.now())
        # The run's own view of the shared history (invariants, operators' holds).
        return HistoryStore(
            self.pair.path, clock=self.clock.time, database_clock=self.pair.database_clock
        )

    # -- the controller process ----------------------------------------------------

    def io(
        self, incarnation: Incarnation, clock: Clock | None = None, fence: Fence = LONE
    ) -> ControllerIO:
        """The simulated world as the process ``incarnation`` reaches it; ``clock``
        and ``fence``: a pair's (simulation/pair.py), else a lone controller's."""
        world, config = self.world, self.config
        clock = self.clock if clock is None else clock

        def power(
            path: PowerPath, on_step: StepHook, gate: SendGate, window: SendWindow | None
        ) -> VerifiedPower:
            outlet = world.outlets[path.node][0]
            outlet.incarnation = incarnation
            return VerifiedPower(
                outlet,
                timing_for(config, path),
                dry_run=config.guards.dry_run,
                on_step=on_step,
                gate=gate,
                send_window=window,
                clock=clock,
                spacing=self.spacing,  # per run: virtual time starts at 0 in each
            )

        async def inline(fn: Callable[[], Any]) -> Any:
            incarnation.check()
            return fn()

        return ControllerIO(
            clock=clock,
            agents=SimAgents(world, incarnation),
            banner=sim_banner(world, incarnation),
            witness=sim_witness(world, incarnation),
            power_factory=power,
            serving=sim_serving(world, incarnation, config, clock),
            agent_restart=sim_agent_restart(world, incarnation),
            forced_reboot=sim_forced_reboot(world, incarnation),
            halt=sim_halt(world, incarnation),
            blocking=cast(Any, inline),
            fence=fence,
        )

    def new_incarnation(self) -> Incarnation:
        """A new controller process (numbers never repeat within a run)."""
        self.incarnations += 1
        return Incarnation(self.incarnations)

    def new_controller(
        self,
        incarnation: Incarnation,
        store: HistoryStore,
        clock: Clock | None = None,
        fence: Fence = LONE,
    ) -> Controller:
        """The real controller of ``incarnation``; from now the one the run watches."""
        if self.controller is not None:
            self.retired_serving_restarts.extend(self.controller.serving.fault_restarts)
        controller = Controller(
            self.config,
            cast(HistoryStore, _Store(store, self, incarnation)),
            io=self.io(incarnation, clock, fence),
            notifier=_Notifier(
                self.config, functools.partial(self._said, incarnation), quiet=fence.deposed
            ),
            systemd=SystemdNotifier(environ={}),
        )
        self.controller, self.incarnation = controller, incarnation
        return controller

    def start_controller(self) -> None:
        if self.pair is not None:
            self.pair.start()  # every process of the pair not running
            return
        if self.incarnation.alive:
            return  # one controller per history: the instance lock sees to that
        incarnation = self.new_incarnation()
        controller = self.new_controller(incarnation, self.store)
        self.spawn_as(incarnation, self._process(controller, asyncio.Event()))

    def spawn_as(self, incarnation: Incarnation, coro: Coroutine[Any, Any, Any]) -> None:
        """Run ``coro`` as (a task of) the process ``incarnation``."""
        token = PROCESS.set(incarnation)
        try:
            self._spawn(coro)
        finally:
            PROCESS.reset(token)

    async def _process(self, controller: Controller, stop: asyncio.Event) -> None:
        """The controller process: an error out of run() exits it; systemd restarts it."""
        try:
            await controller.run(stop)
        except Exception:
            self.kill_quietly()
            assert self.world.loop is not None
            self.world.loop.call_later(5.0, self.start_controller)

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        asyncio.get_running_loop().create_task(coro)

    def task_factory(self, loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> Any:
        task = asyncio.Task(coro, loop=loop, **kw)
        process = PROCESS.get()
        if process is not None:
            number = process.number
            self.tasks.setdefault(number, set()).add(task)
            task.add_done_callback(self.tasks[number].discard)
        return task

    def kill(self, why: str, incarnation: Incarnation | None = None) -> None:
        """SIGKILL: the process does nothing more, its tasks are gone (by default
        the one the run watches)."""
        victim = self.incarnation if incarnation is None else incarnation
        if not victim.alive:
            return
        victim.alive = False
        self.crashes += 1
        for task in list(self.tasks.get(victim.number, ())):
            task.cancel()
        raise Killed(why)

    def kill_quietly(self, incarnation: Incarnation | None = None) -> None:
        with contextlib.suppress(Killed):
            self.kill("scheduled crash", incarnation)

    # -- invariants at every command ---------------------------------------------

    def _on_command(self, outlet: SimOutlet, target: PowerState, landed: bool, number: int) -> None:
        now, node = self.world.now(), outlet.node.name
        where = f"at {now:.1f}s: {target.value} to {node}"
        if self.dry_run:
            self.violate(f"I6 {where} in dry run")
        if target is PowerState.OFF:
            life = self.world.truth.alive_at(node, now)
            if life is not None:
                self.violate(f"I1 {where}, which answered {now - life:.1f}s before")
            if self.store.active_hold(node) or self.store.active_hold(CLUSTER):
                self.violate(f"I6 {where} while held")
        incident = next(
            (
                i
                for i in self.store.open_incidents()
                if node in i.nodes and i.kind == "host_frozen" and not i.dry_run
            ),
            None,
        )
        failing = now < self.history_fault_until
        if incident is None:
            if not failing:
                self.violate(f"I7 {where} with no open incident")
        else:
            mine = [s for s in self.store.steps(incident.id) if s.node == node]
            last = mine[-1] if mine else None
            wanted = f"{target.value}_requested"
            excused = failing and target is PowerState.ON  # an on goes out unrecorded
            if (last is None or last.step != wanted) and not excused:
                self.violate(f"I7 {where}: last step {last and last.step}, not {wanted}")
            if target is PowerState.OFF and last is not None and isinstance(last.detail, dict):
                key = (incident.id, int(last.detail.get("rung", -1)), attempt_of(mine))
                self.off_counts[key] = self.off_counts.get(key, 0) + 1
                if key[2] > 2:
                    self.violate(f"I2 {where}: try {key[2]} of incident #{key[0]} rung {key[1]}")
                if self.off_counts[key] > 1:
                    self.violate(
                        f"I2 {where}: a second off in incident #{key[0]} rung {key[1]} "
                        f"(try {key[2]})"
                    )
        if self.pair is not None:
            refused = self.pair.check_sender(number, where)
            if refused is not None:
                self.violate(refused)
        if self.crash_after_command is not None and len(self.world.truth.commands) + 1 == (
            self.crash_after_command
        ):
            assert self.world.loop is not None
            self.world.loop.call_soon(self.kill_quietly)

    def violate(self, text: str) -> None:
        self.world.truth.violations.append(f"seed {self.seed}: {text}")

    def check_incidents(self) -> None:
        counts: dict[str, int] = {}
        for incident in self.store.open_incidents():
            if incident.kind == "host_frozen" and not incident.dry_run:
                for node in incident.nodes:
                    counts[node] = counts.get(node, 0) + 1
        for node, count in counts.items():
            if count > 1:
                self.violate(f"I2 at {self.world.now():.1f}s: {node} has {count} open incidents")

    # -- the run ----------------------------------------------------------------

    async def main(self) -> Report:
        loop = asyncio.get_running_loop()
        self.world.loop = loop
        loop.set_task_factory(self.task_factory)
        loop.set_exception_handler(self._unhandled)
        if self.pair is not None:
            assert isinstance(loop, VirtualLoop)
            loop.paused = self.pair.paused  # a paused leader's tasks wait (SIGSTOP)
        if self.prepare is not None:
            self.prepare(self.store)  # what an earlier controller left in the history
        self.start_controller()
        fault_window = self.minutes * 60.0
        self._schedule_faults(loop, fault_window)
        g, policy = self.config.guards, self.config.policy
        # Long enough for the longest ladder begun late in it: a cut as long as a
        # clock latch's, the boot wait, and the serving restart that follows
        # (a head that never gets ready holds it for serving.start_timeout).
        cut = max(policy.power_off_seconds, policy.clock_latch_off_seconds)
        tail = 4 * (cut + g.boot_timeout + 60.0) + self.config.serving.start_timeout + 120.0
        elapsed = await self._faults_then_rest(loop, fault_window, fault_window + tail)
        # A ladder begun late in the tail (a clock latch answered once its node
        # was free) runs to its end, for at most one more of the longest: the
        # invariants judge where a ladder ends, not its middle.
        end = loop.time() + cut + g.boot_timeout + 60.0 + self.config.serving.start_timeout
        while self._ladder_running() and loop.time() < end:
            await asyncio.sleep(5.0)
            elapsed = loop.time()
        self.finish()
        assert self.controller is not None
        self.final_verdicts = {n: w.verdict for n, w in self.controller.watches.items()}
        if self.pair is not None:
            self.pair.stop()
        self.kill_quietly()
        await asyncio.sleep(0)
        return self.report(elapsed)

    def _schedule_faults(self, loop: asyncio.AbstractEventLoop, fault_window: float) -> None:
        """The script's faults, or random ones (a Poisson process) over the fault window."""
        rate = self.rng.uniform(1 / 120.0, 1 / 20.0)  # faults per second
        t = 0.0
        schedule: list[Scripted] = []
        while self.script is None:
            t += self.rng.expovariate(rate)
            if t >= fault_window:
                break
            schedule.append((t, self.rng.choice(FAULTS), None))
        unknown = sorted({f for _, f, _ in self.script or () if f not in FAULT_PLAYS})
        if unknown:
            raise ValueError(f"unknown simulated fault {', '.join(map(repr, unknown))}")
        if self.pair is not None and self.script is None:
            schedule.extend(self._pair_schedule(fault_window))
        if self.world.peers_on and self.script is None:
            schedule.extend(self.link_schedule(fault_window))
        for at, fault, on in self.script if self.script is not None else schedule:
            loop.call_at(at, self.inject, fault, on)

    async def _faults_then_rest(
        self, loop: asyncio.AbstractEventLoop, fault_window: float, end: float
    ) -> float:
        """Watch the incidents through the fault window, heal everything, then wait
        (until ``end`` at most) for the world to come to rest; the time reached."""
        elapsed, settled = 0.0, 0
        healed = False
        while elapsed < end:
            await asyncio.sleep(5.0)
            elapsed = loop.time()
            self.check_incidents()
            if elapsed >= fault_window and not healed:
                self.heal_all()
                healed = True
            elif healed:
                # Done early once everything has come to rest twice in a row.
                settled = settled + 1 if self.settled() else 0
                if settled >= 2:
                    break
        return elapsed

    def _said(self, incarnation: Incarnation, event: Event) -> None:
        """I13: of a pair, only the leader says anything about nodes."""
        self.events.append(event)
        if self.pair is not None and event.kind not in ABOUT_LEADERSHIP:
            where = f"at {self.world.now():.1f}s: {event.kind} ({event.node or 'cluster'})"
            refused = self.pair.check_sender(incarnation.number, where)
            if refused is not None:
                self.violate(refused.replace("I12", "I13", 1))

    def _unhandled(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """An exception nobody handled (a task's, found when it is dropped) is a bug."""
        exc = context.get("exception")
        if not isinstance(exc, (Killed, InjectedBug)):
            self.errors.append(f"{context.get('message')}: {exc!r}")

    def _pair_schedule(self, fault_window: float) -> list[Scripted]:
        """The pair's faults: its leader paused, killed or cut from the history."""
        rng, t = self.pair_rng, 0.0
        schedule: list[Scripted] = []
        rate = rng.uniform(1 / 240.0, 1 / 60.0)
        while True:
            t += rng.expovariate(rate)
            if t >= fault_window:
                return schedule
            schedule.append((t, rng.choice(PAIR_FAULTS), None))

    def _ladder_running(self) -> bool:
        """The watched controller is cutting, booting or running a ladder for a node."""
        controller = self.controller
        if controller is None or not self.incarnation.alive:
            return False
        busy = (NodeState.FENCING, NodeState.BOOTING)
        return any(w.state in busy for w in controller.watches.values()) or any(
            not t.done() for t in controller.work.tasks()
        )

    def settled(self) -> bool:
        controller = self.controller
        if controller is None or not self.incarnation.alive:
            return False
        if self.pair is not None and not self.pair.steady():
            return False
        for name, watch in controller.watches.items():
            if watch.state is NodeState.HELD:
                continue
            if watch.state is not NodeState.WATCHING or watch.incident_id is not None:
                return False
            if self.world.nodes[name].phase != "up" or watch.finding.verdict.value != "healthy":
                return False
        return True

    def finish(self) -> None:
        """The end-of-run invariants: I3, I4, I5, I6."""
        truth, world = self.world.truth, self.world
        controller = self.controller
        assert controller is not None
        alerted = {e.node for e in self.events if e.kind in ALERT_KINDS}
        cluster_alert = any(e.kind in ALERT_KINDS and e.node is None for e in self.events)
        for name, node in world.nodes.items():
            watch = controller.watches[name]
            mine = [c for c in truth.commands if c.node == name]
            person = [p for p in truth.person_switches if p[1] == name]
            if watch.state in (NodeState.FENCING, NodeState.BOOTING):
                self.violate(f"I5 at the end: {name} still {watch.state.value}")
            ladder = _GENTLE.get(watch.state)
            if ladder is not None and not controller.work.running_for(ladder, name):
                self.violate(f"I5 at the end: {name} {watch.state.value} with no ladder running")
            left_off = world.outlets[name][0].state is not PowerState.ON
            last_ours = mine[-1] if mine else None
            ours_last = last_ours is not None and (not person or person[-1][0] < last_ours.at)
            if left_off and ours_last and not (name in alerted or cluster_alert):
                self.violate(f"I3 at the end: {name}'s outlet left off with no alert naming it")
            stuck = node.phase in ("frozen", "off", "halted")
            if stuck and not self.dry_run and watch.state is not NodeState.HELD:
                self.violate(f"I5 at the end: {name} is {node.phase} and not held")
            if stuck and watch.state is NodeState.HELD and not (name in alerted or cluster_alert):
                self.violate(f"I5 at the end: {name} held without an alert")
        window = self.config.guards.budget_window
        offs = [c for c in truth.commands if c.target is PowerState.OFF]
        for i, first in enumerate(offs):
            inside = [c for c in offs[i:] if c.at - first.at < window]
            if len(inside) > self.config.guards.cluster_budget:
                self.violate(f"I4: {len(inside)} offs within {window:g}s (cluster budget)")
                break
            same = [c for c in inside if c.node == first.node]
            if len(same) > self.config.guards.node_budget:
                self.violate(f"I4: {len(same)} offs to {first.node} within {window:g}s")
                break
        if self.dry_run and truth.serving_restarts:
            self.violate("I6: serving restarted in dry run")
        self._check_serving_restarts()
        self._check_reboots()
        self._check_halts()
        for error in self.errors:
            self.violate(f"unexpected error: {error}")

    def _check_serving_restarts(self) -> None:
        """I8: no restart loop. Automatic serving restarts stay within their budget
        in every window, and no memory guard kill is answered twice."""
        serving = self.config.serving
        starts = sorted(at for at, _ in self.serving_fault_restarts())
        for i, first in enumerate(starts):
            inside = [t for t in starts[i:] if t - first < serving.restart_budget_window]
            if len(inside) > serving.restart_budget:
                self.violate(
                    f"I8: {len(inside)} serving restarts within "
                    f"{serving.restart_budget_window:g}s (budget {serving.restart_budget})"
                )
                break
        incidents = self.store.list_incidents(kind="memory_exhausted", limit=10_000)
        for name, node in self.world.nodes.items():
            answered = [i for i in incidents if name in i.nodes]
            if len(answered) > len(node.guard_kills):
                self.violate(
                    f"I8: {len(answered)} memory_exhausted incidents for {name}, "
                    f"{len(node.guard_kills)} kills by its memory guard"
                )

    def _check_halts(self) -> None:
        """I10: a halt over SSH goes only to a node whose GPU is clock-latched,
        never in dry run, at most once per boot, and never more often than the
        node latched and booted again. A node left halted at the end is I5's:
        held, with an alert."""
        halts = self.world.truth.halts
        seen: set[tuple[str, int]] = set()
        for at, name, latched, boot in halts:
            if not latched:
                self.violate(f"I10 at {at:.1f}s: halt of {name}, whose GPU is not latched")
            if self.dry_run:
                self.violate(f"I10 at {at:.1f}s: halt of {name} in dry run")
            if (name, boot) in seen:
                self.violate(f"I10 at {at:.1f}s: a second halt of {name} on boot {boot}")
            seen.add((name, boot))

    def _check_reboots(self) -> None:
        """I9: a forced reboot goes only to a node whose GPU is wedged, never in dry
        run, and never beyond the node budget in any window."""
        guards = self.config.guards
        reboots = self.world.truth.reboots
        for at, node, wedged in reboots:
            if not wedged:
                self.violate(f"I9 at {at:.1f}s: forced reboot of {node}, whose GPU answers")
            if self.dry_run:
                self.violate(f"I9 at {at:.1f}s: forced reboot of {node} in dry run")
            same = [t for t, n, _ in reboots if n == node and at <= t < at + guards.budget_window]
            if len(same) > guards.node_budget:
                self.violate(f"I9: {len(same)} forced reboots of {node} within the budget window")
                break

    def serving_fault_restarts(self) -> list[tuple[float, int]]:
        """Every controller process's restarts for serving faults (virtual time)."""
        seen = [*self.retired_serving_restarts]
        if self.controller is not None:
            seen.extend(self.controller.serving.fault_restarts)
        return list(dict.fromkeys(seen))

    def report(self, elapsed: float) -> Report:
        incidents = [i for i in self.store.list_incidents(limit=10_000) if not i.dry_run]
        return Report(
            seed=self.seed,
            simulated_s=elapsed,
            nodes=len(self.names),
            violations=list(self.world.truth.violations),
            faults=dict(self.faults),
            commands=len(self.world.truth.commands),
            incidents=len(incidents),
            recovered=sum(1 for i in incidents if i.resolution == "recovered"),
            crashes=self.crashes,
            dry_run=self.dry_run,
            writes=self.writes,
            sent=[(c.node, c.target.value) for c in self.world.truth.commands],
            sent_at=[c.at for c in self.world.truth.commands],
            alerts=[e.kind for e in self.events],
            verdicts=self.final_verdicts,
            resolutions=[str(i.resolution) for i in incidents],
            kinds=[i.kind for i in incidents],
            timed_ons=len(self.world.truth.timed_ons),
            pair=self.pair is not None,
            epochs=0 if self.pair is None else self.pair.epochs,
            takeovers=0 if self.pair is None else self.pair.takeovers,
            second_tries=sum(
                1
                for i in incidents
                for s in self.store.steps(i.id)
                if s.step == StepName.RUNG_STARTED and attempt_of([s]) == 2
            ),
        )


def simulate(
    seed: int,
    minutes: float = 10.0,
    *,
    crash_after_write: int | None = None,
    crash_after_command: int | None = None,
    script: list[Scripted] | None = None,
    overrides: dict[str, Any] | None = None,
    prepare: Callable[[HistoryStore], None] | None = None,
    self_timed: SelfTimed | None = None,
    pair: bool | None = None,
    peers: bool | None = None,
) -> Report:
    """One run: ``minutes`` of random faults (or the ``script``), then a quiet tail.

    ``overrides``: config sections to change, e.g. ``{"guards": {"dry_run": True}}``.
    ``self_timed``: every outlet times its own on ("always", and its timer
    fires; "failing": it accepts the timed off, its timer never fires) or none
    does ("never"); None: each outlet by chance, some timers failing.
    ``peers``: the agents pulse their peers over the fabric, or not; None: by chance.
    """
    run = _Run(
        seed, minutes, crash_after_write, script, overrides, prepare, self_timed, pair, peers
    )
    run.crash_after_command = crash_after_command
    trap = ErrorTrap(run.errors)
    logger = logging.getLogger("spark_watchdog")
    previous = logger.level
    logger.addHandler(trap)
    logger.setLevel(logging.ERROR)
    try:
        return run_virtual(run.main())
    finally:
        logger.removeHandler(trap)
        logger.setLevel(previous)
        run.store.close()
        if run.pair is not None:
            run.pair.close()
