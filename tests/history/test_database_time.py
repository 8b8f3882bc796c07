"""The pair's wall clock: the database's, carried forward on the monotonic
clock (history/database_time.py). A scripted connection and clocks here; the
real server in tests/history/test_leadership.py and tests/controller/test_pair.py."""

from __future__ import annotations

from typing import Any

import pytest

from spark_watchdog.history.database_time import DRIFT, DatabaseTime


class Clocks:
    """A monotonic clock the test moves, and a host clock far from the database's."""

    def __init__(self) -> None:
        self.mono = 100.0

    def monotonic(self) -> float:
        return self.mono

    @staticmethod
    def host() -> float:
        return 5_000.0


class Database:
    """Answers ``SELECT clock_timestamp()`` with ``now``; the round trip moves the clock."""

    def __init__(self, clocks: Clocks, now: float, round_trip: float) -> None:
        self.clocks, self.now, self.round_trip = clocks, now, round_trip

    def execute(self, sql: str, parameters: Any = ()) -> Database:
        assert "clock_timestamp()" in sql
        self.clocks.mono += self.round_trip / 2
        self.answer = self.now
        self.clocks.mono += self.round_trip / 2
        self.now += self.round_trip
        return self

    def fetchone(self) -> tuple[float]:
        return (self.answer,)


def made() -> tuple[Clocks, DatabaseTime]:
    clocks = Clocks()
    return clocks, DatabaseTime(monotonic=clocks.monotonic, fallback=clocks.host)


def test_before_any_reading_it_is_the_host_clock() -> None:
    _, database_time = made()
    assert database_time.now() == 5_000.0 and database_time.error() is None


def test_a_reading_is_carried_forward_on_the_monotonic_clock() -> None:
    clocks, database_time = made()
    assert database_time.read(Database(clocks, 1_000.0, 0.2)) == 1_000.0  # type: ignore[arg-type]
    # Read at the middle of its round trip: the clock moved 0.1 s since.
    assert database_time.now() == pytest.approx(1_000.1)
    assert database_time.error() == pytest.approx(0.1 + 0.1 * DRIFT)
    clocks.mono += 60.0
    assert database_time.now() == pytest.approx(1_060.1)  # the host clock plays no part
    assert database_time.error() == pytest.approx(0.1 + 60.1 * DRIFT)


def test_the_closest_reading_is_kept() -> None:
    clocks, database_time = made()
    database_time.read(Database(clocks, 1_000.0, 0.02))  # type: ignore[arg-type]
    # A slow round trip (2 s) says less: the database was read somewhere in it.
    database_time.read(Database(clocks, 1_005.0, 2.0))  # type: ignore[arg-type]
    assert database_time.error() == pytest.approx(0.01 + 2.01 * DRIFT)
    assert database_time.now() == pytest.approx(1_000.0 + 0.01 + 2.0)
    # Long after, the kept reading's drift allowance exceeds a new one's round trip.
    clocks.mono += 1_000.0
    database_time.note(9_000.0, clocks.mono, clocks.mono + 0.2)
    clocks.mono += 0.2
    assert database_time.now() == pytest.approx(9_000.1)
    assert database_time.error() == pytest.approx(0.1 + 0.1 * DRIFT)


def test_a_reading_whose_round_trip_went_backwards_is_dropped() -> None:
    clocks, database_time = made()
    database_time.note(2_000.0, 100.0, 99.0)
    assert database_time.error() is None and database_time.now() == 5_000.0
    database_time.note(1_000.0, 100.0, 101.0)
    clocks.mono = 101.0
    database_time.note(9_000.0, 101.0, 100.5)
    assert database_time.now() == pytest.approx(1_000.5)


def test_records_are_stamped_late_and_waits_measured_early() -> None:
    """The error only lengthens a resumed wait: a record stamped at the latest the
    database's time may be, measured against the earliest it may be now."""
    clocks, database_time = made()
    assert database_time.latest() == database_time.earliest() == 5_000.0  # never read
    database_time.read(Database(clocks, 1_000.0, 2.0))  # type: ignore[arg-type]
    stamped = database_time.latest()
    assert stamped == pytest.approx(1_001.0 + 1.0 + 1.0 * DRIFT)
    clocks.mono += 10.0
    waited = database_time.earliest() - stamped
    assert waited == pytest.approx(10.0 - 2.0 - 12.0 * DRIFT)
