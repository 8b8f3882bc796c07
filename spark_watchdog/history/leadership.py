"""The controller pair's leadership: one row of the history, taken and
renewed by the database's own clock (docs/design.md, "Controller pair").

A pair runs on PostgreSQL. The same lease runs on SQLite (``Dialect``: the
clock of the host with the file, BEGIN IMMEDIATE for the row locks), where
the simulation runs two controllers over one file, held to the same contract
by one test suite (tests/history/test_leadership.py).

A candidate takes the lease when there is none or it has expired, and bumps
the epoch; the holder is host, process id and a token of this start, so a
restarted controller is a new holder at a new epoch. The leader renews it;
nobody else may touch it before it expires. Expiry is judged by the
database's ``clock_timestamp()`` alone, never by a controller's clock.

Fencing: the lease is also the store's ``WriteFence``. Every write of the
leader's store checks, in its own transaction and after the write lock,
that this process still holds the lease at its epoch with at least two send
deadlines left; if not, the transaction rolls back and nothing of it is
written (``NotLeader``). A power command may leave only within one send
deadline of the start of its step's check (:meth:`Lease.send_refusal`, on
the monotonic clock), asked at the gate and again by the backend right
before its bytes leave (power/send_window.py), and every device's socket
timeout is within one more (config/controller.py), so every byte of it
leaves before the lease the check saw could expire, and so before another
controller could lead.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

from spark_watchdog.config.controller import FENCE_MARGIN_S
from spark_watchdog.errors import NotLeader
from spark_watchdog.history.core import Connection, Dialect
from spark_watchdog.history.database_time import DRIFT, DatabaseTime, boot_clock
from spark_watchdog.history.store import HistoryStore

P = ParamSpec("P")
T = TypeVar("T")

NAME = "controller"


def new_holder() -> str:
    """This process, as the lease names it: host, pid and a token of this start."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass(frozen=True)
class Leader:
    """The lease as the database sees it, at ``now`` (its clock)."""

    holder: str
    epoch: int
    acquired_at: float
    renewed_at: float
    expires_at: float
    now: float
    released_at: float | None = None

    @property
    def left(self) -> float:
        return self.expires_at - self.now

    @property
    def expired(self) -> bool:
        return self.left <= 0

    def to_json(self) -> dict[str, Any]:
        return {
            "holder": self.holder,
            "epoch": self.epoch,
            "acquired_at": self.acquired_at,
            "renewed_at": self.renewed_at,
            "expires_at": self.expires_at,
            "lease_left_s": round(self.left, 3),
            "expired": self.expired,
            "stepped_down_at": self.released_at,
        }


def _leader(row: Any, now: float) -> Leader:
    holder, epoch, acquired, renewed, expires, released = row
    return Leader(
        holder,
        int(epoch),
        float(acquired),
        float(renewed),
        float(expires),
        now,
        None if released is None else float(released),
    )


def current(store: HistoryStore, clock: DatabaseTime | None = None) -> Leader | None:
    """Who leads, by the database's clock (None: nobody has yet)."""
    with store._reading("reading the leadership") as conn:
        return _read(conn, store.dialect, clock=clock)


def _read(
    conn: Connection, dialect: Dialect, *, lock: str = "", clock: DatabaseTime | None = None
) -> Leader | None:
    if clock is None:
        (now,) = conn.execute(f"SELECT {dialect.now}").fetchone()
    else:
        now = clock.read(conn, dialect.now)
    row = conn.execute(
        "SELECT holder, epoch, acquired_at, renewed_at, expires_at, released_at FROM leadership "
        f"WHERE name = ? {lock}",
        (NAME,),
    ).fetchone()
    return None if row is None else _leader(row, float(now))


# A standby not seen for this long is forgotten (each start is a new holder).
STANDBY_FORGOTTEN_S = 86400.0


def _seen_standing_by(conn: Connection, holder: str, now: float) -> None:
    conn.execute(
        "INSERT INTO standbys (holder, seen_at) VALUES (?, ?) "
        "ON CONFLICT (holder) DO UPDATE SET seen_at = excluded.seen_at",
        (holder, now),
    )
    conn.execute("DELETE FROM standbys WHERE seen_at < ?", (now - STANDBY_FORGOTTEN_S,))


@dataclass(frozen=True)
class Standby:
    """A controller that last tried to take the lease ``ago`` seconds ago."""

    holder: str
    ago: float

    def to_json(self) -> dict[str, Any]:
        return {"holder": self.holder, "seen_s_ago": round(self.ago, 3)}


def standbys(store: HistoryStore, within: float) -> list[Standby]:
    """The standbys seen within ``within`` seconds (the database's clock), latest first."""
    with store._reading("reading the standbys") as conn:
        (now,) = conn.execute(f"SELECT {store.dialect.now}").fetchone()
        rows = conn.execute(
            # The leader is not a standby, whatever it last did as one.
            "SELECT holder, seen_at FROM standbys WHERE seen_at >= ? "
            "AND holder NOT IN (SELECT holder FROM leadership) ORDER BY seen_at DESC",
            (float(now) - within,),
        ).fetchall()
    return [Standby(holder, float(now) - float(seen)) for holder, seen in rows]


