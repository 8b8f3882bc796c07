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
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from spark_watchdog.config.controller import ControllerConfig, LeadershipConfig
from spark_watchdog.controller.clock import SharedWallClock
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.fence import Fence
from spark_watchdog.controller.io import ControllerIO
from spark_watchdog.controller.notify import Event, Notifier
from spark_watchdog.controller.status_api import StandbyEndpoint, StatusEndpoint
from spark_watchdog.errors import StoreError, WatchdogError
from spark_watchdog.history.database_time import DatabaseTime
from spark_watchdog.history.leadership import Leader, Lease
from spark_watchdog.history.postgres import PostgresHistoryStore
from spark_watchdog.sdnotify import SystemdNotifier

log = logging.getLogger("spark_watchdog.controller.pair")


class LeadershipLost(WatchdogError):
    """This controller stopped leading; it exits and starts again as a standby."""


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def stand_by(
    lease: Lease,
    timing: LeadershipConfig,
    stop: asyncio.Event,
    systemd: SystemdNotifier,
    view: dict[str, Any] | None = None,
) -> Leader | None:
    """Try to take the lease every ``renew_every`` until it is ours (None: stopped).

    ``view``, when given, is kept up to date with what the standby last saw
    (its ``/v1/status`` and ``/metrics``, controller/status_api.py).
    """
    said: tuple[str, int] | None = None
    unreachable = False
    seen = {} if view is None else view
    seen.update(holder=lease.holder, leader=None, history="not read yet")
    while not stop.is_set():
        try:
            leader = await asyncio.to_thread(lease.acquire)
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


async def keep_leading(
    lease: Lease,
    timing: LeadershipConfig,
    notifier: Notifier,
) -> str:
    """Renew until the lease is lost; returns why. Never returns while it leads."""
    try:
        why = await _renew_until_lost(lease, timing)
    finally:
        lease.lost()  # whatever ended the loop: no write, no send from here
    notifier.send(
        Event(
            "leadership_lost",
            f"this controller ({lease.holder}) stopped leading: {why}; it stops every "
            "action and restarts as a standby",
        )
    )
    return why


async def _renew_until_lost(lease: Lease, timing: LeadershipConfig) -> str:
    # A thread of its own: the default pool's threads carry the controller's own
    # blocking work (history writes, reads), and a renewal queued behind them
    # would miss its time on a busy machine while the link is healthy.
    renewer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lease-renewal")
    loop = asyncio.get_running_loop()
    last_renewed = time.monotonic()
    problem = "no renewal yet"
    try:
        while True:
            await asyncio.sleep(timing.renew_every)
            began = time.monotonic()
            # Never wait past give_up_after since the last renewal, whatever this one does.
            left = max(0.1, timing.give_up_after - (began - last_renewed))
            try:
                renewing = loop.run_in_executor(renewer, lease.renew)
                renewed = await asyncio.wait_for(renewing, left)
            except (StoreError, asyncio.TimeoutError) as exc:
                problem = str(exc) or "the renewal did not answer"
            else:
                if renewed:
                    last_renewed = began
                    continue
                return "the lease expired, was stepped down or another controller took it"
            silent = time.monotonic() - last_renewed
            if silent >= timing.give_up_after:
                return f"no renewal for {silent:.1f}s (last problem: {problem})"
    finally:
        renewer.shutdown(wait=False, cancel_futures=True)


async def serve_pair(config: ControllerConfig) -> None:
    """Run as one controller of a pair until SIGTERM or SIGINT, or until it stops leading."""
    timing = config.leadership
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # One wall clock for the pair: the database's (history/database_time.py).
    database_time = DatabaseTime()
    store = await asyncio.to_thread(
        PostgresHistoryStore,
        config.history,
        password_file=config.history_password_file,
        clock=database_time.latest,
    )
    # The lease's renewals on a connection of their own (history/leadership.py).
    renewals = await asyncio.to_thread(
        PostgresHistoryStore,
        config.history,
        password_file=config.history_password_file,
        clock=database_time.latest,
    )
    lease = Lease(
        store,
        lease_s=timing.lease,
        send_deadline_s=timing.send_deadline,
        clock=database_time,
        renewals=renewals,
    )
    systemd = SystemdNotifier()
    try:
        store.set_fence(lease)
        systemd.ready(f"standby ({lease.holder})")
        view: dict[str, Any] = {}
        standby = StandbyEndpoint(config.listen.address, config.listen.port, lambda: dict(view))
        standby.start()
        try:
            leader = await stand_by(lease, timing, stop, systemd, view)
        finally:
            standby.stop()  # the leader's own endpoint takes the address
        if leader is None:
            return
        log.warning("leading at epoch %d as %s", leader.epoch, lease.holder)
        await _lead(config, lease, stop, systemd)
    finally:
        if lease.epoch is not None and stop.is_set():
            # A clean stop: a standby takes over once what our last checked
            # write let out has left (fence_s), not after the whole lease.
            with contextlib.suppress(StoreError):
                await asyncio.to_thread(lease.step_down)
        systemd.stopping()
        renewals.close()
        store.close()


async def _lead(
    config: ControllerConfig, lease: Lease, stop: asyncio.Event, systemd: SystemdNotifier
) -> None:
    # Steps are stamped, and resumed waits measured, on the database's clock.
    fence = Fence(
        send_refusal=lease.send_refusal,
        recording_only=lease.recording_only,
        leadership=lambda: {"holder": lease.holder, "epoch": lease.epoch},
    )
    io = ControllerIO.production(config, SharedWallClock(lease.clock.earliest), fence)
    controller = Controller(config, lease.store, io=io, systemd=systemd)
    controller.notifier.send(
        Event("leadership_taken", f"{lease.holder} leads at epoch {lease.epoch}")
    )
    loop = asyncio.get_running_loop()
    keeper = loop.create_task(
        keep_leading(lease, config.leadership, controller.notifier), name="keep-leading"
    )
    endpoint: StatusEndpoint | None = None
    controller_stop = asyncio.Event()
    try:
        endpoint = StatusEndpoint(config.listen.address, config.listen.port, controller)
        endpoint.start()
        # Settle: whatever a deposed leader sent has left (its fence saw at least
        # two send deadlines left), before this one reads outlets and resumes.
        await _pause(stop, config.leadership.settle)
        if stop.is_set():
            return
        if keeper.done():
            raise LeadershipLost(f"stopped leading while settling: {keeper.result()}")
        run = loop.create_task(controller.run(controller_stop))
        stopped = loop.create_task(stop.wait())
        done, _ = await asyncio.wait([run, keeper, stopped], return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        controller_stop.set()  # the controller stops: its tasks are cancelled
        (outcome,) = await asyncio.gather(run, return_exceptions=True)
        if keeper in done:
            raise LeadershipLost(f"stopped leading: {keeper.result()}")
        if isinstance(outcome, BaseException):
            log.error("the controller failed while leading: %r", outcome)
            raise LeadershipLost(f"the controller failed while leading: {outcome!r}")
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        if endpoint is not None:
            endpoint.stop()
