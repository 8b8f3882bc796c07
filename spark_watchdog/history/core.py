"""The core of the freeze history: one SQLite file in WAL mode, its
connection, transactions and errors, and the row helpers every table shares.

Who uses the history and how:

- the controller writes incidents, the write-ahead log of their steps,
  actions, boots and serving restarts, and reads holds and settings every loop;
- the CLI writes holds and settings and reads everything, with or without a
  running controller: WAL lets it read while the controller writes, and a
  write from either side waits at most ``busy_timeout`` for the other.

The API is synchronous. One store owns one connection, guarded by a lock, so
it may be shared between threads (``check_same_thread=False``). Writes are
small, but each one waits for an fsync and, when another process holds the
write lock, up to ``busy_timeout``: the asyncio controller calls it through
``asyncio.to_thread`` (the ledger).

Every write commits before it returns, so "recorded" means "on disk" (see
``_configure`` for why that holds across a power loss of the controller
host). Every SQLite failure comes out as a ``StoreError`` that names the file
and says what to do; a raw ``sqlite3`` exception never escapes.

The tables' queries live in modules of their own (``boots``, ``incidents``,
``actions``, ``serving``, ``holds``); ``history.store.HistoryStore`` puts
them together.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from spark_watchdog.errors import (
    InvalidRecord,
    StoreCorrupt,
    StoreError,
    StoreReadOnly,
    UnknownRecord,
)
from spark_watchdog.history import checks, sqlite_errors
from spark_watchdog.history import migrations as migrations_
from spark_watchdog.history.records import IncidentStep
from spark_watchdog.history.schema import APPLICATION_ID, MIGRATIONS
from spark_watchdog.redact import redact_record

DEFAULT_BUSY_TIMEOUT_S = 2.0


F = TypeVar("F", bound=Callable[..., Any])


def writes(method: F) -> F:
    """Marks a store method that writes the history. What reads it: the
    simulation, which injects history failures into writes and crashes the
    controller after each one (spark_watchdog/simulation/run.py); a test checks
    that every method that writes is marked."""
    method.history_write = True  # type: ignore[attr-defined]
    return method


def is_write(method: Callable[..., Any]) -> bool:
    """Whether ``method`` (bound or not) writes the history (``@writes``)."""
    return getattr(method, "history_write", False) is True


@dataclass(frozen=True)
class Dialect:
    """What the controller pair's lease (history/leadership.py) writes differently
    on each engine: the database's clock, the smaller of two values, row locks."""

    now: str  # an SQL expression: the database's clock, in seconds since the epoch
    least: str  # the function that returns the smaller of its arguments
    for_update: str  # a SELECT's suffix that locks the rows it reads for a write
    for_share: str  # ... for reading, while no one else may change them


# SQLite's clock is a function the store registers on its connection
# (``database_clock``): the clock of the host that has the file. Its writes
# are serialized by BEGIN IMMEDIATE, which leaves no row locks to ask for.
SQLITE = Dialect(now="watchdog_now()", least="MIN", for_update="", for_share="")


class WriteFence(Protocol):
    """Checked inside every write transaction of a fenced store, after the write
    lock: a controller of a pair writes only while it leads (history/leadership.py)."""

    @property
    def checked_epoch(self) -> int | None:
        """The epoch the current write's check passed at (written into its steps)."""
        ...

    def check(self, conn: Connection) -> None:
        """Raise NotLeader if this process may not write now."""
        ...

    def committed(self) -> None:
        """The transaction ``check`` last passed in committed."""
        ...


class Cursor(Protocol):
    """What the tables read from a query: sqlite3's cursor, or PostgreSQL's
    through history/postgres.py."""

    @property
    def lastrowid(self) -> int | None: ...

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """What the tables run their queries on, inside ``_writing`` or ``_reading``.

    The queries are written once, in the SQL both engines speak: ``?``
    placeholders, no engine's own functions (docs/design.md, "Freeze history").
    """

    def execute(self, sql: str, parameters: Sequence[Any] = ..., /) -> Cursor: ...


S = TypeVar("S", bound="StoreCore")


