"""A controller of a pair on a PostgreSQL history (docs/design.md, "Controller pair").

A standby until it takes the lease (history/leadership.py), then, after
``leadership.settle``, the controller itself: it resumes every open
incident from the shared history, as after a restart. While it leads it
renews the lease every ``renew_every``; when a renewal says the lease is
not ours any more, or none has succeeded for ``give_up_after``, it stops
sending at once (the fence refuses every write, the send gate every
command), cancels everything it was doing and exits with an error, and
systemd starts it again as a standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from spark_watchdog.config.controller import ControllerConfig, LeadershipConfig
from spark_watchdog.controller.clock import SharedWallClock
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.io import ControllerIO
from spark_watchdog.controller.page.page_api import page_endpoint, standby_endpoint
from spark_watchdog.controller.page.status_api import StatusEndpoint
from spark_watchdog.controller.pair.fence import Fence
from spark_watchdog.controller.record.notify import Event
from spark_watchdog.errors import StoreError, WatchdogError
from spark_watchdog.history.database_time import DatabaseTime
from spark_watchdog.history.leadership import Leader, Lease, end_lease
from spark_watchdog.history.postgres import PostgresHistoryStore
from spark_watchdog.sdnotify import SystemdNotifier

log = logging.getLogger("spark_watchdog.controller.pair.pair")

T = TypeVar("T")


# How long the tasks of a lost epoch, and its leadership_lost alert, get to end
# before the process exits all the same.
STOP_WITHIN_S = 3.0


class LeadershipLost(WatchdogError):
    """This controller stopped leading; it exits and starts again as a standby."""


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def _in_thread(fn: Callable[[], T]) -> T:
    return await asyncio.to_thread(fn)


async def stand_by(
    lease: Lease,
    timing: LeadershipConfig,
    stop: asyncio.Event,
    systemd: SystemdNotifier,
    view: dict[str, Any] | None = None,
    blocking: Callable[[Callable[[], Leader]], Awaitable[Leader]] = _in_thread,
) -> Leader | None:
    """Try to take the lease every ``renew_every`` until it is ours (None: stopped).

    ``view``, when given, is kept up to date with what the standby last saw
    (its ``/v1/status`` and ``/metrics``, controller/page/status_api.py).
    ``blocking`` runs the lease's database work (a thread; the simulation's
    history is in memory and runs inline).
    """
    said: tuple[str, int] | None = None
    unreachable = False
    seen = {} if view is None else view
    seen.update(holder=lease.holder, leader=None, history="not read yet")
    while not stop.is_set():
        try:
            leader = await blocking(lease.acquire)
        except StoreError as exc:
            if not unreachable:
                log.warning("standby: the history cannot be reached: %s", exc)
            unreachable = True
            seen.update(leader=None, history=f"unreachable: {exc}")
            systemd.status(f"standby: the history cannot be reached: {exc}")
        else:
            unreachable = False
            seen.update(leader=leader.to_json(), history="ok")
            if lease.epoch is not None:
                return leader
            if said != (leader.holder, leader.epoch):
                said = (leader.holder, leader.epoch)
                log.info(
                    "standby: %s leads at epoch %d (%.1fs of lease left)",
                    leader.holder,
                    leader.epoch,
                    leader.left,
                )
            systemd.status(f"standby: {leader.holder} leads at epoch {leader.epoch}")
        systemd.watchdog()
        await _pause(stop, timing.renew_every)
    return None


async def keep_lease(
    lease: Lease,
    timing: LeadershipConfig,
    stopping: asyncio.Event,
    renew: Callable[[], Awaitable[bool]],
    monotonic: Callable[[], float],
) -> str | None:
    """Renew every ``renew_every`` until stopped (None) or lost (why).

    Lost: a renewal says the lease is not ours, or none has succeeded for
    ``give_up_after``; a renewal that hangs is waited for no longer than that.
    """
    last_renewed = monotonic()
    problem = "no renewal yet"
    while True:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stopping.wait(), timing.renew_every)
            return None  # stopped
        began = monotonic()
        # Never wait past give_up_after since the last renewal, whatever this one does.
        left = max(0.1, timing.give_up_after - (began - last_renewed))
        try:
            renewed = await asyncio.wait_for(renew(), left)
        except asyncio.TimeoutError:
            problem = "the renewal did not answer"
        except Exception as exc:  # any failed renewal counts as one
            problem = str(exc) or type(exc).__name__
        else:
            if renewed:
                last_renewed = began
                continue
            return "the lease expired, was stepped down or another controller took it"
        silent = monotonic() - last_renewed
        if silent >= timing.give_up_after:
            return f"no renewal for {silent:.1f}s (last problem: {problem})"


class Keeper(Protocol):
    """What keeps a leader's lease: started when it leads, stopped when it stops."""

    def start(self) -> None: ...

    def stop(self) -> None: ...


