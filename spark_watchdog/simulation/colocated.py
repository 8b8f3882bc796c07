"""Controllers on the Sparks themselves, in the simulation:
docs/simulation.md, "Controllers on the Sparks".

``simulate_colocated(seed)`` runs 2 or 4 simulated Sparks with a controller
on each node of the order (2 nodes: both; 4: two, sometimes all four). Each
is the real :class:`Controller`, told its node, with its own SQLite history
file and its own I/O, which meets the world from its host
(simulation/hosts.py): agents, SSH, the witness and the plug as its host
reaches them, and the other controllers' ``/v1/status`` (what each one last
published, as the real status page serves it) while that controller runs,
is not stopped and a path joins their hosts; else silence, or a refusal.

A controller dies with its host: stopped (every task kept back, as a pair's
paused leader) while its host is frozen, killed when its host goes down,
and started again by systemd, on the same history, once its host is up.
The run checks I1-I11 and I14 against each sender's own history and sight,
and I15-I17 (simulation/colocated_checks.py, simulation/freeze_spells.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import tempfile
from typing import Any, cast

from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.pair.fence import LONE
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.power.base import CommandSpacing, PowerState
from spark_watchdog.sdnotify import SystemdNotifier
from spark_watchdog.simulation.colocated_checks import PlacedChecks
from spark_watchdog.simulation.colocated_rest import PlacedTail, PlacedView
from spark_watchdog.simulation.fault_plays import FAULT_PLAYS
from spark_watchdog.simulation.freeze_spells import Spells
from spark_watchdog.simulation.hosts import HostNetwork
from spark_watchdog.simulation.loop import VirtualLoop
from spark_watchdog.simulation.pair import RESTART_AFTER_S, scratch_dir
from spark_watchdog.simulation.placed import FABRIC, Placed, placed_io
from spark_watchdog.simulation.placed_faults import PLACED_FAULTS, REPLAYED, PlacedFaults
from spark_watchdog.simulation.placed_report import PlacedReport
from spark_watchdog.simulation.process import Incarnation
from spark_watchdog.simulation.report import attempt_of
from spark_watchdog.simulation.run import Scripted, SelfTimed, _Notifier, _Run, _Store, trapped
from spark_watchdog.simulation.world import SimOutlet, World
from spark_watchdog.steps import StepName

PEERS_SHARE = 0.8  # runs whose agents pulse their peers over the fabric


class ColocatedRun(PlacedFaults, PlacedTail, _Run):
    """One run of controllers on the Sparks (the run of simulation/run.py, with
    its histories, processes, faults, checks and report its own)."""

    checks: PlacedChecks

    def __init__(
        self,
        seed: int,
        minutes: float,
        script: list[Scripted] | None,
        overrides: dict[str, Any] | None,
        self_timed: SelfTimed | None,
        peers: bool | None,
        nodes: int | None,
    ) -> None:
        self.placed_rng = random.Random(f"colocated {seed}")
        self.node_count = nodes
        self.placed: dict[str, Placed] = {}
        self.paths: list[str] = []
        peers = self.placed_rng.random() < PEERS_SHARE if peers is None else peers
        super().__init__(seed, minutes, None, script, overrides, None, self_timed, False, peers)
        world = self.world
        world.hosts = HostNetwork(
            world.now, world.nodes.values(), self.config.detection.freeze_after
        )
        self.spells = Spells(world, self.config, lambda text: self.checks.violate(text))
        stores = {h: p.store for h, p in self.placed.items()}
        self.checks = PlacedChecks(
            seed, world, stores, self.spells, dry_run=self.dry_run, errors=self.errors
        )
        self.view = PlacedView(self.placed, self.world, self.config)
        self.stopped_numbers: set[int] = set()

    # -- the cluster and the histories -----------------------------------------------

    def _draw_cluster(self, self_timed: SelfTimed | None) -> tuple[bool, Any, World]:
        """2 or 4 nodes, the order of controllers and its timings, then the rest as drawn."""
        rng = self.placed_rng
        count = self.node_count or rng.choice((2, 4))
        self.names = self.names[:count]
        placed = 2 if count == 2 or rng.random() < 0.7 else count
        order = rng.sample(self.names, placed)
        fence = rng.choice((10.0, 15.0, 20.0))
        least = 8.0 + fence  # the longest freeze_after drawn, and the fence delay
        takeover = rng.choice([t for t in (least, 30.0, 45.0, 60.0) if t >= least])
        fabric = rng.random() < 0.7
        controllers = [
            {
                "node": n,
                **({"urls": [f"http://{n}:9721", f"http://{n}{FABRIC}:9721"]} if fabric else {}),
            }
            for n in order
        ]
        mine: dict[str, Any] = {
            "colocated": {
                "controllers": controllers,
                "takeover_after": takeover,
                "fence_delay": fence,
            },
            "listen": {"address": "0.0.0.0"},
        }
        given = self.overrides
        sections = [*mine, *(s for s in given if s not in mine)]
        self.overrides = {s: {**mine.get(s, {}), **given.get(s, {})} for s in sections}
        return super()._draw_cluster(self_timed)

    def _open_history(self, pair: bool | None) -> HistoryStore:
        """Each controller's own history file; the run's view is the first one's."""
        assert self.config.colocated is not None
        for host in self.config.colocated.order:
            fd, path = tempfile.mkstemp(
                prefix="spark-watchdog-sim-", suffix=".db", dir=scratch_dir()
            )
            os.close(fd)
            self.paths.append(path)
            store = HistoryStore(path, clock=self.clock.time)
            self.placed[host] = Placed(host, store, CommandSpacing())
        return next(iter(self.placed.values())).store

    @property
    def fabric_urls(self) -> bool:
        """The controllers are heard over the fabric too."""
        placed = self.config.colocated
        return placed is not None and any(
            FABRIC in url for p in placed.controllers for url in p.urls or ()
        )

    # -- the processes ----------------------------------------------------------------

    def start_controller(self) -> None:
        """systemd on each Spark: a controller not running starts, where its host is up."""
        for placed in self.placed.values():
            self._start(placed)

    def _start(self, placed: Placed) -> None:
        now, node = self.world.now(), self.world.nodes[placed.host]
        waiting = placed.restart_at is not None and placed.restart_at > now
        if placed.incarnation.alive or node.phase != "up" or waiting:
            return
        incarnation = self.new_incarnation()
        incarnation.host = placed.host
        self.checks.host_of[incarnation.number] = placed.host
        if placed.controller is not None:
            placed.retired.extend(placed.controller.serving.budget.fault_restarts)
        placed.incarnation, placed.restart_at, placed.stopped_by = incarnation, None, set()
        controller = Controller(
            self.config,
            cast(HistoryStore, _Store(placed.store, self, incarnation)),
            io=placed_io(self.world, self.config, self.clock, placed, self.placed, self.checks),
            notifier=_Notifier(
                self.config, functools.partial(self.checks.said, incarnation), quiet=LONE.deposed
            ),
            systemd=SystemdNotifier(environ={}),
            node=placed.host,
        )
        placed.controller, placed.said = controller, None
        self.controller, self.incarnation = controller, incarnation
        self.spells.started(placed.host)
        self.spawn_as(incarnation, self._serve(placed, incarnation, controller))

    async def _serve(
        self, placed: Placed, incarnation: Incarnation, controller: Controller
    ) -> None:
        """The process: an error out of run() exits it; systemd starts it again."""
        try:
            await controller.run(asyncio.Event())
        except Exception:
            self.kill_quietly(incarnation)
            placed.restart_at = self.world.now() + RESTART_AFTER_S
            assert self.world.loop is not None
            self.world.loop.call_later(RESTART_AFTER_S, self.follow_hosts)

    def follow_hosts(self) -> None:
        """Each controller follows its host: stopped while it is frozen, killed when
        it goes down, started once it is up; then the freezes are looked at."""
        for node in self.world.nodes.values():
            node.step()
        for placed in self.placed.values():
            node = self.world.nodes[placed.host]
            if node.phase == "frozen":
                self._stop(placed, "host")
            elif node.phase != "up":
                if placed.incarnation.alive:
                    self._kill(placed)
                placed.restart_at = None  # systemd starts it when the host boots
            else:
                self._wake(placed, "host")
                self._start(placed)
        self.spells.look(self._unheard(), self._fit, self.view.calm)

    async def _watch_hosts(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.follow_hosts()

    def _stop(self, placed: Placed, why: str) -> None:
        if placed.incarnation.alive and why not in placed.stopped_by:
            placed.stopped_by.add(why)
            self.stopped_numbers.add(placed.incarnation.number)

    def _wake(self, placed: Placed, why: str) -> None:
        if why in placed.stopped_by:
            placed.stopped_by.discard(why)
            if not placed.stopped_by:
                self.stopped_numbers.discard(placed.incarnation.number)
                self._loop().resume()

    def _kill(self, placed: Placed) -> None:
        if placed.stopped_by:
            placed.stopped_by.clear()
            self.stopped_numbers.discard(placed.incarnation.number)
            self._loop().resume()  # its tasks run on, to be cancelled
        self.kill_quietly(placed.incarnation)

    def _held(self, task: asyncio.Task[Any]) -> bool:
        """The virtual loop keeps back every step of a stopped process's tasks."""
        numbers = self.stopped_numbers
        return bool(numbers) and any(task in self.tasks.get(n, ()) for n in numbers)

    def _loop(self) -> VirtualLoop:
        loop = self.world.loop
        assert isinstance(loop, VirtualLoop)
        return loop

    # -- the faults of the processes (simulation/placed_faults.py) --------------------

    def kill_placed(self, host: str, restart_after: float) -> None:
        placed = self.placed[host]
        if placed.incarnation.alive:
            self._kill(placed)
            placed.restart_at = self.world.now() + restart_after
            self.spells.stopped(host, restart_after)
            self._loop().call_later(restart_after, self.follow_hosts)

    def pause_placed(self, host: str, seconds: float) -> None:
        placed = self.placed[host]
        if placed.incarnation.alive and "fault" not in placed.stopped_by:
            self._stop(placed, "fault")
            self.spells.stopped(host, seconds)
            self.later(seconds, lambda: self._wake(placed, "fault"))

    def inject(self, fault: str, on: str | None = None) -> None:
        self.spells.injected(fault)
        if fault in PLACED_FAULTS or fault in REPLAYED:
            self.faults[fault] = self.faults.get(fault, 0) + 1
            self.play_placed(fault, on)
        else:
            super().inject(fault, on)
        self.follow_hosts()

    def heal_all(self) -> None:
        super().heal_all()
        self.network.heal()
        for placed in self.placed.values():
            self._wake(placed, "fault")
        self.follow_hosts()

    def _schedule_faults(self, loop: asyncio.AbstractEventLoop, fault_window: float) -> None:
        """The script's faults, or random ones of the run's own menu."""
        script = self.script
        unknown = sorted({f for _, f, _ in script or () if f not in FAULT_PLAYS})
        if unknown:
            raise ValueError(f"unknown simulated fault {', '.join(map(repr, unknown))}")
        schedule = script if script is not None else self.placed_schedule(fault_window)
        for at, fault, on in schedule:
            loop.call_at(at, self.inject, fault, on)

    # -- what the checks need -----------------------------------------------------------

    def _on_command(self, outlet: SimOutlet, target: PowerState, landed: bool, number: int) -> None:
        failing = self.world.now() < self.history_fault_until
        self.checks.sent(outlet.node.name, target, number, landed=landed, failing=failing)
        self._loop().call_soon(self.follow_hosts)  # a host that loses power loses its controller

    def _unheard(self) -> frozenset[frozenset[str]]:
        """Pairs of running controllers whose hosts no path joins."""
        live = [h for h, p in self.placed.items() if p.running()]
        network, fabric = self.network, self.fabric_urls
        return frozenset(
            frozenset((a, b))
            for i, a in enumerate(live)
            for b in live[i + 1 :]
            if network.cut_off(a, self.world.nodes[b])
            and not (fabric and network.fabric_path(a, b))
        )

    def _fit(self, node: str) -> bool:
        """At a freeze: the design promises its recovery (no dry run, no hold,
        budget left for every controller that may act)."""
        return not self.dry_run and self.view.fit(
            node, self.world.truth.commands, self.checks.host_of
        )

    # -- the run -----------------------------------------------------------------------

    async def main(self) -> PlacedReport:
        self.world.loop = asyncio.get_running_loop()
        loop = self._loop()
        loop.set_task_factory(self.task_factory)
        loop.set_exception_handler(self.checks.unhandled)
        loop.paused = self._held
        self.start_controller()
        watcher = loop.create_task(self._watch_hosts())
        fault_window = self.minutes * 60.0
        self._schedule_faults(loop, fault_window)
        elapsed, how = await self._faults_and_tail(loop, fault_window)
        self.follow_hosts()
        acting = self.view.acting()
        restarts = {h: p.serving_restarts() for h, p in self.placed.items()}
        self.checks.at_placed_end(self.config, acting, self.view.live(), restarts)
        self.final_verdicts = {n: c.watches[n].verdict for n, c in acting.items()}
        watcher.cancel()
        for placed in self.placed.values():
            self._kill(placed)
        await asyncio.sleep(0)
        return _report(self, elapsed, how)

    def close(self) -> None:
        for placed in self.placed.values():
            placed.store.close()
        for path in self.paths:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(OSError):
                    os.unlink(path + suffix)


def _report(run: ColocatedRun, elapsed: float, tail: str) -> PlacedReport:
    truth = run.world.truth
    incidents = [
        i
        for p in run.placed.values()
        for i in p.store.list_incidents(limit=10_000)
        if not i.dry_run
    ]
    assert run.config.colocated is not None
    return PlacedReport(
        seed=run.seed,
        simulated_s=elapsed,
        nodes=len(run.names),
        violations=list(truth.violations),
        faults=dict(run.faults),
        commands=len(truth.commands),
        incidents=len(incidents),
        recovered=sum(1 for i in incidents if i.resolution == "recovered"),
        crashes=run.crashes,
        dry_run=run.dry_run,
        writes=run.writes,
        sent=[(c.node, c.target.value) for c in truth.commands],
        sent_at=[c.at for c in truth.commands],
        alerts=[e.kind for e in run.checks.events],
        verdicts=run.final_verdicts,
        resolutions=[str(i.resolution) for i in incidents],
        kinds=[i.kind for i in incidents],
        timed_ons=len(truth.timed_ons),
        second_tries=sum(
            1
            for p in run.placed.values()
            for i in p.store.list_incidents(limit=10_000)
            if not i.dry_run
            for s in p.store.steps(i.id)
            if s.step == StepName.RUNG_STARTED and attempt_of([s]) == 2
        ),
        tail=tail,
        order=run.config.colocated.order,
        senders=[run.checks.host_of.get(c.incarnation, "?") for c in truth.commands],
        processes=run.incarnations,
        freezes=run.spells.figures(),
    )


def simulate_colocated(
    seed: int,
    minutes: float = 10.0,
    *,
    nodes: int | None = None,
    script: list[Scripted] | None = None,
    overrides: dict[str, Any] | None = None,
    self_timed: SelfTimed | None = None,
    peers: bool | None = None,
) -> PlacedReport:
    """One run of controllers on the Sparks: ``minutes`` of random faults (or
    the ``script``), then a quiet tail. ``nodes``: 2 or 4 (None: drawn);
    ``overrides``: config sections, ``colocated`` among them (its order, its
    timings); the rest as :func:`spark_watchdog.simulation.run.simulate`."""
    run = ColocatedRun(seed, minutes, script, overrides, self_timed, peers, nodes)
    return cast(PlacedReport, trapped(run))
