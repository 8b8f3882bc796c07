"""The history under real SQLite failure conditions: each gives a clear StoreError.

Nothing is mocked. Locked: another connection holds a write transaction.
Full: ``PRAGMA max_page_count`` caps the file, which makes SQLite return the
same SQLITE_FULL a full disk does (a real full filesystem needs a mount this
test cannot make). Read-only: a store opened read-only (SQLite's own
``mode=ro``) and, when not root, a file without write permission. Corrupt:
bytes overwritten in the file.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from pathlib import Path

import pytest

from spark_watchdog.history import (
    HistoryStore,
    SchemaTooNew,
    StoreCorrupt,
    StoreError,
    StoreFull,
    StoreLocked,
    StoreReadOnly,
)
from spark_watchdog.history.schema import SCHEMA_VERSION


def corrupt(path: Path) -> str:
    return re.escape(f"history database {path} is corrupt")


def make_history(path: Path, incidents: int = 1) -> None:
    with HistoryStore(path) as store:
        for n in range(incidents):
            store.open_incident(
                "host_frozen", [f"spark-{n}"], detected_at=float(n), evidence={"n": n}
            )
        store.hold("spark-1", "maintenance", by="alice")


# -- locked ----------------------------------------------------------------------------


def test_write_while_another_process_holds_the_write_lock(db_path: Path) -> None:
    make_history(db_path)
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    other.execute("INSERT INTO settings VALUES ('k', '1', 0, 'other')")
    try:
        with HistoryStore(db_path, busy_timeout=0.2) as store:
            # WAL: reading goes on while someone else writes.
            assert [h.node for h in store.active_holds()] == ["spark-1"]
            started = time.monotonic()
            with pytest.raises(StoreLocked) as caught:
                store.hold("spark-2", "x", by="alice")
            waited = time.monotonic() - started
            assert 0.15 < waited < 1.5  # bounded by busy_timeout, not forever
            message = str(caught.value)
            assert f"history database {db_path} is locked by another process" in message
            assert "0.2 s" in message and "holding spark-2" in message
            assert caught.value.__cause__ is not None  # the sqlite3 error, for debugging

            other.execute("COMMIT")  # the other side lets go: writing works again
            assert store.hold("spark-2", "x", by="alice").node == "spark-2"
    finally:
        other.close()


def test_opening_an_up_to_date_file_does_not_need_the_write_lock(db_path: Path) -> None:
    make_history(db_path)
    other = sqlite3.connect(db_path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with HistoryStore(db_path, busy_timeout=0.1) as store:
            assert store.schema_version == SCHEMA_VERSION
    finally:
        other.close()


# -- full ------------------------------------------------------------------------------


def test_disk_full_names_the_file_and_keeps_earlier_rows(db_path: Path) -> None:
    make_history(db_path)
    with HistoryStore(db_path) as store:
        pages = store._conn().execute("PRAGMA page_count").fetchone()[0]
        # SQLite's own page cap gives the SQLITE_FULL a full disk gives.
        store._conn().execute(f"PRAGMA max_page_count = {pages}")
        incident_id = store.open_incidents()[0].id
        with pytest.raises(StoreFull) as caught:
            for n in range(200):
                store.add_step(incident_id, "rung_started", detail={"pad": "x" * 4000, "n": n})
        message = str(caught.value)
        assert f"history database {db_path}: disk full" in message
        assert "free space" in message
        # What was committed before is intact, and the store still reads.
        steps = store.steps(incident_id)
        assert [s.seq for s in steps] == list(range(1, len(steps) + 1))
        assert store.integrity_check() == []


# -- read-only -------------------------------------------------------------------------


def test_store_opened_read_only_refuses_writes_clearly(db_path: Path) -> None:
    make_history(db_path)
    with HistoryStore(db_path, read_only=True) as store:
        assert [h.node for h in store.active_holds()] == ["spark-1"]
        opened_read_only = re.escape(f"history store {db_path} was opened read-only")
        with pytest.raises(StoreReadOnly, match=opened_read_only):
            store.release("spark-1", by="alice")
    with HistoryStore(db_path) as store:
        assert [h.node for h in store.active_holds()] == ["spark-1"]


def test_read_only_open_of_a_missing_file_does_not_create_it(tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    with pytest.raises(StoreError, match=re.escape(f"no history database at {path}")):
        HistoryStore(path, read_only=True)
    assert not path.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file permissions")
def test_file_without_write_permission(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    path = directory / "history.db"
    make_history(path)
    path.chmod(0o444)
    directory.chmod(0o555)
    try:
        with pytest.raises(StoreError, match=r"read-only|cannot open"), HistoryStore(path) as store:
            store.hold("spark-2", "x", by="alice")
    finally:
        directory.chmod(0o755)
        path.chmod(0o644)


def test_missing_directory(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "history.db"
    expected = re.escape(f"cannot open history database {path}") + ".*directory"
    with pytest.raises(StoreError, match=expected):
        HistoryStore(path)


# -- corrupt ---------------------------------------------------------------------------


def test_overwritten_header_is_not_a_database(db_path: Path) -> None:
    make_history(db_path)
    with db_path.open("r+b") as f:
        f.write(b"this is not SQLite, just junk!!" * 4)
    with pytest.raises(StoreCorrupt) as caught:
        HistoryStore(db_path)
    message = str(caught.value)
    assert f"history database {db_path} is corrupt" in message
    assert f"sqlite3 {db_path} .recover" in message and "move it aside" in message


def test_overwritten_table_page_is_malformed(db_path: Path) -> None:
    make_history(db_path, incidents=40)
    raw = sqlite3.connect(db_path)
    page_size = raw.execute("PRAGMA page_size").fetchone()[0]
    root = raw.execute("SELECT rootpage FROM sqlite_master WHERE name = 'incidents'").fetchone()[0]
    raw.close()  # the last connection checkpoints the WAL: the rows are in the file now
    assert not Path(f"{db_path}-wal").exists()
    with db_path.open("r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xee" * page_size)

    with HistoryStore(db_path) as store:  # the header is fine, so it opens
        with pytest.raises(StoreCorrupt, match=corrupt(db_path)):
            store.list_incidents()
        assert store.integrity_check() != []
        # Tables on other pages still work: holds can still be read and written.
        assert [h.node for h in store.active_holds()] == ["spark-1"]


def test_truncated_file(db_path: Path) -> None:
    make_history(db_path, incidents=40)
    size = db_path.stat().st_size
    with db_path.open("r+b") as f:
        f.truncate(size // 3)
    with pytest.raises(StoreCorrupt, match=corrupt(db_path)), HistoryStore(db_path) as store:
        store.list_incidents(limit=None)
        store.active_holds()


# -- not ours, too new -------------------------------------------------------------------


def test_newer_schema_is_refused_with_upgrade_advice(db_path: Path) -> None:
    make_history(db_path)
    raw = sqlite3.connect(db_path)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 3}")
    raw.close()
    expected = (
        f"history database {db_path} was written by a newer spark-watchdog "
        f"(schema {SCHEMA_VERSION + 3} > {SCHEMA_VERSION}); upgrade"
    )
    with pytest.raises(SchemaTooNew) as caught:
        HistoryStore(db_path)
    assert str(caught.value) == expected
    with pytest.raises(SchemaTooNew):
        HistoryStore(db_path, read_only=True)


def test_someone_elses_database_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "grafana.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE dashboards (id INTEGER)")
    raw.commit()
    raw.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="not a spark-watchdog history database"):
        HistoryStore(path)
    assert path.read_bytes() == before  # not switched to WAL, no tables added

    other = tmp_path / "other-app.db"
    raw = sqlite3.connect(other)
    raw.execute("PRAGMA application_id = 1234")
    raw.close()
    with pytest.raises(StoreError, match="application_id 0x4d2"):
        HistoryStore(other)
