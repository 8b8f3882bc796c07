"""Shared fixtures for the freeze-history tests: a real SQLite file per test,
and a real PostgreSQL server for the session with a fresh database per test.

``store`` is either engine: every test that takes it runs on both. Without
a PostgreSQL server or psycopg here, the PostgreSQL half is skipped with the
way to get it, unless ``SPARK_WATCHDOG_REQUIRE_POSTGRES=1`` (scripts/test.sh
sets it after setup.sh installed both), where it fails instead.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_watchdog.history import HistoryStore
from spark_watchdog.lab.hardware.postgres_server import ROLE, PostgresServer, PostgresUnavailable

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


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("psycopg is not installed: pip install 'spark-watchdog[postgres]'")
    try:
        server = PostgresServer()
    except PostgresUnavailable as exc:
        _unavailable(str(exc))
    with server:
        yield server


def _unavailable(why: str) -> None:
    if os.environ.get("SPARK_WATCHDOG_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"PostgreSQL tier required but unavailable: {why}")
    pytest.skip(f"PostgreSQL tier skipped: {why} (scripts/setup.sh installs it)")


_databases = itertools.count(1)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A new, empty database on the session's server, owned by the history's role."""
    name = f"history_{next(_databases)}"
    postgres_server.psql(f"CREATE DATABASE {name} OWNER {ROLE}")
    return postgres_server.url.rsplit("/", 1)[0] + "/" + name


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
