"""Who may read the history, and what it never keeps: the file's mode, reads by
a user who cannot write the history's directory (a real unprivileged uid),
secrets in what is recorded, and ids SQLite cannot hold."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_watchdog.history import HistoryStore, InvalidRecord, UnknownRecord

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_history_is_not_world_readable(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    old = os.umask(0o022)
    try:
        with HistoryStore(path) as store:
            store.hold("spark-1", "x", by="alice")
            assert _mode(path) == 0o640
            # SQLite gives the WAL files the database's mode.
            assert _mode(Path(f"{path}-wal")) == 0o640
            assert _mode(Path(f"{path}-shm")) == 0o640
    finally:
        os.umask(old)


def test_an_existing_history_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    HistoryStore(path).close()
    path.chmod(0o600)
    HistoryStore(path).close()
    assert _mode(path) == 0o600


# --- a reader who may not write the directory ------------------------------------


def _nobody_can_run_python() -> bool:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return False
    probe = subprocess.run(
        [*AS_NOBODY, sys.executable, "-c", "import spark_watchdog.cli.main"],
        capture_output=True,
        timeout=60,
    )
    return probe.returncode == 0


needs_nobody = pytest.mark.skipif(
    not _nobody_can_run_python(),
    reason="needs root, setpriv, and a python that uid 65534 can run",
)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A root-owned directory that nobody may enter but not write (pytest's own
    tmp_path is 0700 under root's)."""
    directory = Path(tempfile.mkdtemp(prefix="history-access-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory)


def _history_for_group(directory: Path) -> Path:
    """A history the way the controller leaves it (0640), readable by group nogroup."""
    path = directory / "history.db"
    HistoryStore(path).close()
    os.chown(path, 0, NOBODY)
    with HistoryStore(path) as store:
        store.open_incident("host_frozen", ["spark-3"], detected_at=1e9, evidence={})
    return path


def _as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AS_NOBODY, sys.executable, "-m", "spark_watchdog", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


@needs_nobody
def test_a_reader_without_write_access_reads_a_closed_wal_history(shared_dir: Path) -> None:
    path = _history_for_group(shared_dir)
    assert not Path(f"{path}-wal").exists() and not Path(f"{path}-shm").exists()
    with HistoryStore(path) as store:  # a running controller's last word, then it stops
        store.open_incident("serving_stalled", ["spark-1"], detected_at=2e9, evidence={})
    done = _as_nobody("history", "--db", str(path), "--json")
    assert done.returncode == 0, done.stderr
    kinds = [i["kind"] for i in json.loads(done.stdout)["incidents"]]
    assert kinds == ["serving_stalled", "host_frozen"]
    assert done.stderr == (
        f"spark-watchdog: note: read {path} as an immutable snapshot: this user cannot "
        f"create its -shm file (no write access to {shared_dir}), so writes made "
        "meanwhile are not seen\n"
    )
    shown = _as_nobody("show", "1", "--db", str(path))
    assert shown.returncode == 0 and "incident #1: host_frozen on spark-3" in shown.stdout
    # Nothing was created next to it.
    assert sorted(p.name for p in shared_dir.iterdir()) == ["history.db"]


@needs_nobody
def test_a_reader_without_write_access_sees_what_a_running_controller_wrote(
    shared_dir: Path,
) -> None:
    path = _history_for_group(shared_dir)
    with HistoryStore(path) as controller:
        controller.open_incident("serving_stalled", ["spark-1"], detected_at=2e9, evidence={})
        assert Path(f"{path}-wal").stat().st_size > 0  # not checkpointed yet
        done = _as_nobody("history", "--db", str(path), "--json")
    assert done.returncode == 0, done.stderr
    assert [i["kind"] for i in json.loads(done.stdout)["incidents"]] == [
        "serving_stalled",
        "host_frozen",
    ]
    assert done.stderr == ""  # a normal read-only read, through the controller's -shm


@needs_nobody
def test_a_reader_who_may_not_read_the_file_is_told_whose_it_is(shared_dir: Path) -> None:
    path = shared_dir / "history.db"
    HistoryStore(path).close()  # 0640 root:root
    done = _as_nobody("history", "--db", str(path))
    assert done.returncode == 1
    assert done.stderr == (
        f"spark-watchdog: cannot read history database {path}: permission denied "
        "(mode 0640, owner root, group root); read it as root or as a member of group root\n"
    )


# --- what the history never keeps ----------------------------------------------------


def _cells(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        rows: list[str] = []
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            rows.extend(map(str, conn.execute(f"SELECT * FROM {table}").fetchall()))
    return "\n".join(rows)


def test_serving_secrets_are_never_stored(store: HistoryStore, db_path: Path) -> None:
    # An agent's state as the controller keeps it as evidence; an older agent's
    # argv is not redacted at the source, so the history does it.
    argv = ["vllm", "serve", "m", "--api-key", "sk-live-1", "--hf-token=hf_2", "HF_TOKEN=hf_3"]
    state = {"serving": {"argv": argv, "state": "running"}}
    incident = store.open_incident(
        "serving_stalled", ["spark-1"], detected_at=1e9, evidence={"agent_state": state}
    )
    store.add_step(
        incident.id,
        "serving_restart_done",
        detail={"error": "spark-1: start answered 500: 'vllm --api-key sk-live-1'"},
    )
    restart = store.start_serving_restart("safe", incident_id=incident.id)
    store.finish_serving_restart(
        restart.id,
        "failed",
        step_durations={"stop spark-1": 0.1},
        error='spark-1: start answered 500: b\'{"argv": ["vllm", "--api-key", "sk-live-1"]\'',
    )
    cells = _cells(db_path)
    for secret in ("sk-live-1", "hf_2", "hf_3"):
        assert secret not in cells
    evidence = store.get_incident(incident.id).evidence
    assert evidence["agent_state"]["serving"]["argv"] == [
        "vllm",
        "serve",
        "m",
        "--api-key",
        "***",
        "--hf-token=***",
        "HF_TOKEN=***",
    ]
    assert store.serving_restarts()[0].error == (
        'spark-1: start answered 500: b\'{"argv": ["vllm", "--api-key", "***"]\''
    )


# --- ids SQLite cannot hold -------------------------------------------------------------


def test_an_id_beyond_sqlite_integers_is_no_such_incident(store: HistoryStore) -> None:
    huge = 10**23
    assert store.incident(huge) is None
    with pytest.raises(UnknownRecord, match=f"no incident {huge} in history"):
        store.get_incident(huge)
    with pytest.raises(UnknownRecord, match=f"no incident {huge} in history"):
        store.add_step(huge, "note")
    with pytest.raises(
        InvalidRecord, match="limit must be an integer from 0 to 9223372036854775807"
    ):
        store.list_incidents(limit=2**63)
