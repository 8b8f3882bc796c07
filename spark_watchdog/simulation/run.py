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
from spark_watchdog.controller.pair.fence import LONE, Fence
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.errors import StoreFull, StoreLocked
from spark_watchdog.history.core import is_write
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.power.base import CommandSpacing, PowerState
from spark_watchdog.sdnotify import SystemdNotifier
from spark_watchdog.simulation.fault_plays import FAULT_PLAYS as FAULT_PLAYS
from spark_watchdog.simulation.fault_plays import FAULTS as FAULTS
from spark_watchdog.simulation.fault_plays import FaultPlays
from spark_watchdog.simulation.loop import VirtualLoop, run_virtual
from spark_watchdog.simulation.pair import SimPair
from spark_watchdog.simulation.process import PROCESS, Incarnation, Killed
from spark_watchdog.simulation.report import ErrorTrap, with_incidents
from spark_watchdog.simulation.report import Report as Report
from spark_watchdog.simulation.run_checks import RunChecks
from spark_watchdog.simulation.schedule import Scripted as Scripted
from spark_watchdog.simulation.schedule import pair_faults, random_faults
from spark_watchdog.simulation.seams import controller_io
from spark_watchdog.simulation.sim_config import random_config
from spark_watchdog.simulation.tail import QuietTail
from spark_watchdog.simulation.world import SimOutlet, World

SelfTimed = Literal["never", "always", "failing"]
# The share of random runs with a controller pair (simulation/pair.py).
PAIR_SHARE = 0.3
PEERS_SHARE = 0.5  # runs whose agents pulse their peers over the fabric


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
        """The store's attribute; a method wrapped, once (a controller calls
        its store's methods many times a tick): the wrapper stays on this
        object, so the next lookup finds it and this is not called again."""
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

        if name not in vars(self._store):  # the class's method, never rebound
            self.__dict__[name] = call
        return call