class Lease:
    """This process's claim to lead, and the fence of its store's writes.

    ``lease_s``: how long a take or renewal lasts; ``send_deadline_s``: within
    how long of a step's check its command may leave. ``monotonic`` is the
    clock the send deadline is measured on. ``clock``: the database's time,
    read on every take, renewal and check (the pair's wall clock).
    """

    def __init__(
        self,
        store: HistoryStore,
        *,
        lease_s: float,
        send_deadline_s: float,
        holder: str | None = None,
        monotonic: Callable[[], float] = boot_clock,
        clock: DatabaseTime | None = None,
        renewals: HistoryStore | None = None,
    ) -> None:
        self.store = store
        self.dialect = store.dialect
        # The connection renewals go through: one of their own in a controller
        # (controller/pair/pair.py), so a renewal never waits behind this process's
        # own writes on the store's connection.
        self.renewals = renewals or store
        self.holder = holder or new_holder()
        self.lease_s = lease_s
        self.send_deadline_s = send_deadline_s
        self._monotonic = monotonic
        self.clock = clock or DatabaseTime(monotonic=monotonic)
        self._epoch: int | None = None
        # A write that only records that nothing left (recording_only).
        self._recording = threading.local()
        self._checked_epoch: int | None = None  # what the last check let write
        self._checked_at: float | None = None  # the last check's start (monotonic)
        self._committed_at: float | None = None  # that of the last committed write
        # The start of the last take or renewal that extended the lease (monotonic).
        self._extended_at: float | None = None

    @property
    def epoch(self) -> int | None:
        """The epoch this process leads at (None: it does not)."""
        return self._epoch

    @property
    def checked_epoch(self) -> int | None:
        """The epoch the current write's check saw (what its steps record)."""
        return self._checked_epoch

    # -- take, renew, give up -------------------------------------------------------

    def acquire(self) -> Leader:
        """Take the lease if nobody holds it or it expired; the lease after trying.

        While another holds it, a standby only reads it and notes itself in
        ``standbys``, without the history's write lock: a standby whose link
        stalls mid-transaction then holds nothing the leader waits for.
        """
        seen = current(self.store, self.clock)
        if seen is not None and not seen.expired and seen.holder != self.holder:
            self._epoch = None
            with self.store._writing("noting this standby", fenced=False, serialized=False) as c:
                _seen_standing_by(c, self.holder, seen.now)
            return seen
        started = self._monotonic()  # before the database reads its clock
        with self.store._writing("taking the leadership", fenced=False) as conn:
            seen = _read(conn, self.dialect, lock=self.dialect.for_update, clock=self.clock)
            if seen is not None and not seen.expired:
                if seen.holder == self.holder and seen.released_at is None:
                    self._epoch = seen.epoch
                else:
                    self._epoch = None
                    _seen_standing_by(conn, self.holder, seen.now)
                return seen
            epoch = 1 if seen is None else seen.epoch + 1
            fence_s = 2 * self.send_deadline_s
            now = self.dialect.now
            if seen is None:
                conn.execute(
                    "INSERT INTO leadership (name, holder, epoch, acquired_at, renewed_at, "
                    f"expires_at, fence_s) VALUES (?, ?, ?, {now}, {now}, {now} + ?, ?)",
                    (NAME, self.holder, epoch, self.lease_s, fence_s),
                )
            else:
                conn.execute(
                    f"UPDATE leadership SET holder = ?, epoch = ?, acquired_at = {now}, "
                    f"renewed_at = {now}, expires_at = {now} + ?, fence_s = ?, "
                    "released_at = NULL WHERE name = ?",
                    (self.holder, epoch, self.lease_s, fence_s, NAME),
                )
            taken = _read(conn, self.dialect)
        assert taken is not None
        self._epoch = epoch
        self._extended_at = started
        return taken

    def renew(self) -> bool:
        """Extend the lease; False when it is not ours any more (expired or taken).

        Without the history's write lock: a renewal only extends a lease that is
        still ours, by one statement on the leadership row, and the row's own lock
        orders it against a take (which holds the write lock, so that no checked
        write is in flight when an epoch begins). So a renewal never waits for a
        deposed leader stalled mid-transaction, nor for this leader's own writes.
        """
        if self._epoch is None:
            return False
        started = self._monotonic()
        with self.renewals._writing(
            "renewing the leadership", fenced=False, serialized=False
        ) as conn:
            self.clock.read(conn, self.dialect.now)
            now = self.dialect.now
            cursor = conn.execute(
                f"UPDATE leadership SET renewed_at = {now}, expires_at = {now} + ? "
                "WHERE name = ? AND holder = ? AND epoch = ? AND released_at IS NULL "
                f"AND expires_at > {now}",
                (self.lease_s, NAME, self.holder, self._epoch),
            )
            renewed = cursor.rowcount == 1
        if not renewed:
            self._epoch = None
        else:
            self._extended_at = started
        return renewed

    def ran_out(self) -> bool:
        """Whether the lease has surely expired by now, by this host's clock alone:
        a full lease since the start of the last take or renewal that extended it
        (less the drift the two clocks may have had meanwhile). True for a leader
        that was paused past its lease and has not touched the database since."""
        at = self._extended_at
        if self._epoch is None or at is None:
            return self._epoch is None
        return self._monotonic() - at >= self.lease_s * (1 - DRIFT)

    def step_down(self) -> bool:
        """End our lease: no write of ours from now, and a standby may take it
        once what our last checked write was promised has run out (``fence_s``:
        a command that write let out has left by then). False if not ours."""
        epoch, self._epoch = self._epoch, None
        if epoch is None:
            return False
        now, least = self.dialect.now, self.dialect.least
        with self.store._writing("stepping down", fenced=False) as conn:
            cursor = conn.execute(
                f"UPDATE leadership SET released_at = {now}, "
                f"expires_at = {least}(expires_at, {now} + fence_s) "
                "WHERE name = ? AND holder = ? AND epoch = ?",
                (NAME, self.holder, epoch),
            )
            return cursor.rowcount == 1

    def lost(self) -> None:
        """This process gave up leading (its own deadline passed): no write, no send."""
        self._epoch = None

    # -- the fence (history/postgres.py's WriteFence) ---------------------------------

    def recording_only(self, fn: Callable[P, T]) -> Callable[P, T]:
        """``fn`` (a store write), fenced by holder, epoch and an unexpired lease
        only, without the two send deadlines of margin: for a record that says
        a command did *not* leave (``*_withdrawn``), which lets nothing out, so
        it may be written when the lease is too short for a command. Such a
        check opens no send window."""

        def call(*args: P.args, **kwargs: P.kwargs) -> T:
            self._recording.on = True
            try:
                return fn(*args, **kwargs)
            finally:
                self._recording.on = False

        return call

    def check(self, conn: Connection) -> None:
        """Inside a write's transaction: may this process write now?

        :raises NotLeader: it does not lead (any more), was stepped down, or
            its lease has too little left; the transaction rolls back.
        """
        started = self._monotonic()  # before the database reads its clock
        if self._epoch is None:
            raise NotLeader(self.store.path, "this controller does not lead: nothing written")
        seen = _read(conn, self.dialect, lock=self.dialect.for_share, clock=self.clock)
        ours = self._epoch
        if seen is None or seen.holder != self.holder or seen.epoch != ours:
            who = "nobody" if seen is None else f"{seen.holder} at epoch {seen.epoch}"
            self._epoch = None
            raise NotLeader(
                self.store.path,
                f"the leadership moved to {who} (ours was epoch {ours}): nothing written",
            )
        if seen.released_at is not None:
            self._epoch = None
            raise NotLeader(self.store.path, "this controller was stepped down: nothing written")
        if getattr(self._recording, "on", False):
            if seen.expired:
                raise NotLeader(self.store.path, "the lease has run out: nothing written")
            self._checked_at = None  # lets no command out: no send window from it
            self._checked_epoch = ours
            return
        needed = 2 * self.send_deadline_s + FENCE_MARGIN_S
        if seen.left < needed:
            raise NotLeader(
                self.store.path,
                f"the lease has {seen.left:.1f}s left, less than two send deadlines and "
                f"a margin ({needed:g}s): nothing written",
            )
        self._checked_at = started
        self._checked_epoch = ours

    def committed(self) -> None:
        if self._checked_at is not None:  # a recording-only write opens no window
            self._committed_at = self._checked_at

    def send_refusal(self) -> str | None:
        """Right before a command leaves: why it may not (None: it may)."""
        if self._epoch is None:
            return "this controller does not lead any more: nothing is sent"
        at = self._committed_at
        if at is None:
            return "no step of this leadership is recorded yet: nothing is sent"
        waited = self._monotonic() - at
        if waited >= self.send_deadline_s:
            return (
                f"{waited:.1f}s since its step was checked, past the send deadline "
                f"({self.send_deadline_s:g}s): not sent"
            )
        return None


def end_lease(store: HistoryStore) -> Leader | None:
    """End whoever's lease (``ha step-down``); the lease it ended.

    The leader's next write and renewal are refused from now, so it stops
    and exits; the lease itself runs on for the holder's ``fence_s`` (two
    send deadlines), the time its last checked write was promised, so a
    command that write let out has left before a standby can take over.
    """
    now, least = store.dialect.now, store.dialect.least
    with store._writing("ending the lease", fenced=False) as conn:
        seen = _read(conn, store.dialect, lock=store.dialect.for_update)
        if seen is None or seen.expired or seen.released_at is not None:
            return seen
        conn.execute(
            f"UPDATE leadership SET released_at = {now}, "
            f"expires_at = {least}(expires_at, {now} + fence_s) WHERE name = ?",
            (NAME,),
        )
        return _read(conn, store.dialect)
