"""The history's schema migrations: applied in order, each exactly once, also
when two processes open an old file at once."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence

from spark_watchdog.errors import SchemaTooNew
from spark_watchdog.history.schema import APPLICATION_ID, MIGRATIONS, statements


def migrate(
    conn: sqlite3.Connection, path: str, migrations: Sequence[str] = MIGRATIONS
) -> tuple[int, int]:
    """Bring the file up to ``len(migrations)``; returns (version found, version now).

    Each migration runs in its own BEGIN IMMEDIATE transaction with its new
    ``user_version``, and the version is read again inside it, so two
    processes opening an old file at once (the CLI and the controller) apply
    each migration exactly once. Raises sqlite3 errors (the store translates
    them) and SchemaTooNew.
    """
    target = len(migrations)
    found = user_version(conn)
    if found > target:
        raise too_new(path, found, target)
    version = found
    # Reading the version first keeps an up-to-date file from taking the write lock.
    while version < target:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = user_version(conn)
            if version > target:
                raise too_new(path, version, target)
            if version < target:
                if version == 0:
                    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                for statement in statements(migrations[version]):
                    conn.execute(statement)
                version += 1
                # PRAGMA takes no parameters; version is an int we computed.
                conn.execute(f"PRAGMA user_version = {version:d}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
    return found, version


def user_version(conn: sqlite3.Connection) -> int:
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    return version


def too_new(path: str, found: int, supported: int) -> SchemaTooNew:
    return SchemaTooNew(
        path,
        f"history database {path} was written by a newer spark-watchdog "
        f"(schema {found} > {supported}); upgrade",
    )