# A keeper for the lease, the timing, and what to call (once) when the lease is lost.
KeeperFactory = Callable[[Lease, LeadershipConfig, Callable[[str], None]], Keeper]


class LeaseKeeper:
    """Renews the lease every ``renew_every`` from a thread of its own, until it is lost.

    Neither the controller's event loop nor its default thread pool: the
    controller's own work (a sweep, history writes and reads) may keep both
    busy for longer than ``give_up_after`` on a loaded machine while the link
    is healthy, and a renewal waiting behind it would give the lease up for
    nothing. The thread runs a small event loop of its own (its waits are
    the loop's, which a host clock moved by libfaketime in the tests does
    not upset, where a thread's timed waits hang). When a renewal says the
    lease is not ours, or none has succeeded for ``give_up_after``, the
    keeper fences this process at once (``Lease.lost``: no write, no send
    from here, whatever the controller's loop is doing) and then calls
    ``on_lost`` with why, once, from its thread.
    """

    def __init__(
        self,
        lease: Lease,
        timing: LeadershipConfig,
        on_lost: Callable[[str], None],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lease = lease
        self.timing = timing
        self._on_lost = on_lost
        self._monotonic = monotonic
        self._loop = asyncio.new_event_loop()
        self._stopping = asyncio.Event()  # set on the keeper's own loop
        self._thread = threading.Thread(target=self._keep, name="lease-keeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Renew no more (a clean stop); never blocks on a renewal in flight."""
        with contextlib.suppress(RuntimeError):  # its loop closed: it has ended already
            self._loop.call_soon_threadsafe(self._stopping.set)

    def _keep(self) -> None:
        # The renewal itself runs in one more thread, so that the keeper can
        # give up on time while a renewal hangs on a dark link.
        renewer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease-renewal")

        async def renew() -> bool:
            return await self._loop.run_in_executor(renewer, self.lease.renew)

        try:
            why = self._loop.run_until_complete(
                keep_lease(self.lease, self.timing, self._stopping, renew, self._monotonic)
            )
        finally:
            renewer.shutdown(wait=False, cancel_futures=True)
            self._loop.close()
        if why is not None:
            self.lease.lost()  # whatever ended the loop: no write, no send from here
            self._on_lost(why)


class LoopLeaseKeeper:
    """The same renewals as a task of the running event loop, the renewal
    inline: for the simulation, whose history is in memory and whose time
    is virtual (a thread would make a run depend on the host's scheduler)."""

    def __init__(
        self,
        lease: Lease,
        timing: LeadershipConfig,
        on_lost: Callable[[str], None],
        monotonic: Callable[[], float],
    ) -> None:
        self.lease = lease
        self.timing = timing
        self._on_lost = on_lost
        self._monotonic = monotonic
        self._stopping = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._keep(), name="lease-keeper")

    def stop(self) -> None:
        self._stopping.set()

    async def _keep(self) -> None:
        async def renew() -> bool:
            return self.lease.renew()

        why = await keep_lease(self.lease, self.timing, self._stopping, renew, self._monotonic)
        if why is not None:
            self.lease.lost()
            self._on_lost(why)


@dataclass(frozen=True)
class LeadSeams:
    """What a leader is built from: in production, the controller on the real
    I/O with a thread keeping its lease and its status endpoint; in the
    simulation, the same controller on simulated I/O and virtual time."""

    # The controller of this epoch, on I/O fenced by ``fence``.
    controller: Callable[[Fence], Controller]
    keeper: KeeperFactory = LeaseKeeper
    # Serves /v1/status while it leads (None: no endpoint).
    endpoint: Callable[[Controller], StatusEndpoint] | None = None


def production_seams(config: ControllerConfig, lease: Lease, systemd: SystemdNotifier) -> LeadSeams:
    def controller(fence: Fence) -> Controller:
        # Steps are stamped, and resumed waits measured, on the database's clock.
        io = ControllerIO.production(config, SharedWallClock(lease.clock.earliest), fence)
        return Controller(config, lease.store, io=io, systemd=systemd)

    def endpoint(controller: Controller) -> StatusEndpoint:
        loop = asyncio.get_running_loop()  # lead() builds it on the controller's loop

        async def step_down() -> dict[str, Any] | None:
            ended = await asyncio.to_thread(end_lease, lease.store)
            return None if ended is None else ended.to_json()

        return page_endpoint(config, controller, controller, lambda: loop, step_down=step_down)

    return LeadSeams(controller=controller, endpoint=endpoint)


async def _open_lease(
    config: ControllerConfig,
) -> tuple[PostgresHistoryStore, PostgresHistoryStore, Lease]:
    """The history, the lease's own connection for its renewals
    (history/leadership.py), and the lease over them, on one wall clock for
    the pair: the database's (history/database_time.py)."""
    timing = config.leadership
    database_time = DatabaseTime()
    store, renewals = [
        await asyncio.to_thread(
            PostgresHistoryStore,
            config.history,
            password_file=config.history_password_file,
            clock=database_time.latest,
        )
        for _ in range(2)
    ]
    lease = Lease(
        store,
        lease_s=timing.lease,
        send_deadline_s=timing.send_deadline,
        clock=database_time,
        renewals=renewals,
    )
    return store, renewals, lease


async def serve_pair(config: ControllerConfig) -> None:
    """Run as one controller of a pair until SIGTERM or SIGINT, or until it stops leading.

    :raises LeadershipLost: it led and stopped leading; its tasks are cancelled
        and the process must exit now (``run_pair``), without waiting for a
        thread that may be blocked on a dark history link.
    """
    timing = config.leadership
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    store, renewals, lease = await _open_lease(config)
    systemd = SystemdNotifier()
    lost = False
    try:
        store.set_fence(lease)
        systemd.ready(f"standby ({lease.holder})")
        view: dict[str, Any] = {}
        standby = standby_endpoint(config, lambda: dict(view))
        standby.start()
        try:
            leader = await stand_by(lease, timing, stop, systemd, view)
        finally:
            standby.stop()  # the leader's own endpoint takes the address
        if leader is None:
            return
        log.warning("leading at epoch %d as %s", leader.epoch, lease.holder)
        await lead(config, lease, stop, production_seams(config, lease, systemd))
    except LeadershipLost:
        lost = True
        raise
    finally:
        if lease.epoch is not None and stop.is_set():
            # A clean stop: a standby takes over once what our last checked
            # write let out has left (fence_s), not after the whole lease.
            with contextlib.suppress(StoreError):
                await asyncio.to_thread(lease.step_down)
        systemd.stopping()
        if not lost:
            # After a lost lease the exit closes them: closing waits for a
            # thread that may be blocked on the dark link.
            renewals.close()
            store.close()


async def lead(
    config: ControllerConfig, lease: Lease, stop: asyncio.Event, seams: LeadSeams
) -> None:
    """Lead until ``stop`` (a clean stop) or until the lease is lost.

    :raises LeadershipLost: the lease was lost, or the controller failed; every
        task of the epoch is cancelled, and the process must exit now.
    """
    controller = seams.controller(_fence_of(lease))
    controller.notifier.send(
        Event("leadership_taken", f"{lease.holder} leads at epoch {lease.epoch}")
    )
    lost, on_lost = _loss_signal(asyncio.get_running_loop())
    keeper = seams.keeper(lease, config.leadership, on_lost)
    keeper.start()
    endpoint: StatusEndpoint | None = None
    try:
        if seams.endpoint is not None:
            endpoint = seams.endpoint(controller)
            endpoint.start()
        await _run_epoch(config, lease, stop, controller, lost)
    finally:
        keeper.stop()
        if endpoint is not None:
            endpoint.stop()


def _fence_of(lease: Lease) -> Fence:
    """The fence of this epoch's I/O (controller/pair/fence.py), from its lease."""
    return Fence(
        send_refusal=lease.send_refusal,
        recording_only=lease.recording_only,
        leadership=lambda: {"holder": lease.holder, "epoch": lease.epoch},
        # Once the lease is lost nothing about nodes is said or started,
        # before the loop even learns of it (controller/pair/fence.py).
        # deposed: lost, or surely run out while this process did not run (a
        # pause): then not a word about nodes even before its next write.
        deposed=lease.ran_out,
    )


def _loss_signal(
    loop: asyncio.AbstractEventLoop,
) -> tuple[asyncio.Future[str], Callable[[str], None]]:
    """A future settled with why the lease was lost, and the keeper's callback
    (called from the keeper's thread) that settles it."""
    lost: asyncio.Future[str] = loop.create_future()

    def on_lost(why: str) -> None:  # from the keeper's thread
        def settle() -> None:
            if not lost.done():
                lost.set_result(why)

        with contextlib.suppress(RuntimeError):  # the loop already closed: exiting anyway
            loop.call_soon_threadsafe(settle)

    return lost, on_lost


async def _run_epoch(
    config: ControllerConfig,
    lease: Lease,
    stop: asyncio.Event,
    controller: Controller,
    lost: asyncio.Future[str],
) -> None:
    """Settle, then run the controller until ``stop`` or the lost lease.

    :raises LeadershipLost: as :func:`lead`.
    """
    loop = asyncio.get_running_loop()
    controller_stop = asyncio.Event()
    run: asyncio.Task[None] | None = None
    # Settle: whatever a deposed leader sent has left (its fence saw at least
    # two send deadlines left), before this one reads outlets and resumes.
    stopped = loop.create_task(stop.wait())
    ends: list[asyncio.Future[Any]] = [stopped, lost]
    await asyncio.wait(ends, timeout=config.leadership.settle)
    if not lost.done() and not stop.is_set():
        run = loop.create_task(controller.run(controller_stop), name="controller")
        await asyncio.wait([run, *ends], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if lost.done():
        raise LeadershipLost(await _stop_deposed(controller, run, lost.result(), lease.holder))
    if run is None:
        return  # stopped while settling
    controller_stop.set()  # a clean stop: the controller cancels its tasks
    (outcome,) = await asyncio.gather(run, return_exceptions=True)
    if lost.done():
        raise LeadershipLost(await _stop_deposed(controller, None, lost.result(), lease.holder))
    if isinstance(outcome, BaseException):
        log.error("the controller failed while leading: %r", outcome)
        raise LeadershipLost(f"the controller failed while leading: {outcome!r}")


async def _stop_deposed(
    controller: Controller, run: asyncio.Task[None] | None, why: str, holder: str
) -> str:
    """Cancel everything the lost epoch was doing, at once, and say so; why, for the exit.

    The controller's task and every task it started are cancelled now; they
    get ``STOP_WITHIN_S`` to end (one may wait on a dark history link, which
    a cancel does not interrupt in its thread), and the one ``leadership_lost``
    alert as long to leave. Then the process exits, done or not.
    """
    log.error("leadership_lost: %s; cancelling every task of this epoch", why)
    controller.notifier.send(
        Event(
            "leadership_lost",
            f"this controller ({holder}) stopped leading: {why}; it stops every "
            "action and restarts as a standby",
        )
    )
    cancelled = controller.cancel_tasks()
    if run is not None:
        run.cancel()
        cancelled.append(run)
    if cancelled:
        _, pending = await asyncio.wait(cancelled, timeout=STOP_WITHIN_S)
        if pending:
            log.error(
                "%d tasks did not end within %gs; exiting all the same", len(pending), STOP_WITHIN_S
            )
    await controller.notifier.drain(STOP_WITHIN_S)
    return f"stopped leading: {why}"


def run_pair(config: ControllerConfig) -> int:
    """``spark-watchdog controller`` on a PostgreSQL history; the exit status.

    A controller that lost its lease exits with 1 within ``2 x STOP_WITHIN_S``
    of noticing, from inside its loop: ``asyncio.run`` would first wait for
    every thread of its pool, one of which may be blocked on a dark history
    link for as long as the link stays dark. systemd starts it again as a
    standby.
    """

    async def main() -> None:
        try:
            await serve_pair(config)
        except LeadershipLost as exc:
            log.error("%s", exc)
            _exit_now(1)

    try:
        asyncio.run(main())
    except WatchdogError as exc:
        log.error("%s", exc)
        return 1
    return 0


def _exit_now(status: int) -> None:
    logging.shutdown()  # flushes every handler
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)
