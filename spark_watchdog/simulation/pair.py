"""The controller pair in the simulation (docs/simulation.md, "How it works").

Two controller processes share one SQLite history, which holds the real
lease (history/leadership.py, the contract both engines pass). Each runs
what a pair's controller runs: ``stand_by`` until it takes the lease, then
``lead`` (controller/pair/pair.py), which builds the real controller on I/O
fenced by that lease, keeps the lease, and cancels everything when it is
lost; the process then exits, and starts again later as a new standby, as
systemd would start it. Only the lease keeper differs: a task of the
simulation's loop instead of a thread (``LoopLeaseKeeper``).

Faults: the leader paused (every task of it kept back by the virtual loop,
as under SIGSTOP, until it wakes), killed, or cut from the history (every
read and write of its connection fails). The invariant they test, I12: a
power command reaches a device only while its sender holds an unexpired
lease, so no two controllers' commands ever share an epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.pair.fence import Fence
from spark_watchdog.controller.pair.pair import (
    LeadershipLost,
    LeadSeams,
    LoopLeaseKeeper,
    lead,
    stand_by,
)
from spark_watchdog.errors import StoreError
from spark_watchdog.history.core import Connection
from spark_watchdog.history.database_time import DatabaseTime
from spark_watchdog.history.leadership import Leader, Lease, current
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.sdnotify import SystemdNotifier
from spark_watchdog.simulation.loop import VirtualLoop
from spark_watchdog.simulation.process import Incarnation, Killed
from spark_watchdog.simulation.world import World

T = TypeVar("T")

PAIR_FAULTS = ("leader-pause", "leader-kill", "leader-cut")
# How long systemd waits before it starts an exited controller again.
RESTART_AFTER_S = 5.0


class Run(Protocol):
    """What the pair needs of the simulation run it is part of (simulation/run.py)."""

    world: World
    config: ControllerConfig
    store: HistoryStore  # the run's own view of the shared history
    incarnation: Incarnation  # the process whose controller the run watches
    tasks: dict[int, set[asyncio.Task[Any]]]
    errors: list[str]

    @property
    def clock(self) -> Clock:
        """The hosts' clock: its wall time may step."""
        ...

    def new_incarnation(self) -> Incarnation: ...

    def new_controller(
        self, incarnation: Incarnation, store: HistoryStore, clock: Clock | None, fence: Fence
    ) -> Controller: ...

    def spawn_as(self, incarnation: Incarnation, coro: Coroutine[Any, Any, Any]) -> None: ...

    def kill_quietly(self, incarnation: Incarnation | None = None) -> None: ...

    def later(self, delay: float, fn: Callable[[], Any]) -> None: ...


class SimHistory(HistoryStore):
    """One controller process's connection to the shared history; it may be cut."""

    def __init__(self, path: str, cut: Callable[[], bool], **kwargs: Any) -> None:
        self._cut = cut
        super().__init__(path, **kwargs)

    def _link(self, doing: str) -> None:
        if self._cut():
            raise StoreError(self.path, f"the history cannot be reached while {doing} (link cut)")

    @contextlib.contextmanager
    def _writing(
        self, doing: str, *, fenced: bool = True, serialized: bool = True
    ) -> Iterator[Connection]:
        self._link(doing)
        with super()._writing(doing, fenced=fenced, serialized=serialized) as conn:
            yield conn

    @contextlib.contextmanager
    def _reading(self, doing: str) -> Iterator[Connection]:
        self._link(doing)
        with super()._reading(doing) as conn:
            yield conn


class PairClock:
    """A pair controller's clock: virtual monotonic time, and as wall time the
    earlier of the database's (as its lease last read it) and its host's."""

    def __init__(self, world: World, shared: DatabaseTime, host: Clock) -> None:
        self.world = world
        self.shared = shared
        self.host = host

    def monotonic(self) -> float:
        return self.world.now()

    def time(self) -> float:
        return min(self.shared.earliest(), self.host.time())

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


@dataclass
class Link:
    """One process's connection to the shared history: what it stamps records
    with (the latest the database's time may be), and whether it is cut."""

    world: World
    host: Callable[[], float]
    cut_until: float = -1.0
    database_time: DatabaseTime | None = None

    def cut(self) -> bool:
        return self.world.now() < self.cut_until

    def stamp(self) -> float:
        shared = self.database_time
        return self.host() if shared is None else shared.latest()


@dataclass
class Member:
    """One of the two controller processes, across its restarts."""

    name: str
    store: SimHistory
    link: Link
    incarnation: Incarnation = field(default_factory=lambda: Incarnation(0, alive=False))
    lease: Lease | None = None
    controller: Controller | None = None
    paused: bool = False


