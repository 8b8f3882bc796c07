"""Fixtures for every test.

``postgres_server`` is a real PostgreSQL server for the session, and
``postgres_url`` a fresh database on it per test. Without a server or
psycopg here, those tests are skipped with the way to get them, unless
``SPARK_WATCHDOG_REQUIRE_POSTGRES=1`` (scripts/test.sh sets it after
setup.sh installed both), where they fail instead.

``nut_server`` is a real NUT ``upsd`` per test, with ``dummy-ups`` and an
outlet driver stand-in behind it (lab/hardware/nut_server.py). Without NUT
here those tests are skipped, unless ``SPARK_WATCHDOG_REQUIRE_NUT=1``
(scripts/test.sh sets it after setup.sh installed nut-server).
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_watchdog.lab.hardware.nut_server import NutServer, NutUnavailable
from spark_watchdog.lab.hardware.postgres_server import ROLE, PostgresServer, PostgresUnavailable

# Groups, order and timing of the parallel run (tests/support/suite_plan.py).
pytest_plugins = ["suite_plan"]


@pytest.fixture(autouse=True)
def _no_log_state_outlives_its_test() -> Iterator[None]:
    """A CLI command run in-process installs spark_watchdog's root handler
    (spark_watchdog.logs.configure) on the stream pytest captured for that
    test; once the test ends the stream is closed, and a later test's log
    line would end in logging's "--- Logging error ---" traceback. It also sets
    the root logger's level (``doctor``: CRITICAL only), which would keep a later
    test's warning from reaching ``caplog``: that goes back too."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in list(root.handlers):
        if getattr(handler, "_spark_watchdog", False):
            root.removeHandler(handler)
    root.setLevel(level)


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


NUT_PASSWORD = "nut-pw-4711"


@pytest.fixture
def nut_server() -> Iterator[NutServer]:
    """A real upsd on loopback: ``pdu`` (dummy-ups) and ``rack`` (outlets that switch).

    In a short directory of its own: upsd's Unix sockets to its drivers allow
    paths of about 100 characters, fewer than pytest's ``tmp_path`` may take.
    """
    directory = Path(tempfile.mkdtemp(prefix="nut-"))
    try:
        try:
            server = NutServer(directory, NUT_PASSWORD)
            server.__enter__()
        except NutUnavailable as exc:
            if os.environ.get("SPARK_WATCHDOG_REQUIRE_NUT") == "1":
                pytest.fail(f"NUT tier required but unavailable: {exc}")
            pytest.skip(f"NUT tier skipped: {exc} (scripts/setup.sh installs it)")
        try:
            yield server
        finally:
            server.__exit__(None, None, None)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
