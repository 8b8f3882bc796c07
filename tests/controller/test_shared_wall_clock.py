"""A controller pair's wall clock (controller/clock.py, SharedWallClock): the
earlier of the database's and the host's, the safe side of every resumed wait."""

from __future__ import annotations

from collections.abc import Callable

from spark_watchdog.controller.clock import SharedWallClock, remaining


def _fixed(seconds: float) -> Callable[[], float]:
    return lambda: seconds


def test_it_is_the_earlier_of_the_database_clock_and_the_host_clock() -> None:
    assert SharedWallClock(lambda: 1_000.0, lambda: 1_120.0).time() == 1_000.0
    assert SharedWallClock(lambda: 1_000.0, lambda: 880.0).time() == 880.0


def test_a_resumed_hold_is_cut_short_only_if_both_clocks_run_ahead() -> None:
    off_verified_at, hold = 1_000.0, 60.0  # recorded by the last leader, 20 s ago
    truth = 1_020.0
    for database, host in ((truth, truth + 300), (truth + 300, truth), (truth, truth)):
        now = SharedWallClock(_fixed(database), _fixed(host)).time()
        assert remaining(hold, off_verified_at, now) == 40.0
    behind = SharedWallClock(lambda: truth - 30, lambda: truth).time()
    assert remaining(hold, off_verified_at, behind) == 60.0  # longer, never beyond all of it