class SimPair:
    """The two controller processes of a pair run, and the pair's faults."""

    def __init__(self, run: Run, database_clock: Callable[[], float]) -> None:
        self.run = run
        self.database_clock = database_clock
        fd, self.path = tempfile.mkstemp(
            prefix="spark-watchdog-sim-", suffix=".db", dir=scratch_dir()
        )
        os.close(fd)
        self.members: list[Member] = []
        for name in ("a", "b"):
            link = Link(run.world, run.clock.time)
            store = SimHistory(self.path, link.cut, clock=link.stamp, database_clock=database_clock)
            self.members.append(Member(name, store, link))
        self.holders: dict[int, str] = {}  # incarnation number -> lease holder
        self.epochs = 0  # leaderships taken
        self.takeovers = 0  # leaderships taken while another process had led

    # -- processes ---------------------------------------------------------------

    def start(self) -> None:
        """Start every member process that is not running (systemd's restart)."""
        for member in self.members:
            if not member.incarnation.alive:
                self._start(member)

    def _start(self, member: Member) -> None:
        run = self.run
        incarnation = run.new_incarnation()
        member.incarnation = incarnation
        database_time = DatabaseTime(monotonic=run.world.now, fallback=run.clock.time)
        member.link.database_time = database_time
        holder = f"controller-{member.name}:{incarnation.number}"
        self.holders[incarnation.number] = holder
        timing = run.config.leadership
        member.lease = Lease(
            member.store,
            lease_s=timing.lease,
            send_deadline_s=timing.send_deadline,
            holder=holder,
            monotonic=run.world.now,
            clock=database_time,
        )
        member.store.set_fence(member.lease)
        member.controller = None
        run.spawn_as(incarnation, self._process(member, incarnation))

    async def _process(self, member: Member, incarnation: Incarnation) -> None:
        run = self.run
        lease, timing = member.lease, run.config.leadership
        assert lease is not None

        async def inline(fn: Callable[[], T]) -> T:
            incarnation.check()
            return fn()

        stop = asyncio.Event()
        systemd = SystemdNotifier(environ={})
        try:
            leader = await stand_by(lease, timing, stop, systemd, blocking=inline)
            if leader is None:
                return
            self.epochs += 1
            if self.epochs > 1:
                self.takeovers += 1
            await lead(run.config, lease, stop, self._seams(member, incarnation))
        except (LeadershipLost, StoreError, Killed):
            pass  # the process exits; systemd starts it again
        except Exception as exc:  # a bug: counted by the run's error trap too
            run.errors.append(f"controller {member.name} failed: {exc!r}")
        if incarnation.alive:
            run.kill_quietly(incarnation)
        run.later(RESTART_AFTER_S, self.start)

    def _seams(self, member: Member, incarnation: Incarnation) -> LeadSeams:
        run = self.run
        database_time = member.link.database_time
        assert database_time is not None

        def controller(fence: Fence) -> Controller:
            clock = PairClock(run.world, database_time, run.clock)
            made = run.new_controller(incarnation, member.store, clock, fence)
            member.controller = made
            return made

        def keeper(lease: Lease, timing: Any, on_lost: Callable[[str], None]) -> LoopLeaseKeeper:
            return LoopLeaseKeeper(lease, timing, on_lost, run.world.now)

        return LeadSeams(controller=controller, keeper=keeper)

    # -- faults ----------------------------------------------------------------------

    def leader(self) -> Member | None:
        """The member whose controller the run watches now (the latest to lead)."""
        return next((m for m in self.members if m.incarnation is self.run.incarnation), None)

    def inject(self, fault: str, seconds: float) -> None:
        member = self.leader()
        if member is None or not member.incarnation.alive:
            return
        if fault == "leader-kill":
            self.resume(member)
            self.run.kill_quietly(member.incarnation)
            self.run.later(seconds, self.start)
        elif fault == "leader-cut":
            member.link.cut_until = self.run.world.now() + seconds
        elif fault == "leader-pause" and not member.paused:
            member.paused = True
            self.run.later(seconds, lambda: self.resume(member))

    def paused(self, task: asyncio.Task[Any]) -> bool:
        return any(
            m.paused and task in self.run.tasks.get(m.incarnation.number, ()) for m in self.members
        )

    def resume(self, member: Member) -> None:
        if member.paused:
            member.paused = False
            loop = self.run.world.loop
            assert isinstance(loop, VirtualLoop)
            loop.resume()

    def steady(self) -> bool:
        """Nobody paused or cut: what a settled run needs."""
        now = self.run.world.now()
        return not any(m.paused or m.link.cut_until > now for m in self.members)

    def stop(self) -> None:
        """The end of the run: every process woken and killed."""
        for member in self.members:
            self.resume(member)
            self.run.kill_quietly(member.incarnation)

    def heal(self) -> None:
        """The quiet tail: nobody paused or cut, every process running."""
        for member in self.members:
            self.resume(member)
            member.link.cut_until = -1.0
        self.start()

    # -- I12 -----------------------------------------------------------------------

    def check_sender(self, number: int, where: str) -> str | None:
        """I12: the command's sender holds an unexpired lease (None), or the violation."""
        holder = self.holders.get(number)
        seen: Leader | None = current(self.run.store)
        if seen is None or holder is None:
            return f"I12 {where} from {holder}, and nobody leads"
        if seen.holder != holder:
            return f"I12 {where} from {holder}, while {seen.holder} leads (epoch {seen.epoch})"
        if seen.expired:
            return f"I12 {where} from {holder}, whose lease ran out {-seen.left:.1f}s before"
        return None

    def close(self) -> None:
        for member in self.members:
            member.store.close()
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(OSError):
                os.unlink(self.path + suffix)


def scratch_dir() -> str | None:
    """Memory-backed where there is one: the history's fsyncs cost nothing there."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
