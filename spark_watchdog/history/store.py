"""The controller's freeze history: one SQLite file in WAL mode.

Who uses it and how:

- the controller writes incidents, the write-ahead log of their steps,
  actions, boots and serving restarts, and reads holds and settings every loop;
- the CLI writes holds and settings and reads everything, with or without a
  running controller: WAL lets it read while the controller writes, and a
  write from either side waits at most ``busy_timeout`` for the other.

The API is synchronous. One ``HistoryStore`` owns one connection, guarded by
a lock, so it may be shared between threads (``check_same_thread=False``).
Writes are small, but each one waits for an fsync and, when another process
holds the write lock, up to ``busy_timeout``: the asyncio controller should
call it through ``asyncio.to_thread`` (or accept a short stall).

Every write commits before it returns, so "recorded" means "on disk" (see
``_configure`` for why that holds across a power loss of the controller
host). Every SQLite failure comes out as a ``StoreError`` that names the file
and says what to do; a raw ``sqlite3`` exception never escapes.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from spark_watchdog.errors import WatchdogError
from spark_watchdog.history.records import (
    ACTION_OPERATIONS,
    ACTION_RESULTS,
    CLUSTER,
    POWER_CUT_OPERATIONS,
    RESOLUTIONS,
    SERVING_RESTART_RESULTS,
    Action,
    Boot,
    Hold,
    Incident,
    IncidentStep,
    IncidentTimeline,
    Node,
    ServingRestart,
    Setting,
)
from spark_watchdog.history.schema import APPLICATION_ID, MIGRATIONS, statements
from spark_watchdog.redact import redact_record, redact_text

DEFAULT_BUSY_TIMEOUT_S = 2.0
# SQLite's INTEGER is 64-bit signed: row ids and limits above this cannot be bound.
SQLITE_MAX_INT = 2**63 - 1
# The incident kind that cuts power: at most one open per node.
FENCING_KIND = "host_frozen"

# -- errors --------------------------------------------------------------------
# These could move to spark_watchdog/errors.py next to the other families.


class StoreError(WatchdogError):
    """The freeze history could not be read or written. ``path`` names the file."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(message)


class StoreLocked(StoreError):
    """Another process held the write lock for longer than ``busy_timeout``."""


class StoreFull(StoreError):
    """SQLITE_FULL: the disk (or the database's page limit) is full."""


class StoreReadOnly(StoreError):
    """The file, its directory, or the store itself is read-only."""


class StoreCorrupt(StoreError):
    """Not a database, a malformed one, or a cell this store could not have written."""


class SchemaTooNew(StoreError):
    """The file was written by a newer spark-watchdog."""


class InvalidRecord(StoreError):
    """The caller passed a value the history cannot record (a bug in the caller)."""


class UnknownRecord(StoreError):
    """No such incident, action or serving restart."""


class IncidentAlreadyOpen(WatchdogError):
    """A node may have one open host_frozen incident at a time; a second one is refused.

    Not a StoreError: the history is fine, the caller asked for a second
    incident of a node that already has one (two controllers, or a bug).
    """

    def __init__(self, node: str, incident_id: int) -> None:
        self.node = node
        self.incident_id = incident_id
        super().__init__(f"{node} already has open incident #{incident_id}")


# -- the store -----------------------------------------------------------------

_SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")
_SETTING_KEY = re.compile(r"^[a-z][a-z0-9_.-]*$")


