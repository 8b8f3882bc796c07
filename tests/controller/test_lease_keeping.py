"""The leader's renewals keep their time on a busy controller (controller/pair.py)."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from spark_watchdog.config.controller import LeadershipConfig
from spark_watchdog.controller.pair import _renew_until_lost


class QuickLease:
    """A lease whose renewal answers at once, and counts its calls."""

    def __init__(self) -> None:
        self.renewals = 0

    def renew(self) -> bool:
        self.renewals += 1
        return True


def test_renewals_do_not_queue_behind_the_controllers_own_blocking_work() -> None:
    """Every thread of the default pool busy (history writes, reads, a slow call)
    for longer than give_up_after: a leader on a healthy link keeps leading."""
    timing = LeadershipConfig(
        lease=10.0, renew_every=0.1, give_up_after=0.8, send_deadline=1.0, settle=0.0
    )
    lease = QuickLease()

    async def busy_leader() -> tuple[bool, int]:
        # A pool of 4 threads (as on a 2-core machine: 6), all of them busy.
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(4))
        busy = [asyncio.ensure_future(asyncio.to_thread(time.sleep, 2.5)) for _ in range(4)]
        keeper = asyncio.ensure_future(_renew_until_lost(lease, timing))  # type: ignore[arg-type]
        done, _ = await asyncio.wait({keeper}, timeout=2.0)
        lost = keeper in done
        keeper.cancel()
        await asyncio.gather(*busy)
        return lost, lease.renewals

    lost, renewals = asyncio.run(busy_leader())
    assert not lost, "the leader gave up while every pool thread was busy"
    assert renewals >= 5  # about every 0.1 s for 2 s, on any machine