class _Run(FaultPlays, QuietTail):
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
        self.names = [f"spark-{i + 1}" for i in range(4)]
        self.dry_run, self.config, self.world = self._draw_cluster(self_timed)
        self.world.on_command_hook = self._on_command
        self.clock = _SimClock(self.world, 1_800_000_000.0)
        # A pair's own draws: a run without one replays as it did before pairs.
        self.pair_rng = random.Random(f"pair {seed}")
        self.pair: SimPair | None = None
        # The newer faults' own draws (a link, an Xid): a run without them replays as before.
        self.newer_rng = random.Random(f"newer faults {seed}")
        self.world.peers_on = self.newer_rng.random() < PEERS_SHARE if peers is None else peers
        self.store = self._open_history(pair)
        self.history_fault_until = -1.0
        self.history_fault: type[StoreLocked] | type[StoreFull] = StoreLocked
        self.incarnation = Incarnation(0, alive=False)
        self.incarnations = 0
        self.controller: Controller | None = None
        self.tasks: dict[int, set[asyncio.Task[Any]]] = {}
        self.crashes = 0
        self.faults: dict[str, int] = {}
        self.errors: list[str] = []
        self.checks = RunChecks(
            seed,
            self.world,
            self.store,
            dry_run=self.dry_run,
            errors=self.errors,
            check_sender=None if self.pair is None else self.pair.check_sender,
        )
        self.crash_after_command: int | None = None
        self.final_verdicts: dict[str, str] = {}
        # Temporary faults still to end (heal_all ends them at the quiet tail).
        self.pending_heals: list[Callable[[], Any]] = []
        self.spacing = CommandSpacing()
        # Serving restarts for serving faults of controller processes gone (I8).
        self.retired_serving_restarts: list[tuple[float, int]] = []

    def _draw_cluster(self, self_timed: SelfTimed | None) -> tuple[bool, ControllerConfig, World]:
        """Dry run or not, the configuration and the world, drawn from the seed in
        this order. ``self_timed``: every outlet can (or cannot) switch itself
        back on, its timer working or not; None: as drawn."""
        dry_run = self.rng.random() < 0.08
        if "dry_run" in self.overrides.get("guards", {}):
            dry_run = bool(self.overrides["guards"]["dry_run"])
        config = random_config(self.rng, self.names, dry_run, self.overrides)
        world = World(self.names, self.rng, config.detection.freeze_after)
        if self_timed is not None:
            for outlets in world.outlets.values():
                for outlet in outlets:
                    outlet.self_timed = self_timed != "never"
                    outlet.timer_fails = self_timed == "failing"
        return dry_run, config, world

    def _open_history(self, pair: bool | None) -> HistoryStore:
        """The run's history: in memory, or a pair's shared database (then
        ``self.pair``); ``pair`` None: by chance, the pair's first draw."""
        if pair is None:
            pair = self.pair_rng.random() < PAIR_SHARE
        if not pair:
            return HistoryStore(":memory:", clock=lambda: self.clock.time())
        # The database server's clock: the hosts' clocks may step, not its.
        self.pair = SimPair(self, lambda: self.clock.base + self.world.now())
        # The run's own view of the shared history (invariants, operators' holds).
        return HistoryStore(
            self.pair.path, clock=self.clock.time, database_clock=self.pair.database_clock
        )

    # -- the controller process ----------------------------------------------------

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
            self.retired_serving_restarts.extend(self.controller.serving.budget.fault_restarts)
        clock = self.clock if clock is None else clock
        controller = Controller(
            self.config,
            cast(HistoryStore, _Store(store, self, incarnation)),
            io=controller_io(self.world, self.config, incarnation, clock, fence, self.spacing),
            notifier=_Notifier(
                self.config, functools.partial(self.checks.said, incarnation), quiet=fence.deposed
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

    # -- a crash at a command ---------------------------------------------

    def _on_command(self, outlet: SimOutlet, target: PowerState, landed: bool, number: int) -> None:
        failing = self.world.now() < self.history_fault_until
        self.checks.command(outlet.node.name, target, number, failing=failing)
        if self.crash_after_command is not None and len(self.world.truth.commands) + 1 == (
            self.crash_after_command
        ):
            assert self.world.loop is not None
            self.world.loop.call_soon(self.kill_quietly)

    # -- the run ----------------------------------------------------------------

    async def main(self) -> Report:
        loop = asyncio.get_running_loop()
        self.world.loop = loop
        loop.set_task_factory(self.task_factory)
        loop.set_exception_handler(self.checks.unhandled)
        if self.pair is not None:
            assert isinstance(loop, VirtualLoop)
            loop.paused = self.pair.paused  # a paused leader's tasks wait (SIGSTOP)
        if self.prepare is not None:
            self.prepare(self.store)  # what an earlier controller left in the history
        self.start_controller()
        fault_window = self.minutes * 60.0
        self._schedule_faults(loop, fault_window)
        elapsed, how = await self._faults_and_tail(loop, fault_window)
        assert self.controller is not None
        restarts = sorted(at for at, _ in self.serving_fault_restarts())
        self.checks.at_end(self.controller, self.config, restarts)
        self.final_verdicts = {n: w.verdict for n, w in self.controller.watches.items()}
        if self.pair is not None:
            self.pair.stop()
        self.kill_quietly()
        await asyncio.sleep(0)
        return self.report(elapsed, how)

    async def _faults_and_tail(
        self, loop: asyncio.AbstractEventLoop, fault_window: float
    ) -> tuple[float, str]:
        """The fault window and the quiet tail (simulation/tail.py): the time
        reached, and how the tail ended."""
        g, policy = self.config.guards, self.config.policy
        # Long enough for the longest ladder begun late in it: a cut as long as a
        # clock latch's, the boot wait, and the serving restart that follows
        # (a head that never gets ready holds it for serving.start_timeout).
        cut = max(policy.power_off_seconds, policy.clock_latch_off_seconds)
        tail = 4 * (cut + g.boot_timeout + 60.0) + self.config.serving.start_timeout + 120.0
        elapsed, how = await self._faults_then_rest(loop, fault_window, fault_window + tail)
        # A ladder begun late in the tail (a clock latch answered once its node
        # was free) runs to its end, for at most one more of the longest: the
        # invariants judge where a ladder ends, not its middle.
        end = loop.time() + cut + g.boot_timeout + 60.0 + self.config.serving.start_timeout
        while self._ladder_running() and loop.time() < end:
            await asyncio.sleep(5.0)
            elapsed = loop.time()
        return elapsed, how

    def _schedule_faults(self, loop: asyncio.AbstractEventLoop, fault_window: float) -> None:
        """The script's faults, or random ones (a Poisson process) over the fault window."""
        schedule = random_faults(self.rng, fault_window, scripted=self.script is not None)
        unknown = sorted({f for _, f, _ in self.script or () if f not in FAULT_PLAYS})
        if unknown:
            raise ValueError(f"unknown simulated fault {', '.join(map(repr, unknown))}")
        if self.pair is not None and self.script is None:
            schedule.extend(pair_faults(self.pair_rng, fault_window))
        if self.world.peers_on and self.script is None:
            schedule.extend(self.newer_schedule(fault_window))
        for at, fault, on in self.script if self.script is not None else schedule:
            loop.call_at(at, self.inject, fault, on)

    def report(self, elapsed: float, tail: str) -> Report:
        truth = self.world.truth
        seen = Report(
            seed=self.seed,
            simulated_s=elapsed,
            nodes=len(self.names),
            violations=list(truth.violations),
            faults=dict(self.faults),
            commands=len(truth.commands),
            crashes=self.crashes,
            dry_run=self.dry_run,
            writes=self.writes,
            sent=[(c.node, c.target.value) for c in truth.commands],
            sent_at=[c.at for c in truth.commands],
            alerts=[e.kind for e in self.checks.events],
            verdicts=self.final_verdicts,
            timed_ons=len(truth.timed_ons),
            pair=self.pair is not None,
            epochs=0 if self.pair is None else self.pair.epochs,
            takeovers=0 if self.pair is None else self.pair.takeovers,
            tail=tail,
        )
        return with_incidents(seen, self.store)

    def close(self) -> None:
        """The run's histories closed (and a pair's database file removed)."""
        self.store.close()
        if self.pair is not None:
            self.pair.close()


def trapped(run: _Run) -> Report:
    """Run ``run``; every traceback the controller logs meanwhile is one of its errors."""
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
        run.close()


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
    return trapped(run)