class HistoryStore:
    """The freeze history. Open with a path; ``close()`` (or ``with``) when done.

    ``read_only``: for the CLI's read commands. The file must exist and be at
    the current schema; nothing is created or migrated. ``clock`` supplies
    default times (UNIX seconds); every write also takes an explicit ``at``.
    ``migrations`` is for tests of future schema versions. ``":memory:"``
    works (no WAL, one store only) for tests of code that uses a store.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = DEFAULT_BUSY_TIMEOUT_S,
        read_only: bool = False,
        clock: Callable[[], float] = time.time,
        migrations: Sequence[str] = MIGRATIONS,
    ) -> None:
        self._path = os.fspath(path)
        self._busy_timeout = busy_timeout
        self._read_only = read_only
        self._clock = clock
        self._lock = threading.RLock()
        self._connection: sqlite3.Connection | None = None
        # Set when a read-only open could only read the file as immutable: what
        # the reader should be told about what it may not see.
        self.read_note: str | None = None
        self._connection = self._open(migrations)

    # -- lifecycle -----------------------------------------------------------

    @property
    def path(self) -> str:
        return self._path

    @property
    def read_only(self) -> bool:
        return self._read_only

    @property
    def schema_version(self) -> int:
        with self._reading("reading the schema version") as conn:
            return _user_version(conn)

    def close(self) -> None:
        with self._lock:
            conn, self._connection = self._connection, None
            if conn is not None:
                # Closing the last connection checkpoints the WAL into the file.
                with contextlib.suppress(sqlite3.Error):
                    conn.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self._read_only else "read-write"
        return f"HistoryStore({self._path!r}, {mode})"

    def _open(self, migrations: Sequence[str]) -> sqlite3.Connection:
        target = len(migrations)
        if self._read_only:
            return self._open_read_only(target)
        self._create_file()
        with self._guard("opening"):
            return self._connect(self._path, False, target, migrations)

    def _create_file(self) -> None:
        """Create a new history file 0640 (less under a stricter umask): it records
        what the cluster did, not for every user of the host. SQLite gives the -wal
        and -shm files the database file's mode."""
        if self._path == ":memory:" or self._path.startswith("file:"):
            return
        try:
            fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
        except FileExistsError:
            return
        except OSError as exc:
            raise StoreError(
                self._path,
                f"cannot open history database {self._path} ({exc.strerror or exc}); "
                "does its directory exist, and may this user write there?",
            ) from None
        os.close(fd)

    def _connect(
        self, database: str, as_uri: bool, target: int, migrations: Sequence[str] = ()
    ) -> sqlite3.Connection:
        conn = sqlite3.connect(
            database,
            uri=as_uri,
            timeout=self._busy_timeout,
            # Autocommit: every transaction is explicit (BEGIN IMMEDIATE
            # for writes), so nothing is ever left pending by accident.
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            self._check_identity(conn, target)
            self._configure(conn)
            if not self._read_only:
                migrate(conn, self._path, migrations)
            else:
                self._check_read_only_version(conn, target)
        except BaseException:
            conn.close()
            raise
        return conn

    def _open_read_only(self, target: int) -> sqlite3.Connection:
        """``mode=ro``; where that cannot work, an immutable read (see ``read_note``).

        Reading a WAL database needs its -shm file, which a reader creates when
        none is there (no controller has the file open). A user who may read the
        file but not write its directory cannot: SQLite then refuses even a
        read-only open, and the file is read as immutable instead.
        """
        path = self._path
        if not os.path.exists(path):
            raise StoreError(path, f"no history database at {path}")
        if not os.access(path, os.R_OK):
            raise StoreReadOnly(path, _unreadable(path))
        uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?"
        try:
            return self._connect(uri + "mode=ro", True, target)
        except sqlite3.Error as exc:
            if _primary_code(exc) not in (_SQLITE_READONLY, _SQLITE_CANTOPEN):
                raise self._error(exc, "opening") from exc
            first = exc
        try:
            conn = self._connect(uri + "immutable=1", True, target)
        except sqlite3.Error:
            raise self._error(first, "opening") from first
        directory = os.path.dirname(os.path.abspath(path))
        note = (
            f"read {path} as an immutable snapshot: this user cannot create its -shm file "
            f"(no write access to {directory}), so writes made meanwhile are not seen"
        )
        with contextlib.suppress(OSError):
            pending = os.path.getsize(path + "-wal")
            if pending:
                note += (
                    f", nor the {pending} bytes in {path}-wal not yet checkpointed "
                    "(read as the controller's user to see them)"
                )
        self.read_note = note
        return conn

    def _check_identity(self, conn: sqlite3.Connection, target: int) -> None:
        """Refuse a file that is someone else's database or from a newer version.

        Checked before switching to WAL, which would rewrite a foreign file's header.
        """
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = _user_version(conn)
        if app_id not in (0, APPLICATION_ID) or (app_id == 0 and version != 0):
            raise StoreError(
                self._path,
                f"{self._path} is not a spark-watchdog history database "
                f"(application_id {app_id:#x}, user_version {version})",
            )
        if app_id == 0 and conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            raise StoreError(
                self._path,
                f"{self._path} is an SQLite database with tables of its own, "
                "not a spark-watchdog history database",
            )
        if version > target:
            raise _too_new(self._path, version, target)

    def _configure(self, conn: sqlite3.Connection) -> None:
        if not self._read_only:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            # WAL: the CLI reads while the controller writes. It needs shared
            # memory, so it fails on network filesystems; :memory: has no WAL.
            if mode != "wal" and self._path != ":memory:":
                raise StoreError(
                    self._path,
                    f"history database {self._path}: could not switch to WAL mode "
                    f"(journal_mode is {mode!r}); is it on a network filesystem?",
                )
        # In WAL mode synchronous=NORMAL fsyncs only at checkpoints: a commit
        # survives a crash of this process but not a power loss of the host,
        # which would silently drop the last steps of the write-ahead log and
        # let a restarted controller repeat a power-off. FULL fsyncs the WAL at
        # every commit, so add_step is on disk when it returns. The cost (one
        # fsync per step, a few ms) is nothing next to a 60 s power-off hold.
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")

    def _check_read_only_version(self, conn: sqlite3.Connection, target: int) -> None:
        version = _user_version(conn)
        if version == 0:
            raise StoreError(self._path, f"{self._path} is an empty history database")
        if version < target:
            raise StoreError(
                self._path,
                f"history database {self._path} is at schema {version}, this spark-watchdog "
                f"reads schema {target}; open it read-write once (start the controller) "
                "to migrate it",
            )

    # -- transactions and errors -------------------------------------------------

    @contextlib.contextmanager
    def _guard(self, doing: str) -> Iterator[None]:
        """Turn any sqlite3 error into a StoreError that names the file and the way out."""
        try:
            yield
        except sqlite3.Error as exc:
            raise self._error(exc, doing) from exc

    def _error(self, exc: sqlite3.Error, doing: str) -> StoreError:
        error = _translate(exc, self._path, doing, self._busy_timeout)
        if isinstance(error, StoreReadOnly) and self._read_only:
            error = StoreReadOnly(
                self._path,
                f"history store {self._path} was opened read-only ({exc}, while {doing})",
            )
        return error

    def _conn(self) -> sqlite3.Connection:
        if self._connection is None:
            raise StoreError(self._path, f"history store {self._path} is closed")
        return self._connection

    @contextlib.contextmanager
    def _writing(self, doing: str) -> Iterator[sqlite3.Connection]:
        """One write transaction, committed (and fsynced) before the caller goes on."""
        with self._lock, self._guard(doing):
            conn = self._conn()
            # IMMEDIATE takes the write lock up front: the busy timeout then
            # applies here, and reads inside see no one else's later writes.
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                # SQLite rolls back by itself after some errors (SQLITE_FULL).
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def _reading(self, doing: str) -> Iterator[sqlite3.Connection]:
        """A consistent snapshot for reads that take several queries."""
        with self._lock, self._guard(doing):
            conn = self._conn()
            conn.execute("BEGIN")
            try:
                yield conn
            finally:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("COMMIT")

    def _now(self, at: float | None) -> float:
        return _time(self._clock() if at is None else at, "at", self._path)

    # -- JSON cells ----------------------------------------------------------------

    def _dump(self, value: Any, what: str, *, mapping: bool = True) -> str:
        if mapping and not isinstance(value, Mapping):
            raise InvalidRecord(
                self._path, f"{what} must be a JSON object, got {type(value).__name__}"
            )
        try:
            # The history never keeps a secret: an agent's state carries its
            # serving argv, and error texts may quote one.
            value = redact_record(value)
            return json.dumps(value, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as exc:
            raise InvalidRecord(self._path, f"{what} is not JSON-serialisable: {exc}") from None

    def _load(self, text: Any, what: str, *, mapping: bool = True) -> Any:
        try:
            value = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise StoreCorrupt(
                self._path,
                f"history database {self._path}: {what} is not valid JSON ({exc}); "
                "the row was changed outside spark-watchdog",
            ) from None
        if mapping and not isinstance(value, dict):
            raise StoreCorrupt(
                self._path,
                f"history database {self._path}: {what} should be a JSON object, "
                f"found {type(value).__name__}",
            )
        return value

    # -- row -> record ------------------------------------------------------------

    def _incident(self, row: sqlite3.Row | tuple[Any, ...], nodes: Sequence[str]) -> Incident:
        (id_, kind, opened_at, detected_at, fault_onset, evidence, dry_run, status) = row[:8]
        (resolution, resolved_at, ttd, ttr) = row[8:12]
        return Incident(
            id=id_,
            kind=kind,
            nodes=tuple(nodes),
            opened_at=opened_at,
            detected_at=detected_at,
            fault_onset=fault_onset,
            evidence=self._load(evidence, f"incident {id_} evidence"),
            dry_run=bool(dry_run),
            status=status,
            resolution=resolution,
            resolved_at=resolved_at,
            time_to_detect_s=ttd,
            time_to_recover_s=ttr,
        )

    def _incidents(self, conn: sqlite3.Connection, rows: list[Any]) -> list[Incident]:
        ids = [row[0] for row in rows]
        nodes: dict[int, list[str]] = {i: [] for i in ids}
        for chunk in _chunks(ids, 500):  # old SQLite allows 999 parameters
            marks = ",".join("?" * len(chunk))
            for incident_id, node in conn.execute(
                f"SELECT incident_id, node FROM incident_nodes WHERE incident_id IN ({marks}) "
                "ORDER BY incident_id, position",
                chunk,
            ):
                nodes[incident_id].append(node)
        return [self._incident(row, nodes[row[0]]) for row in rows]

    def _step(self, row: tuple[Any, ...]) -> IncidentStep:
        incident_id, seq, at, node, step, detail = row
        return IncidentStep(
            incident_id=incident_id,
            seq=seq,
            at=at,
            node=node,
            step=step,
            detail=self._load(detail, f"incident {incident_id} step {seq} detail"),
        )

    def _boot(self, row: tuple[Any, ...]) -> Boot:
        node, boot_id, first, last, clean, evidence, recorded, updated, incident_id = row
        return Boot(
            node=node,
            boot_id=boot_id,
            first_entry=first,
            last_entry=last,
            clean_shutdown=None if clean is None else bool(clean),
            evidence=self._load(evidence, f"boot {boot_id} of node {node} evidence"),
            recorded_at=recorded,
            updated_at=updated,
            incident_id=incident_id,
        )

    @staticmethod
    def _action(row: tuple[Any, ...]) -> Action:
        (id_, incident_id, node, rung, device, operation, requested, verified) = row[:8]
        result, error, dry_run = row[8:11]
        return Action(
            id=id_,
            incident_id=incident_id,
            node=node,
            rung=rung,
            device=device,
            operation=operation,
            requested_at=requested,
            verified_at=verified,
            result=result,
            error=error,
            dry_run=bool(dry_run),
        )

    def _serving_restart(self, row: tuple[Any, ...]) -> ServingRestart:
        id_, incident_id, profile, started, finished, duration, result, error, steps = row
        return ServingRestart(
            id=id_,
            incident_id=incident_id,
            profile=profile,
            started_at=started,
            finished_at=finished,
            duration_s=duration,
            result=result,
            error=error,
            step_durations=self._load(steps, f"serving restart {id_} step durations"),
        )

    @staticmethod
    def _hold(row: tuple[Any, ...]) -> Hold:
        id_, node, reason, created_at, created_by, released_at, released_by = row
        return Hold(
            id=id_,
            node=node,
            reason=reason,
            created_at=created_at,
            created_by=created_by,
            released_at=released_at,
            released_by=released_by,
        )

    def _setting(self, row: tuple[Any, ...]) -> Setting:
        key, value, changed_at, changed_by = row
        return Setting(
            key=key,
            value=self._load(value, f"setting {key!r} value", mapping=False),
            changed_at=changed_at,
            changed_by=changed_by,
        )

    # -- nodes ---------------------------------------------------------------------

    def _ensure_node(self, conn: sqlite3.Connection, name: str, at: float) -> None:
        conn.execute(
            "INSERT INTO nodes (name, first_seen) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
            (name, at),
        )

    def record_node(
        self, name: str, *, boot_id: str | None = None, at: float | None = None
    ) -> Node:
        """Note a node (first_seen is set once); with ``boot_id``, its newest boot.

        Call it when a node's boot id changes, not every poll: each call is a commit.
        """
        name = _node_name(name, self._path)
        boot = None if boot_id is None else _boot_id(boot_id, self._path)
        now = self._now(at)
        with self._writing(f"recording node {name}") as conn:
            self._ensure_node(conn, name, now)
            if boot is not None:
                conn.execute("UPDATE nodes SET last_boot_id = ? WHERE name = ?", (boot, name))
            row = conn.execute(
                "SELECT name, first_seen, last_boot_id FROM nodes WHERE name = ?", (name,)
            ).fetchone()
        return Node(*row)

    def nodes(self) -> list[Node]:
        with self._reading("listing nodes") as conn:
            rows = conn.execute("SELECT name, first_seen, last_boot_id FROM nodes ORDER BY name")
            return [Node(*row) for row in rows]

    # -- boots ---------------------------------------------------------------------

    def upsert_boot(
        self,
        node: str,
        boot_id: str,
        *,
        first_entry: float | None,
        last_entry: float | None,
        clean_shutdown: bool | None,
        evidence: Mapping[str, Any],
        incident_id: int | None = None,
        at: float | None = None,
    ) -> Boot:
        """Record one boot; the same (node, boot id) again updates the row, never duplicates.

        The newer report wins, except that a known value is never replaced by
        NULL (a boot that ended clean or unclean does not become "unknown"
        when a later report lost its journal file), and a linked incident stays
        linked unless another is given. Boot ids are normalised like the probes
        do it: dashes removed, lower case.
        """
        node = _node_name(node, self._path)
        boot = _boot_id(boot_id, self._path)
        first = _optional_time(first_entry, "first_entry", self._path)
        last = _optional_time(last_entry, "last_entry", self._path)
        if clean_shutdown is not None and not isinstance(clean_shutdown, bool):
            raise InvalidRecord(
                self._path, f"clean_shutdown must be true, false or null, got {clean_shutdown!r}"
            )
        evidence_json = self._dump(evidence, f"boot {boot} evidence")
        now = self._now(at)
        with self._writing(f"recording boot {boot} of {node}") as conn:
            if incident_id is not None:
                self._require_incident(conn, incident_id)
            self._ensure_node(conn, node, now)
            conn.execute(
                """
                INSERT INTO boots (node, boot_id, first_entry, last_entry, clean_shutdown,
                                   evidence, recorded_at, updated_at, incident_id)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
                ON CONFLICT (node, boot_id) DO UPDATE SET
                    first_entry = COALESCE(excluded.first_entry, boots.first_entry),
                    last_entry = COALESCE(excluded.last_entry, boots.last_entry),
                    clean_shutdown = COALESCE(excluded.clean_shutdown, boots.clean_shutdown),
                    evidence = excluded.evidence,
                    updated_at = excluded.updated_at,
                    incident_id = COALESCE(excluded.incident_id, boots.incident_id)
                """,
                (
                    node,
                    boot,
                    first,
                    last,
                    None if clean_shutdown is None else int(clean_shutdown),
                    evidence_json,
                    now,
                    now,
                    incident_id,
                ),
            )
            return self._boot(self._boot_row(conn, node, boot))

    def record_agent_boot(
        self,
        node: str,
        boot: Mapping[str, Any],
        *,
        incident_id: int | None = None,
        at: float | None = None,
    ) -> Boot:
        """Record one item of an agent's ``GET /v1/boots`` ``boots`` list.

        Times arrive as ISO-8601; everything besides the id, the times and
        ``clean_shutdown`` (evidence lines, evidence_counts, kernel_lines, ...)
        is kept as the boot's evidence. A boot the agent marks ``current``
        also becomes the node's ``last_boot_id``.
        """
        if not isinstance(boot, Mapping):
            raise InvalidRecord(self._path, f"agent boot must be an object, got {boot!r}")
        boot_id = boot.get("boot_id")
        if not isinstance(boot_id, str):
            raise InvalidRecord(self._path, f"agent boot has no boot_id: {boot!r:.200}")
        clean = boot.get("clean_shutdown")
        if clean is not None and not isinstance(clean, bool):
            raise InvalidRecord(
                self._path, f"agent boot {boot_id}: clean_shutdown must be a boolean or null"
            )
        evidence = {
            k: v
            for k, v in boot.items()
            if k not in ("boot_id", "first_entry", "last_entry", "clean_shutdown")
        }
        recorded = self.upsert_boot(
            node,
            boot_id,
            first_entry=_parse_time(boot.get("first_entry"), f"boot {boot_id}", self._path),
            last_entry=_parse_time(boot.get("last_entry"), f"boot {boot_id}", self._path),
            clean_shutdown=clean,
            evidence=evidence,
            incident_id=incident_id,
            at=at,
        )
        if boot.get("current") is True:
            self.record_node(node, boot_id=boot_id, at=at)
        return recorded

    def link_boot(self, node: str, boot_id: str, incident_id: int) -> Boot:
        """Link an already recorded boot to an incident (the boot it froze in, or came back as)."""
        node = _node_name(node, self._path)
        boot = _boot_id(boot_id, self._path)
        with self._writing(f"linking boot {boot} of {node}") as conn:
            self._require_incident(conn, incident_id)
            cur = conn.execute(
                "UPDATE boots SET incident_id = ? WHERE node = ? AND boot_id = ?",
                (incident_id, node, boot),
            )
            if cur.rowcount == 0:
                raise UnknownRecord(
                    self._path, f"no boot {boot} of node {node} in history {self._path}"
                )
            return self._boot(self._boot_row(conn, node, boot))

    def _boot_row(self, conn: sqlite3.Connection, node: str, boot: str) -> tuple[Any, ...]:
        row: tuple[Any, ...] = conn.execute(
            f"SELECT {_BOOT_COLUMNS} FROM boots WHERE node = ? AND boot_id = ?", (node, boot)
        ).fetchone()
        return row

    def boots(self, node: str, *, limit: int | None = None) -> list[Boot]:
        """A node's recorded boots, newest first (by first journal entry)."""
        node = _node_name(node, self._path)
        with self._reading(f"listing boots of {node}") as conn:
            rows = conn.execute(
                f"SELECT {_BOOT_COLUMNS} FROM boots WHERE node = ? "
                "ORDER BY first_entry IS NULL, first_entry DESC, recorded_at DESC LIMIT ?",
                (node, _limit(limit, self._path)),
            ).fetchall()
            return [self._boot(row) for row in rows]

    # -- incidents -----------------------------------------------------------------

    def _require_incident(self, conn: sqlite3.Connection, incident_id: int) -> str:
        """The incident's status; UnknownRecord when there is no such incident."""
        if not isinstance(incident_id, int) or isinstance(incident_id, bool):
            raise InvalidRecord(self._path, f"incident id must be an integer, got {incident_id!r}")
        if not _storable(incident_id):
            raise UnknownRecord(self._path, f"no incident {incident_id} in history {self._path}")
        row = conn.execute("SELECT status FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        if row is None:
            raise UnknownRecord(self._path, f"no incident {incident_id} in history {self._path}")
        status: str = row[0]
        return status

    def _insert_step(
        self,
        conn: sqlite3.Connection,
        incident_id: int,
        step: str,
        node: str | None,
        detail_json: str,
        at: float,
    ) -> IncidentStep:
        # Inside BEGIN IMMEDIATE: no other writer can take the same seq.
        (seq,) = conn.execute(
            "SELECT COALESCE(MAX(seq), 0) + 1 FROM incident_steps WHERE incident_id = ?",
            (incident_id,),
        ).fetchone()
        conn.execute(
            "INSERT INTO incident_steps (incident_id, seq, at, node, step, detail) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (incident_id, seq, at, node, step, detail_json),
        )
        return IncidentStep(incident_id, seq, at, node, step, json.loads(detail_json))

    def open_incident(
        self,
        kind: str,
        nodes: Sequence[str],
        *,
        detected_at: float,
        evidence: Mapping[str, Any],
        fault_onset: float | None = None,
        dry_run: bool = False,
        at: float | None = None,
    ) -> Incident:
        """Open an incident and write its first step, ``incident_opened``, in one commit.

        ``fault_onset`` is the last time the node(s) were seen healthy;
        ``time_to_detect_s`` is ``detected_at - fault_onset`` when it is known.
        """
        kind = _snake(kind, "incident kind", self._path)
        if isinstance(nodes, str) or not nodes:
            raise InvalidRecord(
                self._path, f"an incident needs a list of one or more nodes, got {nodes!r}"
            )
        names = [_node_name(n, self._path) for n in nodes]
        if len(set(names)) != len(names):
            raise InvalidRecord(self._path, f"incident nodes repeat a node: {names}")
        detected = _time(detected_at, "detected_at", self._path)
        onset = _optional_time(fault_onset, "fault_onset", self._path)
        evidence_json = self._dump(evidence, "incident evidence")
        now = self._now(at)
        ttd = None if onset is None else detected - onset
        with self._writing(f"opening a {kind} incident") as conn:
            # One open fencing incident per node (docs/design.md, invariant I2).
            # Inside BEGIN IMMEDIATE: no other writer can open one between the check and the insert.
            for name in names if kind == FENCING_KIND and not dry_run else ():
                row = conn.execute(
                    "SELECT i.id FROM incidents i JOIN incident_nodes n ON n.incident_id = i.id "
                    "WHERE n.node = ? AND i.status = 'open' AND i.dry_run = 0 AND i.kind = ? "
                    "LIMIT 1",
                    (name, FENCING_KIND),
                ).fetchone()
                if row is not None:
                    raise IncidentAlreadyOpen(name, int(row[0]))
            cur = conn.execute(
                "INSERT INTO incidents (kind, opened_at, detected_at, fault_onset, evidence, "
                "dry_run, status, time_to_detect_s) VALUES (?, ?, ?, ?, ?, ?, 'open', ?)",
                (kind, now, detected, onset, evidence_json, int(bool(dry_run)), ttd),
            )
            incident_id = cur.lastrowid
            assert incident_id is not None
            for position, name in enumerate(names):
                self._ensure_node(conn, name, now)
                conn.execute(
                    "INSERT INTO incident_nodes (incident_id, position, node) VALUES (?, ?, ?)",
                    (incident_id, position, name),
                )
            detail = {"kind": kind, "nodes": names, "dry_run": bool(dry_run)}
            self._insert_step(
                conn,
                incident_id,
                "incident_opened",
                names[0] if len(names) == 1 else None,
                json.dumps(detail),
                now,
            )
            return self._get_incident(conn, incident_id)

    def resolve_incident(
        self,
        incident_id: int,
        resolution: str,
        *,
        detail: Mapping[str, Any] | None = None,
        at: float | None = None,
    ) -> Incident:
        """Close an incident and write its last step, ``resolved``, in one commit.

        ``resolution``: recovered | gave_up | false_alarm. ``time_to_recover_s``
        is ``resolved_at - detected_at`` (how long the watchdog took once it
        knew), set only for ``recovered``. Resolving twice is an error.
        """
        resolution = _choice(resolution, RESOLUTIONS, "resolution", self._path)
        self._dump({} if detail is None else detail, "resolution detail")
        detail_json = self._dump({"resolution": resolution, **(detail or {})}, "resolution detail")
        now = self._now(at)
        with self._writing(f"resolving incident {incident_id}") as conn:
            if self._require_incident(conn, incident_id) != "open":
                raise InvalidRecord(self._path, f"incident {incident_id} is already resolved")
            (detected,) = conn.execute(
                "SELECT detected_at FROM incidents WHERE id = ?", (incident_id,)
            ).fetchone()
            ttr = now - detected if resolution == "recovered" else None
            conn.execute(
                "UPDATE incidents SET status = 'resolved', resolution = ?, resolved_at = ?, "
                "time_to_recover_s = ? WHERE id = ?",
                (resolution, now, ttr, incident_id),
            )
            self._insert_step(conn, incident_id, "resolved", None, detail_json, now)
            return self._get_incident(conn, incident_id)

    def _get_incident(self, conn: sqlite3.Connection, incident_id: int) -> Incident:
        rows = (
            conn.execute(
                f"SELECT {_INCIDENT_COLUMNS} FROM incidents WHERE id = ?", (incident_id,)
            ).fetchall()
            if _storable(incident_id)
            else []
        )
        if not rows:
            raise UnknownRecord(self._path, f"no incident {incident_id} in history {self._path}")
        return self._incidents(conn, rows)[0]

    def get_incident(self, incident_id: int) -> Incident:
        """One incident; UnknownRecord when there is none with this id."""
        with self._reading(f"reading incident {incident_id}") as conn:
            return self._get_incident(conn, incident_id)

    def open_incidents(self) -> list[Incident]:
        """Incidents not yet resolved, oldest first: what a restarted controller resumes."""
        with self._reading("listing open incidents") as conn:
            rows = conn.execute(
                f"SELECT {_INCIDENT_COLUMNS} FROM incidents WHERE status = 'open' ORDER BY id"
            ).fetchall()
            return self._incidents(conn, rows)

    def list_incidents(
        self,
        *,
        node: str | None = None,
        since: float | None = None,
        kind: str | None = None,
        status: str | None = None,
        limit: int | None = 100,
    ) -> list[Incident]:
        """Incidents newest first; ``since`` filters on ``detected_at`` (UNIX seconds)."""
        where: list[str] = []
        params: list[Any] = []
        if node is not None:
            where.append("id IN (SELECT incident_id FROM incident_nodes WHERE node = ?)")
            params.append(node)
        if since is not None:
            where.append("detected_at >= ?")
            params.append(_time(since, "since", self._path))
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        if status is not None:
            where.append("status = ?")
            params.append(_choice(status, ("open", "resolved"), "status", self._path))
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        params.append(_limit(limit, self._path))
        with self._reading("listing incidents") as conn:
            rows = conn.execute(
                f"SELECT {_INCIDENT_COLUMNS} FROM incidents {clause} "
                "ORDER BY detected_at DESC, id DESC LIMIT ?",
                params,
            ).fetchall()
            return self._incidents(conn, rows)

    def incident(self, incident_id: int) -> IncidentTimeline | None:
        """One incident with its steps, actions, serving restarts and linked boots;
        None when there is none with this id (an id SQLite cannot hold included)."""
        if not _storable(incident_id):
            return None
        with self._reading(f"reading incident {incident_id}") as conn:
            rows = conn.execute(
                f"SELECT {_INCIDENT_COLUMNS} FROM incidents WHERE id = ?", (incident_id,)
            ).fetchall()
            if not rows:
                return None
            incident = self._incidents(conn, rows)[0]
            steps = conn.execute(
                f"SELECT {_STEP_COLUMNS} FROM incident_steps WHERE incident_id = ? ORDER BY seq",
                (incident_id,),
            ).fetchall()
            actions = conn.execute(
                f"SELECT {_ACTION_COLUMNS} FROM actions WHERE incident_id = ? ORDER BY id",
                (incident_id,),
            ).fetchall()
            restarts = conn.execute(
                f"SELECT {_RESTART_COLUMNS} FROM serving_restarts WHERE incident_id = ? "
                "ORDER BY id",
                (incident_id,),
            ).fetchall()
            boots = conn.execute(
                f"SELECT {_BOOT_COLUMNS} FROM boots WHERE incident_id = ? "
                "ORDER BY first_entry, node",
                (incident_id,),
            ).fetchall()
            return IncidentTimeline(
                incident=incident,
                steps=tuple(self._step(r) for r in steps),
                actions=tuple(self._action(r) for r in actions),
                serving_restarts=tuple(self._serving_restart(r) for r in restarts),
                boots=tuple(self._boot(r) for r in boots),
            )

    # -- the write-ahead log ---------------------------------------------------------

    def add_step(
        self,
        incident_id: int,
        step: str,
        *,
        node: str | None = None,
        detail: Mapping[str, Any] | None = None,
        at: float | None = None,
    ) -> IncidentStep:
        """Append one step to an open incident's log. Durable when it returns.

        The controller records a step *before* taking it; after a crash it
        reads ``open_incidents()`` and ``steps()`` / ``last_step()`` to resume
        without repeating a completed off or on. ``seq`` counts from 1.
        """
        step = _snake(step, "step", self._path)
        name = None if node is None else _node_name(node, self._path)
        detail_json = self._dump({} if detail is None else detail, f"step {step} detail")
        now = self._now(at)
        with self._writing(f"recording step {step} of incident {incident_id}") as conn:
            if self._require_incident(conn, incident_id) != "open":
                raise InvalidRecord(
                    self._path, f"incident {incident_id} is resolved; it takes no more steps"
                )
            if name is not None:
                self._ensure_node(conn, name, now)
            return self._insert_step(conn, incident_id, step, name, detail_json, now)

    def steps(self, incident_id: int) -> list[IncidentStep]:
        """An incident's log in order (empty for an unknown incident)."""
        with self._reading(f"reading steps of incident {incident_id}") as conn:
            rows = conn.execute(
                f"SELECT {_STEP_COLUMNS} FROM incident_steps WHERE incident_id = ? ORDER BY seq",
                (incident_id,),
            ).fetchall()
            return [self._step(row) for row in rows]

    def last_step(self, incident_id: int, node: str | None = None) -> IncidentStep | None:
        """The newest step of an incident; with ``node``, the newest step about that node."""
        query = f"SELECT {_STEP_COLUMNS} FROM incident_steps WHERE incident_id = ?"
        params: list[Any] = [incident_id]
        if node is not None:
            query += " AND node = ?"
            params.append(node)
        with self._reading(f"reading steps of incident {incident_id}") as conn:
            row = conn.execute(query + " ORDER BY seq DESC LIMIT 1", params).fetchone()
            return None if row is None else self._step(row)

    # -- actions -------------------------------------------------------------------

    def record_action(
        self,
        node: str,
        operation: str,
        *,
        device: str,
        incident_id: int | None = None,
        rung: int | None = None,
        dry_run: bool = False,
        step: str | None = None,
        step_detail: Mapping[str, Any] | None = None,
        at: float | None = None,
    ) -> Action:
        """Record an action before it is sent: result ``pending`` (``dry_run`` in dry run).

        With ``step`` (e.g. ``off_requested``) the incident's log gets that step
        in the same commit, its detail carrying ``action_id``, so the log and
        the actions table never disagree after a crash.
        """
        name = _node_name(node, self._path)
        operation = _choice(operation, ACTION_OPERATIONS, "operation", self._path)
        if not isinstance(device, str) or not device:
            raise InvalidRecord(self._path, f"action device must be a non-empty string: {device!r}")
        if rung is not None and (not isinstance(rung, int) or isinstance(rung, bool)):
            raise InvalidRecord(self._path, f"rung must be an integer, got {rung!r}")
        if step is not None:
            step = _snake(step, "step", self._path)
            if incident_id is None:
                raise InvalidRecord(self._path, "an action without an incident cannot add a step")
        extra = self._dump({} if step_detail is None else step_detail, "step detail")
        now = self._now(at)
        result = "dry_run" if dry_run else "pending"
        with self._writing(f"recording {operation} of {name}") as conn:
            if incident_id is not None and self._require_incident(conn, incident_id) != "open":
                raise InvalidRecord(self._path, f"incident {incident_id} is resolved")
            self._ensure_node(conn, name, now)
            cur = conn.execute(
                "INSERT INTO actions (incident_id, node, rung, device, operation, requested_at, "
                "result, dry_run) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (incident_id, name, rung, device, operation, now, result, int(bool(dry_run))),
            )
            action_id = cur.lastrowid
            assert action_id is not None
            if step is not None and incident_id is not None:
                detail = {"action_id": action_id, "operation": operation, "device": device}
                detail.update(json.loads(extra))
                self._insert_step(conn, incident_id, step, name, json.dumps(detail), now)
            return self._get_action(conn, action_id)

    def finish_action(
        self,
        action_id: int,
        result: str,
        *,
        verified_at: float | None = None,
        error: str | None = None,
        step: str | None = None,
        step_detail: Mapping[str, Any] | None = None,
        at: float | None = None,
    ) -> Action:
        """Set an action's outcome; with ``step`` (``off_verified``, ...) log it in the same commit.

        ``verified_at`` defaults to ``at`` for ``verified``. An action that is
        ``verified``, ``failed`` or ``dry_run`` is final; a ``pending`` or
        ``ambiguous`` one may still be finished (after re-reading the state).
        """
        result = _choice(result, ACTION_RESULTS, "action result", self._path)
        if result == "pending":
            raise InvalidRecord(self._path, "an action cannot be finished as pending")
        if error is not None and not isinstance(error, str):
            raise InvalidRecord(self._path, f"action error must be text, got {error!r}")
        if error is not None:
            error = redact_text(error)
        if step is not None:
            step = _snake(step, "step", self._path)
        extra = self._dump({} if step_detail is None else step_detail, "step detail")
        now = self._now(at)
        verified = _optional_time(verified_at, "verified_at", self._path)
        if verified is None and result == "verified":
            verified = now
        with self._writing(f"finishing action {action_id}") as conn:
            action = self._get_action(conn, action_id)
            if action.result in ("verified", "failed", "dry_run"):
                raise InvalidRecord(
                    self._path, f"action {action_id} is already finished ({action.result})"
                )
            conn.execute(
                "UPDATE actions SET result = ?, verified_at = ?, error = ? WHERE id = ?",
                (result, verified, error, action_id),
            )
            if step is not None:
                if action.incident_id is None:
                    raise InvalidRecord(
                        self._path, f"action {action_id} has no incident to add a step to"
                    )
                if self._require_incident(conn, action.incident_id) != "open":
                    raise InvalidRecord(self._path, f"incident {action.incident_id} is resolved")
                detail: dict[str, Any] = {"action_id": action_id, "result": result}
                if error is not None:
                    detail["error"] = error
                detail.update(json.loads(extra))
                self._insert_step(
                    conn, action.incident_id, step, action.node, json.dumps(detail), now
                )
            return self._get_action(conn, action_id)

    def _get_action(self, conn: sqlite3.Connection, action_id: int) -> Action:
        row = conn.execute(
            f"SELECT {_ACTION_COLUMNS} FROM actions WHERE id = ?", (action_id,)
        ).fetchone()
        if row is None:
            raise UnknownRecord(self._path, f"no action {action_id} in history {self._path}")
        return self._action(row)

    def actions(
        self, *, node: str | None = None, incident_id: int | None = None, limit: int | None = 100
    ) -> list[Action]:
        """Actions newest first, optionally of one node or one incident."""
        where: list[str] = []
        params: list[Any] = []
        if node is not None:
            where.append("node = ?")
            params.append(node)
        if incident_id is not None:
            where.append("incident_id = ?")
            params.append(incident_id)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        params.append(_limit(limit, self._path))
        with self._reading("listing actions") as conn:
            rows = conn.execute(
                f"SELECT {_ACTION_COLUMNS} FROM actions {clause} ORDER BY id DESC LIMIT ?", params
            ).fetchall()
            return [self._action(row) for row in rows]

    # -- budgets -------------------------------------------------------------------
    # The rule: a power cut is an `off` or `cycle` action that was not a dry
    # run, requested at or after `since`, WHATEVER its result. A pending or
    # ambiguous command may have cut power; a failed one may have cut it and
    # then failed to verify. Over-counting makes the controller hold a node
    # early (a person looks); under-counting would cycle a node more often than
    # the operator allowed. Record a cycle either as one `cycle` action or as
    # `off` + `on` actions, not both, or it counts twice. Operator-initiated
    # actions (no incident) count too: the hardware does not know who asked.

    def power_cycles_since(self, node: str, since: float) -> int:
        """Power cuts of one node requested at or after ``since`` (see the rule above)."""
        return len(self.power_cut_times(since, node=node))

    def cluster_power_cycles_since(self, since: float) -> int:
        """Power cuts of every node requested at or after ``since``."""
        return len(self.power_cut_times(since))

    def power_cut_times(self, since: float, *, node: str | None = None) -> list[float]:
        """When each counted power cut was requested, oldest first.

        For status: the budget frees up again when the oldest one leaves the window.
        """
        start = _time(since, "since", self._path)
        ops = ",".join(f"'{op}'" for op in POWER_CUT_OPERATIONS)
        query = (
            f"SELECT requested_at FROM actions WHERE operation IN ({ops}) AND dry_run = 0 "
            "AND requested_at >= ?"
        )
        params: list[Any] = [start]
        if node is not None:
            query += " AND node = ?"
            params.append(node)
        with self._reading("counting power cycles") as conn:
            return [row[0] for row in conn.execute(query + " ORDER BY requested_at", params)]

    def power_cuts_since(self, since: float) -> list[tuple[int, str, float]]:
        """(action id, node, requested_at) of each counted power cut at or after ``since``."""
        start = _time(since, "since", self._path)
        ops = ",".join(f"'{op}'" for op in POWER_CUT_OPERATIONS)
        query = (
            f"SELECT id, node, requested_at FROM actions WHERE operation IN ({ops}) "
            "AND dry_run = 0 AND requested_at >= ? ORDER BY requested_at"
        )
        with self._reading("counting power cycles") as conn:
            return [(row[0], row[1], row[2]) for row in conn.execute(query, (start,))]

    # -- serving restarts ------------------------------------------------------------

    def start_serving_restart(
        self, profile: str, *, incident_id: int | None = None, at: float | None = None
    ) -> ServingRestart:
        """Record a serving restart as it begins (result ``running``)."""
        if not isinstance(profile, str) or not profile:
            raise InvalidRecord(self._path, f"profile must be a non-empty string: {profile!r}")
        now = self._now(at)
        with self._writing(f"recording a serving restart with {profile}") as conn:
            if incident_id is not None:
                self._require_incident(conn, incident_id)
            cur = conn.execute(
                "INSERT INTO serving_restarts (incident_id, profile, started_at, result, "
                "step_durations) VALUES (?, ?, ?, 'running', '{}')",
                (incident_id, profile, now),
            )
            restart_id = cur.lastrowid
            assert restart_id is not None
            return self._get_serving_restart(conn, restart_id)

    def finish_serving_restart(
        self,
        restart_id: int,
        result: str,
        *,
        step_durations: Mapping[str, float],
        error: str | None = None,
        at: float | None = None,
    ) -> ServingRestart:
        """Set a restart's outcome; ``duration_s`` is ``at - started_at``."""
        result = _choice(result, SERVING_RESTART_RESULTS, "serving restart result", self._path)
        if result == "running":
            raise InvalidRecord(self._path, "a serving restart cannot be finished as running")
        for step, seconds in dict(step_durations).items():
            if not isinstance(step, str):
                raise InvalidRecord(self._path, f"step_durations key must be text: {step!r}")
            _time(seconds, f"step_durations[{step!r}]", self._path)
        steps_json = self._dump(step_durations, "step_durations")
        if error is not None and not isinstance(error, str):
            raise InvalidRecord(self._path, f"serving restart error must be text, got {error!r}")
        if error is not None:
            error = redact_text(error)
        now = self._now(at)
        with self._writing(f"finishing serving restart {restart_id}") as conn:
            restart = self._get_serving_restart(conn, restart_id)
            if restart.result != "running":
                raise InvalidRecord(
                    self._path,
                    f"serving restart {restart_id} is already finished ({restart.result})",
                )
            conn.execute(
                "UPDATE serving_restarts SET finished_at = ?, duration_s = ?, result = ?, "
                "error = ?, step_durations = ? WHERE id = ?",
                (now, now - restart.started_at, result, error, steps_json, restart_id),
            )
            return self._get_serving_restart(conn, restart_id)

    def _get_serving_restart(self, conn: sqlite3.Connection, restart_id: int) -> ServingRestart:
        row = conn.execute(
            f"SELECT {_RESTART_COLUMNS} FROM serving_restarts WHERE id = ?", (restart_id,)
        ).fetchone()
        if row is None:
            raise UnknownRecord(
                self._path, f"no serving restart {restart_id} in history {self._path}"
            )
        return self._serving_restart(row)

    def repeat_offenders(self, since: float) -> tuple[dict[str, int], dict[str, int]]:
        """Per node: host_frozen incidents detected at or after ``since`` (not dry
        runs, not false alarms), and power cycles ever (not dry runs)."""
        start = _time(since, "since", self._path)
        with self._reading("counting freezes and cycles per node") as conn:
            freezes = conn.execute(
                "SELECT n.node, COUNT(*) FROM incidents i JOIN incident_nodes n "
                "ON n.incident_id = i.id WHERE i.kind = 'host_frozen' AND i.dry_run = 0 "
                "AND i.detected_at >= ? AND (i.resolution IS NULL OR i.resolution != "
                "'false_alarm') GROUP BY n.node",
                (start,),
            ).fetchall()
            cycles = conn.execute(
                "SELECT node, COUNT(*) FROM actions WHERE operation = 'cycle' AND dry_run = 0 "
                "GROUP BY node"
            ).fetchall()
        return {r[0]: int(r[1]) for r in freezes}, {r[0]: int(r[1]) for r in cycles}

    def serving_restarts_for(self, kinds: Sequence[str], since: float) -> list[int]:
        """Ids of serving restarts started at or after ``since`` (UNIX seconds) for an
        incident of one of ``kinds``, oldest first."""
        marks = ", ".join("?" for _ in kinds)
        with self._reading("listing serving restarts by incident kind") as conn:
            rows = conn.execute(
                "SELECT r.id FROM serving_restarts r JOIN incidents i ON i.id = r.incident_id "
                f"WHERE r.started_at >= ? AND i.kind IN ({marks}) ORDER BY r.id",
                (_time(since, "since", self._path), *kinds),
            ).fetchall()
            return [int(row[0]) for row in rows]

    def serving_restarts(self, *, limit: int | None = 20) -> list[ServingRestart]:
        """Serving restarts newest first, operator-initiated ones included."""
        with self._reading("listing serving restarts") as conn:
            rows = conn.execute(
                f"SELECT {_RESTART_COLUMNS} FROM serving_restarts ORDER BY id DESC LIMIT ?",
                (_limit(limit, self._path),),
            ).fetchall()
            return [self._serving_restart(row) for row in rows]

    # -- holds ---------------------------------------------------------------------

    def hold(self, node: str, reason: str, *, by: str, at: float | None = None) -> Hold:
        """Hold a node, or the whole cluster with ``CLUSTER`` ("*").

        At most one active hold per target: holding a held target returns the
        existing hold unchanged (its reason stands until it is released).
        """
        target = _hold_target(node, self._path)
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidRecord(self._path, "a hold needs a reason")
        by = _who(by, self._path)
        now = self._now(at)
        with self._writing(f"holding {target}") as conn:
            row = conn.execute(
                f"SELECT {_HOLD_COLUMNS} FROM holds WHERE node = ? AND released_at IS NULL",
                (target,),
            ).fetchone()
            if row is not None:
                return self._hold(row)
            cur = conn.execute(
                "INSERT INTO holds (node, reason, created_at, created_by) VALUES (?, ?, ?, ?)",
                (target, reason, now, by),
            )
            row = conn.execute(
                f"SELECT {_HOLD_COLUMNS} FROM holds WHERE id = ?", (cur.lastrowid,)
            ).fetchone()
            return self._hold(row)

    def release(self, node: str, *, by: str, at: float | None = None) -> Hold | None:
        """Release the active hold on one target (a node, or "*"); None if it had none.

        Releasing "*" releases only the cluster-wide hold; see ``release_all``.
        """
        target = _hold_target(node, self._path)
        by = _who(by, self._path)
        now = self._now(at)
        with self._writing(f"releasing {target}") as conn:
            row = conn.execute(
                "SELECT id FROM holds WHERE node = ? AND released_at IS NULL", (target,)
            ).fetchone()
            if row is None:
                return None
            conn.execute(
                "UPDATE holds SET released_at = ?, released_by = ? WHERE id = ?", (now, by, row[0])
            )
            row = conn.execute(
                f"SELECT {_HOLD_COLUMNS} FROM holds WHERE id = ?", (row[0],)
            ).fetchone()
            return self._hold(row)

    def release_all(self, *, by: str, at: float | None = None) -> list[Hold]:
        """Release every active hold, per node and cluster-wide; returns them."""
        by = _who(by, self._path)
        now = self._now(at)
        with self._writing("releasing all holds") as conn:
            ids = [r[0] for r in conn.execute("SELECT id FROM holds WHERE released_at IS NULL")]
            released = []
            for hold_id in ids:
                conn.execute(
                    "UPDATE holds SET released_at = ?, released_by = ? WHERE id = ?",
                    (now, by, hold_id),
                )
                row = conn.execute(
                    f"SELECT {_HOLD_COLUMNS} FROM holds WHERE id = ?", (hold_id,)
                ).fetchone()
                released.append(self._hold(row))
            return released

    def active_holds(self) -> list[Hold]:
        """Every hold not yet released, oldest first. The controller reads this every loop."""
        with self._reading("reading holds") as conn:
            rows = conn.execute(
                f"SELECT {_HOLD_COLUMNS} FROM holds WHERE released_at IS NULL ORDER BY id"
            ).fetchall()
            return [self._hold(row) for row in rows]

    def active_hold(self, node: str) -> Hold | None:
        """The hold that stops automatic action on ``node``: its own, else the cluster's."""
        target = _hold_target(node, self._path)
        with self._reading(f"reading holds of {target}") as conn:
            row = conn.execute(
                f"SELECT {_HOLD_COLUMNS} FROM holds WHERE node IN (?, ?) "
                "AND released_at IS NULL ORDER BY node = ? LIMIT 1",
                (target, CLUSTER, CLUSTER),
            ).fetchone()
            return None if row is None else self._hold(row)

    def holds(self, *, limit: int | None = 100) -> list[Hold]:
        """Holds newest first, released ones included."""
        with self._reading("listing holds") as conn:
            rows = conn.execute(
                f"SELECT {_HOLD_COLUMNS} FROM holds ORDER BY id DESC LIMIT ?",
                (_limit(limit, self._path),),
            ).fetchall()
            return [self._hold(row) for row in rows]

    # -- cluster settings ---------------------------------------------------------------

    def set_setting(self, key: str, value: Any, *, by: str, at: float | None = None) -> Setting:
        """Set a cluster setting (any JSON value), noting who and when."""
        if not isinstance(key, str) or not _SETTING_KEY.match(key):
            raise InvalidRecord(
                self._path, f"setting key must be lower-case [a-z0-9_.-], got {key!r}"
            )
        value_json = self._dump(value, f"setting {key!r}", mapping=False)
        by = _who(by, self._path)
        now = self._now(at)
        with self._writing(f"setting {key}") as conn:
            conn.execute(
                "INSERT INTO settings (key, value, changed_at, changed_by) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value, "
                "changed_at = excluded.changed_at, changed_by = excluded.changed_by",
                (key, value_json, now, by),
            )
            row = conn.execute(
                "SELECT key, value, changed_at, changed_by FROM settings WHERE key = ?", (key,)
            ).fetchone()
            return self._setting(row)

    def setting(self, key: str) -> Setting | None:
        with self._reading(f"reading setting {key}") as conn:
            row = conn.execute(
                "SELECT key, value, changed_at, changed_by FROM settings WHERE key = ?", (key,)
            ).fetchone()
            return None if row is None else self._setting(row)

    def settings(self) -> dict[str, Setting]:
        with self._reading("reading settings") as conn:
            rows = conn.execute(
                "SELECT key, value, changed_at, changed_by FROM settings ORDER BY key"
            ).fetchall()
            return {row[0]: self._setting(row) for row in rows}

    # -- maintenance -------------------------------------------------------------------

    def integrity_check(self) -> list[str]:
        """SQLite's ``PRAGMA integrity_check`` findings; empty when the file is sound.

        Reads the whole file, so it is for ``doctor``, not for every open.
        Damage bad enough to stop the check is returned as its one finding.
        """
        try:
            with self._reading("checking integrity") as conn:
                found = [row[0] for row in conn.execute("PRAGMA integrity_check")]
        except StoreCorrupt as exc:
            return [str(exc)]
        return [] if found == ["ok"] else found


# -- migrations ----------------------------------------------------------------------


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
    found = _user_version(conn)
    if found > target:
        raise _too_new(path, found, target)
    version = found
    # Reading the version first keeps an up-to-date file from taking the write lock.
    while version < target:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = _user_version(conn)
            if version > target:
                raise _too_new(path, version, target)
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


def _user_version(conn: sqlite3.Connection) -> int:
    version: int = conn.execute("PRAGMA user_version").fetchone()[0]
    return version


def _too_new(path: str, found: int, supported: int) -> SchemaTooNew:
    return SchemaTooNew(
        path,
        f"history database {path} was written by a newer spark-watchdog "
        f"(schema {found} > {supported}); upgrade",
    )


# -- sqlite3 errors -> StoreError ------------------------------------------------------

# Primary result codes (extended codes carry them in the low byte).
_SQLITE_BUSY, _SQLITE_LOCKED, _SQLITE_READONLY = 5, 6, 8
_SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB = 11, 13, 14, 26

# Python 3.10 has no sqlite_errorcode on exceptions; fall back on SQLite's
# fixed English messages (sqlite3_errstr).
_BY_MESSAGE = (
    ("database is locked", _SQLITE_BUSY),
    ("database table is locked", _SQLITE_LOCKED),
    ("database or disk is full", _SQLITE_FULL),
    ("readonly database", _SQLITE_READONLY),
    ("database disk image is malformed", _SQLITE_CORRUPT),
    ("file is not a database", _SQLITE_NOTADB),
    ("unable to open database file", _SQLITE_CANTOPEN),
)


def _unreadable(path: str) -> str:
    """Why this user cannot read ``path``, and how to get to read it."""
    import grp
    import pwd

    try:
        info = os.stat(path)
    except OSError as exc:
        return f"cannot read history database {path}: {exc.strerror or exc}"
    try:
        owner = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        owner = str(info.st_uid)
    try:
        group = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        group = str(info.st_gid)
    return (
        f"cannot read history database {path}: permission denied (mode "
        f"{info.st_mode & 0o777:04o}, owner {owner}, group {group}); read it as {owner} "
        f"or as a member of group {group}"
    )


def _primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    text = str(exc)
    return next((c for needle, c in _BY_MESSAGE if needle in text), None)


def _translate(exc: sqlite3.Error, path: str, doing: str, busy_timeout: float) -> StoreError:
    code = _primary_code(exc)
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return StoreLocked(
            path,
            f"history database {path} is locked by another process "
            f"(waited {busy_timeout:g} s while {doing}: {exc})",
        )
    if code == _SQLITE_FULL:
        return StoreFull(
            path,
            f"history database {path}: disk full while {doing} ({exc}); "
            "free space on its filesystem",
        )
    if code == _SQLITE_READONLY:
        return StoreReadOnly(
            path,
            f"history database {path} is read-only ({exc}, while {doing}); writing needs "
            "write access to the file and its directory (WAL keeps -wal and -shm files there)",
        )
    if code in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
        return StoreCorrupt(
            path,
            f"history database {path} is corrupt ({exc}, while {doing}); "
            f"try `sqlite3 {path} .recover | sqlite3 {path}.recovered`, "
            "or move it aside to start a new history",
        )
    if code == _SQLITE_CANTOPEN:
        return StoreError(
            path,
            f"cannot open history database {path} ({exc}); "
            "does its directory exist, and may this user write there?",
        )
    return StoreError(path, f"history database {path}: {doing} failed: {exc}")


# -- validation ------------------------------------------------------------------------

_INCIDENT_COLUMNS = (
    "id, kind, opened_at, detected_at, fault_onset, evidence, dry_run, status, "
    "resolution, resolved_at, time_to_detect_s, time_to_recover_s"
)
_STEP_COLUMNS = "incident_id, seq, at, node, step, detail"
_BOOT_COLUMNS = (
    "node, boot_id, first_entry, last_entry, clean_shutdown, evidence, recorded_at, "
    "updated_at, incident_id"
)
_ACTION_COLUMNS = (
    "id, incident_id, node, rung, device, operation, requested_at, verified_at, result, "
    "error, dry_run"
)
_RESTART_COLUMNS = (
    "id, incident_id, profile, started_at, finished_at, duration_s, result, error, step_durations"
)
_HOLD_COLUMNS = "id, node, reason, created_at, created_by, released_at, released_by"


def _time(value: Any, what: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRecord(path, f"{what} must be a finite number of seconds, got {value!r}")
    return float(value)


def _optional_time(value: Any, what: str, path: str) -> float | None:
    return None if value is None else _time(value, what, path)


def _parse_time(value: Any, what: str, path: str) -> float | None:
    """An agent's ISO-8601 time (or UNIX seconds) as UNIX seconds."""
    if value is None or isinstance(value, (int, float)):
        return _optional_time(value, what, path)
    if isinstance(value, str):
        try:
            # Python 3.10's fromisoformat does not take a trailing "Z".
            parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            if parsed.tzinfo is None:  # the agent writes UTC; be explicit about it
                parsed = parsed.replace(tzinfo=timezone.utc)
            return parsed.timestamp()
    raise InvalidRecord(path, f"{what}: not an ISO-8601 time: {value!r}")


def _choice(value: Any, options: Sequence[str], what: str, path: str) -> str:
    if value not in options:
        raise InvalidRecord(path, f"{what} must be one of {', '.join(options)}; got {value!r}")
    chosen: str = value
    return chosen


def _snake(value: Any, what: str, path: str) -> str:
    if not isinstance(value, str) or not _SNAKE.match(value):
        raise InvalidRecord(path, f"{what} must be snake_case, got {value!r}")
    return value


def _node_name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value or value == CLUSTER or not value.isprintable():
        raise InvalidRecord(path, f"not a node name: {value!r}")
    return value


def _hold_target(value: Any, path: str) -> str:
    return CLUSTER if value == CLUSTER else _node_name(value, path)


def _boot_id(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRecord(path, f"not a boot id: {value!r}")
    # The host and journal probes drop the dashes of /proc's form; match them.
    return value.strip().replace("-", "").lower()


def _who(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRecord(path, f"'by' must name who acts (a user, or 'controller'): {value!r}")
    return value


def _limit(value: int | None, path: str) -> int:
    if value is None:
        return -1  # SQLite: no limit
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SQLITE_MAX_INT:
        raise InvalidRecord(
            path, f"limit must be an integer from 0 to {SQLITE_MAX_INT}, got {value!r}"
        )
    return value


def _storable(value: object) -> bool:
    """An integer SQLite can compare with (a larger one raises OverflowError)."""
    return isinstance(value, int) and -SQLITE_MAX_INT - 1 <= value <= SQLITE_MAX_INT


def _chunks(items: Sequence[int], size: int) -> Iterable[Sequence[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
