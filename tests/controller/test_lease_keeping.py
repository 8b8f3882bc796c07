"""The leader's renewals keep their time on a busy controller (controller/pair/pair.py),
and a lost lease is said once, at once."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import cast

from spark_watchdog.config.controller import LeadershipConfig
from spark_watchdog.controller.pair.pair import LeaseKeeper
from spark_watchdog.errors import StoreError
from spark_watchdog.history.leadership import Lease

TIMING = LeadershipConfig(
    lease=10.0, renew_every=0.1, give_up_after=0.8, send_deadline=1.0, settle=0.0
)


class QuickLease:
    """A lease whose renewal answers as told (at once by default), and counts its calls."""

    def __init__(self, answer: bool = True, takes: float = 0.0) -> None:
        self.renewals = 0
        self.answer = answer
        self.takes = takes  # how long each renewal's round trip takes
        self.hang = threading.Event()  # set: every renewal blocks (a dark link)
        self.fail = False
        self.fenced = False

    def renew(self) -> bool:
        self.renewals += 1
        if self.fail:
            raise StoreError("history", "connection refused")
        if self.hang.is_set():
            threading.Event().wait(30)
        time.sleep(self.takes)
        return self.answer

    def lost(self) -> None:
        self.fenced = True


class Said:
    def __init__(self) -> None:
        self.why: list[str] = []
        self.fenced_first: list[bool] = []
        self.done = threading.Event()


def _keeper(lease: QuickLease, said: Said) -> LeaseKeeper:
    def on_lost(why: str) -> None:
        said.why.append(why)
        said.fenced_first.append(lease.fenced)
        said.done.set()

    return LeaseKeeper(cast(Lease, lease), TIMING, on_lost)


def test_renewals_do_not_queue_behind_the_controllers_own_blocking_work() -> None:
    """Every thread of the default pool busy (history writes, reads, a slow call)
    for longer than give_up_after: a leader on a healthy link keeps leading."""
    lease, said = QuickLease(), Said()

    async def busy_leader() -> None:
        # A pool of 4 threads (as on a 2-core machine: 6), all of them busy.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(4))
        keeper = _keeper(lease, said)
        keeper.start()
        await asyncio.gather(*(asyncio.to_thread(time.sleep, 2.0) for _ in range(4)))
        keeper.stop()

    asyncio.run(busy_leader())
    assert said.why == [], "the leader gave up while every pool thread was busy"
    assert lease.renewals >= 5  # about every 0.1 s for 2 s, on any machine


def test_renewals_keep_their_time_while_the_event_loop_is_busy() -> None:
    """The loop itself held for more than give_up_after (a long sweep, a CPU-bound
    step, both cores busy) and each renewal's round trip 0.2 s: the renewals go
    on beside the loop, and the leader keeps leading. (Renewals driven by the
    loop gave up here: after the stall the next one had 0.1 s to answer.)"""
    lease, said = QuickLease(takes=0.2), Said()

    async def stalled_loop() -> None:
        keeper = _keeper(lease, said)
        keeper.start()
        time.sleep(2.0)  # the loop does nothing else for 2.5 x give_up_after
        await asyncio.sleep(0.3)
        keeper.stop()

    asyncio.run(stalled_loop())
    assert said.why == [], f"the leader gave up while its loop was busy: {said.why}"
    assert lease.renewals >= 5


def test_a_renewal_refused_ends_the_leadership_fenced_before_it_is_said() -> None:
    lease, said = QuickLease(answer=False), Said()
    keeper = _keeper(lease, said)
    keeper.start()
    assert said.done.wait(10)
    time.sleep(3 * TIMING.renew_every)
    assert len(said.why) == 1 and "another controller took it" in said.why[0]
    assert said.fenced_first == [True]  # no write, no send, before anyone hears of it


def test_a_renewal_that_hangs_gives_up_after_give_up_after() -> None:
    """A dark link: the renewal never answers; the keeper does not wait on it."""
    lease, said = QuickLease(), Said()
    keeper = _keeper(lease, said)
    keeper.start()
    time.sleep(0.5)  # a few good renewals first
    lease.hang.set()
    dark_at = time.monotonic()
    assert said.done.wait(10)
    waited = time.monotonic() - dark_at
    assert len(said.why) == 1 and "did not answer" in said.why[0], said.why
    assert said.fenced_first == [True]
    # give_up_after since the last good renewal, plus scheduling on a loaded machine
    assert waited < TIMING.give_up_after + 3.0


def test_failing_renewals_give_up_naming_the_last_problem() -> None:
    lease, said = QuickLease(), Said()
    lease.fail = True
    keeper = _keeper(lease, said)
    keeper.start()
    assert said.done.wait(10)
    assert "connection refused" in said.why[0]
    assert lease.renewals >= 2  # it tried again before giving up


def test_a_stopped_keeper_says_nothing() -> None:
    lease, said = QuickLease(answer=False), Said()
    keeper = _keeper(lease, said)
    keeper.stop()
    keeper.start()
    time.sleep(3 * TIMING.renew_every)
    assert said.why == [] and lease.renewals == 0 and not lease.fenced
