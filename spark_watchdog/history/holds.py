"""Operator holds (per node or the whole cluster) and cluster settings."""

from __future__ import annotations

from typing import Any

from spark_watchdog.errors import InvalidRecord
from spark_watchdog.history import checks, decode
from spark_watchdog.history.core import StoreCore, writes
from spark_watchdog.history.records import CLUSTER, Hold, Setting


class HoldTables(StoreCore):
    """Holds and settings: what operators set, with who and when."""

    @writes
    def hold(self, node: str, reason: str, *, by: str, at: float | None = None) -> Hold:
        """Hold a node, or the whole cluster with ``CLUSTER`` ("*").

        At most one active hold per target: holding a held target returns the
        existing hold unchanged (its reason stands until it is released).
        """
        target = checks.hold_target(node, self._path)
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidRecord(self._path, "a hold needs a reason")
        by = checks.who(by, self._path)
        now = self._now(at)
        with self._writing(f"holding {target}") as conn:
            row = conn.execute(
                f"SELECT {decode.HOLD_COLUMNS} FROM holds WHERE node = ? AND released_at IS NULL",
                (target,),
            ).fetchone()
            if row is not None:
                return decode.hold(row)
            cur = conn.execute(
                "INSERT INTO holds (node, reason, created_at, created_by) VALUES (?, ?, ?, ?)",
                (target, reason, now, by),
            )
            row = conn.execute(
                f"SELECT {decode.HOLD_COLUMNS} FROM holds WHERE id = ?", (cur.lastrowid,)
            ).fetchone()
            return decode.hold(row)

    @writes
    def release(self, node: str, *, by: str, at: float | None = None) -> Hold | None:
        """Release the active hold on one target (a node, or "*"); None if it had none.

        Releasing "*" releases only the cluster-wide hold; see ``release_all``.
        """
        target = checks.hold_target(node, self._path)
        by = checks.who(by, self._path)
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
                f"SELECT {decode.HOLD_COLUMNS} FROM holds WHERE id = ?", (row[0],)
            ).fetchone()
            return decode.hold(row)

    @writes
    def release_all(self, *, by: str, at: float | None = None) -> list[Hold]:
        """Release every active hold, per node and cluster-wide; returns them."""
        by = checks.who(by, self._path)
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
                    f"SELECT {decode.HOLD_COLUMNS} FROM holds WHERE id = ?", (hold_id,)
                ).fetchone()
                released.append(decode.hold(row))
            return released

    def active_holds(self) -> list[Hold]:
        """Every hold not yet released, oldest first. The controller reads this every loop."""
        with self._reading("reading holds") as conn:
            rows = conn.execute(
                f"SELECT {decode.HOLD_COLUMNS} FROM holds WHERE released_at IS NULL ORDER BY id"
            ).fetchall()
            return [decode.hold(row) for row in rows]

    def active_hold(self, node: str) -> Hold | None:
        """The hold that stops automatic action on ``node``: its own, else the cluster's."""
        target = checks.hold_target(node, self._path)
        with self._reading(f"reading holds of {target}") as conn:
            row = conn.execute(
                f"SELECT {decode.HOLD_COLUMNS} FROM holds WHERE node IN (?, ?) "
                "AND released_at IS NULL ORDER BY node = ? LIMIT 1",
                (target, CLUSTER, CLUSTER),
            ).fetchone()
            return None if row is None else decode.hold(row)

    def holds(self, *, limit: int | None = 100) -> list[Hold]:
        """Holds newest first, released ones included."""
        with self._reading("listing holds") as conn:
            rows = conn.execute(
                f"SELECT {decode.HOLD_COLUMNS} FROM holds ORDER BY id DESC LIMIT ?",
                (checks.limit(limit, self._path),),
            ).fetchall()
            return [decode.hold(row) for row in rows]

    # -- cluster settings ---------------------------------------------------------------

    @writes
    def set_setting(self, key: str, value: Any, *, by: str, at: float | None = None) -> Setting:
        """Set a cluster setting (any JSON value), noting who and when."""
        if not isinstance(key, str) or not checks.SETTING_KEY.match(key):
            raise InvalidRecord(
                self._path, f"setting key must be lower-case [a-z0-9_.-], got {key!r}"
            )
        value_json = self._dump(value, f"setting {key!r}", mapping=False)
        by = checks.who(by, self._path)
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
            return decode.setting(row, self._path)

    def setting(self, key: str) -> Setting | None:
        with self._reading(f"reading setting {key}") as conn:
            row = conn.execute(
                "SELECT key, value, changed_at, changed_by FROM settings WHERE key = ?", (key,)
            ).fetchone()
            return None if row is None else decode.setting(row, self._path)

    def settings(self) -> dict[str, Setting]:
        with self._reading("reading settings") as conn:
            rows = conn.execute(
                "SELECT key, value, changed_at, changed_by FROM settings ORDER BY key"
            ).fetchall()
            return {row[0]: decode.setting(row, self._path) for row in rows}