class StoreCore:
    """The freeze history's file. Open with a path; ``close()`` (or ``with``) when done.

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
        database_clock: Callable[[], float] = time.time,
    ) -> None:
        self._path = os.fspath(path)
        self._busy_timeout = busy_timeout
        self._read_only = read_only
        self._clock = clock
        # The database's own clock (``Dialect.now``), which a pair's lease reads.
        self._database_clock = database_clock
        self._fence: WriteFence | None = None
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
        with self._lock, self._guard("reading the schema version"):
            return migrations_.user_version(self._conn())

    def close(self) -> None:
        with self._lock:
            conn, self._connection = self._connection, None
            if conn is not None:
                # Closing the last connection checkpoints the WAL into the file.
                with contextlib.suppress(sqlite3.Error):
                    conn.close()

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "read-only" if self._read_only else "read-write"
        return f"{type(self).__name__}({self._path!r}, {mode})"

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
                migrations_.migrate(conn, self._path, migrations)
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
            raise StoreReadOnly(path, sqlite_errors.unreadable(path))
        uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?"
        try:
            return self._connect(uri + "mode=ro", True, target)
        except sqlite3.Error as exc:
            if sqlite_errors.primary_code(exc) not in sqlite_errors.READ_ONLY_OPEN_FAILURES:
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
        version = migrations_.user_version(conn)
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
            raise migrations_.too_new(self._path, version, target)

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
        conn.create_function("watchdog_now", 0, self._database_clock)

    def _check_read_only_version(self, conn: sqlite3.Connection, target: int) -> None:
        version = migrations_.user_version(conn)
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
        error = sqlite_errors.translate(exc, self._path, doing, self._busy_timeout)
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

    dialect: Dialect = SQLITE

    def set_fence(self, fence: WriteFence | None) -> None:
        """From now every write checks ``fence`` first (a controller of a pair)."""
        with self._lock:
            self._fence = fence

    @contextlib.contextmanager
    def _writing(
        self, doing: str, *, fenced: bool = True, serialized: bool = True
    ) -> Iterator[Connection]:
        """One write transaction, committed (and fsynced) before the caller goes on.

        ``fenced=False`` is for the lease's own writes (history/leadership.py).
        ``serialized`` is for PostgreSQL: on SQLite every write holds the one
        write lock.
        """
        with self._lock, self._guard(doing):
            conn = self._conn()
            fence = self._fence if fenced else None
            # IMMEDIATE takes the write lock up front: the busy timeout then
            # applies here, and reads inside see no one else's later writes.
            conn.execute("BEGIN IMMEDIATE")
            try:
                if fence is not None:
                    fence.check(conn)
                yield conn
                conn.execute("COMMIT")
                if fence is not None:
                    fence.committed()
            except BaseException:
                # SQLite rolls back by itself after some errors (SQLITE_FULL).
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def _reading(self, doing: str) -> Iterator[Connection]:
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
        return checks.seconds(self._clock() if at is None else at, "at", self._path)

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

    # -- rows every table shares --------------------------------------------------

    def _ensure_node(self, conn: Connection, name: str, at: float) -> None:
        conn.execute(
            "INSERT INTO nodes (name, first_seen) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
            (name, at),
        )

    def _require_incident(self, conn: Connection, incident_id: int) -> str:
        """The incident's status; UnknownRecord when there is no such incident."""
        if not isinstance(incident_id, int) or isinstance(incident_id, bool):
            raise InvalidRecord(self._path, f"incident id must be an integer, got {incident_id!r}")
        if not checks.storable(incident_id):
            raise UnknownRecord(self._path, f"no incident {incident_id} in history {self._path}")
        row = conn.execute("SELECT status FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        if row is None:
            raise UnknownRecord(self._path, f"no incident {incident_id} in history {self._path}")
        status: str = row[0]
        return status

    def _insert_step(
        self,
        conn: Connection,
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
        epoch = self._epoch()
        conn.execute(
            "INSERT INTO incident_steps (incident_id, seq, at, node, step, detail, epoch) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (incident_id, seq, at, node, step, detail_json, epoch),
        )
        return IncidentStep(incident_id, seq, at, node, step, json.loads(detail_json), epoch)

    def _epoch(self) -> int | None:
        """The leadership epoch this store writes under (None: no lease).

        What this transaction's check saw, not what the lease says by now."""
        return None if self._fence is None else self._fence.checked_epoch

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
