"""Shared fixtures for the freeze-history tests: a real SQLite file per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_watchdog.history import HistoryStore

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
def store(db_path: Path, clock: FakeClock) -> Iterator[HistoryStore]:
    with HistoryStore(db_path, clock=clock) as opened:
        yield opened
