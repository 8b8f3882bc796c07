"""Schema versions: a new file, a committed version-1 file, and the migration rules."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from spark_watchdog.history import HistoryStore, SchemaTooNew, StoreError
from spark_watchdog.history.migrations import migrate
from spark_watchdog.history.schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION, statements

V1_DUMP = Path(__file__).parent / "fixtures" / "history_v1.sql"

# A stand-in for a future migration: it adds a column and fills it from old rows.
V2_EXAMPLE = """
ALTER TABLE incidents ADD COLUMN node_count INTEGER;
UPDATE incidents SET node_count =
    (SELECT count(*) FROM incident_nodes WHERE incident_id = incidents.id);
"""


def load_v1(path: Path) -> None:
    """Build a real version-1 file from the committed dump."""
    raw = sqlite3.connect(path)
    raw.executescript(V1_DUMP.read_text())
    raw.close()


def schema_of(path: Path) -> dict[str, str]:
    raw = sqlite3.connect(path)
    rows = raw.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL").fetchall()
    raw.close()
    return dict(rows)


def header_of(path: Path) -> tuple[int, int, str]:
    raw = sqlite3.connect(path)
    version = raw.execute("PRAGMA user_version").fetchone()[0]
    app_id = raw.execute("PRAGMA application_id").fetchone()[0]
    mode = raw.execute("PRAGMA journal_mode").fetchone()[0]
    raw.close()
    return version, app_id, mode


def test_new_file_is_created_at_the_current_version_in_wal_mode(db_path: Path) -> None:
    with HistoryStore(db_path) as store:
        assert store.schema_version == SCHEMA_VERSION
        conn = store._conn()
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        # 2 = FULL: the WAL is fsynced at every commit (see HistoryStore._configure).
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert header_of(db_path) == (SCHEMA_VERSION, APPLICATION_ID, "wal")


def test_released_migration_one_is_unchanged(tmp_path: Path) -> None:
    """Editing a released migration would fork the schema of files in the field."""
    fixture, fresh = tmp_path / "fixture.db", tmp_path / "fresh.db"
    load_v1(fixture)
    raw = sqlite3.connect(fresh)
    for statement in statements(MIGRATIONS[0]):
        raw.execute(statement)
    raw.close()
    assert schema_of(fresh) == schema_of(fixture)


def test_committed_v1_file_opens_migrates_and_reads(db_path: Path) -> None:
    load_v1(db_path)
    assert header_of(db_path)[:2] == (1, APPLICATION_ID)

    with HistoryStore(db_path) as store:
        assert store.schema_version == SCHEMA_VERSION
        resolved, still_open = store.get_incident(1), store.get_incident(2)
        assert (resolved.kind, resolved.nodes, resolved.resolution) == (
            "host_frozen",
            ("spark-2",),
            "recovered",
        )
        assert (resolved.time_to_detect_s, resolved.time_to_recover_s) == (9.0, 190.0)
        assert resolved.evidence["gpu_power_w"] == 11.5
        assert still_open.nodes == ("spark-1", "spark-2") and still_open.dry_run
        assert [i.id for i in store.open_incidents()] == [2]
        timeline = store.incident(1)
        assert timeline is not None
        assert [s.step for s in timeline.steps][-1] == "resolved"
        assert timeline.actions[0].result == "verified"
        assert timeline.serving_restarts[0].step_durations == {"stop_head": 2.0, "start_head": 80.0}
        assert timeline.boots[0].clean_shutdown is False
        assert [h.reason for h in store.active_holds()] == ["bench maintenance"]
        setting = store.setting("serving_profile")
        assert setting is not None and setting.value == "safe"
        # And it takes new writes after the move.
        assert store.add_step(2, "serving_stop_requested").seq == 2
    assert header_of(db_path) == (SCHEMA_VERSION, APPLICATION_ID, "wal")


def test_v1_file_migrates_forward_through_a_later_migration(db_path: Path) -> None:
    load_v1(db_path)
    with HistoryStore(db_path, migrations=(*MIGRATIONS, V2_EXAMPLE)) as store:
        assert store.schema_version == SCHEMA_VERSION + 1
        counts = dict(store._conn().execute("SELECT id, node_count FROM incidents").fetchall())
        assert counts == {1: 1, 2: 2}
        assert store.get_incident(2).nodes == ("spark-1", "spark-2")
    # The current code now meets a file one version ahead of it.
    with pytest.raises(SchemaTooNew, match=rf"\(schema {SCHEMA_VERSION + 1} > {SCHEMA_VERSION}\)"):
        HistoryStore(db_path)


def test_a_failing_migration_leaves_the_file_at_the_previous_version(db_path: Path) -> None:
    load_v1(db_path)
    broken = V2_EXAMPLE + "\nINSERT INTO no_such_table VALUES (1);\n"
    with pytest.raises(StoreError, match="no such table"):
        HistoryStore(db_path, migrations=(*MIGRATIONS, broken))
    # The ALTER before the failing statement was rolled back with it.
    assert header_of(db_path)[0] == SCHEMA_VERSION
    assert "node_count" not in schema_of(db_path)["incidents"]
    with HistoryStore(db_path) as store:
        assert store.get_incident(1).resolution == "recovered"


def test_two_processes_opening_an_old_file_migrate_it_once(db_path: Path) -> None:
    load_v1(db_path)
    # Not idempotent: applied twice it would fail ("duplicate column name").
    migrations = (*MIGRATIONS, V2_EXAMPLE)
    barrier = threading.Barrier(4)
    results: list[tuple[int, int] | BaseException] = []

    def opener() -> None:
        conn = sqlite3.connect(db_path, isolation_level=None, timeout=5, check_same_thread=False)
        try:
            barrier.wait()
            results.append(migrate(conn, str(db_path), migrations))
        except BaseException as exc:
            results.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=opener) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(isinstance(r, tuple) and r[1] == SCHEMA_VERSION + 1 for r in results), results
    assert header_of(db_path)[0] == SCHEMA_VERSION + 1


def test_read_only_store_does_not_migrate(db_path: Path) -> None:
    load_v1(db_path)
    with HistoryStore(db_path, migrations=MIGRATIONS[:1], read_only=True) as store:
        assert store.get_incident(1).kind == "host_frozen"
    with pytest.raises(StoreError, match="open it read-write once"):
        HistoryStore(db_path, migrations=MIGRATIONS, read_only=True)
    assert header_of(db_path)[0] == 1


def test_statement_splitter_keeps_triggers_and_comment_semicolons_whole() -> None:
    script = """
    -- a comment; with a semicolon
    CREATE TABLE t (x TEXT DEFAULT 'a;b');
    CREATE TRIGGER t_ins AFTER INSERT ON t BEGIN
        UPDATE t SET x = 'c;d';
        SELECT 1;
    END;
    """
    parts = statements(script)
    assert len(parts) == 2
    assert parts[0].endswith("DEFAULT 'a;b');")
    assert parts[1].startswith("CREATE TRIGGER") and parts[1].endswith("END;")
    with pytest.raises(ValueError, match="incomplete"):
        statements("CREATE TABLE t (x INT); CREATE TABLE u (y INT)")
    with pytest.raises(ValueError, match="incomplete"):
        statements("CREATE TABLE t (x TEXT DEFAULT 'a;b)")
