"""Shared fixtures for the freeze-history tests: a real SQLite file per test,
or a fresh database on the session's real PostgreSQL server (tests/conftest.py).

``store`` is either engine: every test that takes it runs on both.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_watchdog.history import HistoryStore
from spark_watchdog.lab.hardware.postgres_server import PostgresServer

T0 = 1_750_000_000.0  # 2025-06-15T15:06:40Z


class FakeClock:
    """The store's default times; tests move it by hand."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "history.db"


@pytest.fixture
def sqlite_store(db_path: Path, clock: FakeClock) -> Iterator[HistoryStore]:
    """For tests that reach into the file itself (the decoding they prove is shared)."""
    with HistoryStore(db_path, clock=clock) as opened:
        yield opened


@pytest.fixture(params=["sqlite", "postgres"])
def store(
    request: pytest.FixtureRequest, db_path: Path, clock: FakeClock
) -> Iterator[HistoryStore]:
    if request.param == "sqlite":
        with HistoryStore(db_path, clock=clock) as opened:
            yield opened
        return
    from spark_watchdog.history.postgres import PostgresHistoryStore

    server: PostgresServer = request.getfixturevalue("postgres_server")
    url: str = request.getfixturevalue("postgres_url")
    with PostgresHistoryStore(url, password_file=str(server.password_file), clock=clock) as opened:
        yield opened
