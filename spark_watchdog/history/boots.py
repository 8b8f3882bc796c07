"""Nodes and their boots: what each node's journal said about how a boot began and ended."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spark_watchdog.errors import InvalidRecord, UnknownRecord
from spark_watchdog.history import checks, decode
from spark_watchdog.history.core import Connection, StoreCore, writes
from spark_watchdog.history.records import Boot, Node

# The newer report wins, but a known value is never replaced by NULL, and a
# linked incident stays linked unless another is given (BootTables.upsert_boot).
_UPSERT_BOOT = """
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
    """


class BootTables(StoreCore):
    """Nodes and boots."""

    @writes
    def record_node(
        self, name: str, *, boot_id: str | None = None, at: float | None = None
    ) -> Node:
        """Note a node (first_seen is set once); with ``boot_id``, its newest boot.

        Call it when a node's boot id changes, not every poll: each call is a commit.
        """
        name = checks.node_name(name, self._path)
        boot = None if boot_id is None else checks.boot_id(boot_id, self._path)
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

    @writes
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
        node = checks.node_name(node, self._path)
        boot = checks.boot_id(boot_id, self._path)
        first = checks.optional_seconds(first_entry, "first_entry", self._path)
        last = checks.optional_seconds(last_entry, "last_entry", self._path)
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
                _UPSERT_BOOT,
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
            return decode.boot(self._boot_row(conn, node, boot), self._path)

    @writes
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
            first_entry=checks.parse_time(boot.get("first_entry"), f"boot {boot_id}", self._path),
            last_entry=checks.parse_time(boot.get("last_entry"), f"boot {boot_id}", self._path),
            clean_shutdown=clean,
            evidence=evidence,
            incident_id=incident_id,
            at=at,
        )
        if boot.get("current") is True:
            self.record_node(node, boot_id=boot_id, at=at)
        return recorded

    @writes
    def link_boot(self, node: str, boot_id: str, incident_id: int) -> Boot:
        """Link an already recorded boot to an incident (the boot it froze in, or came back as)."""
        node = checks.node_name(node, self._path)
        boot = checks.boot_id(boot_id, self._path)
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
            return decode.boot(self._boot_row(conn, node, boot), self._path)

    def _boot_row(self, conn: Connection, node: str, boot: str) -> tuple[Any, ...]:
        row: tuple[Any, ...] = conn.execute(
            f"SELECT {decode.BOOT_COLUMNS} FROM boots WHERE node = ? AND boot_id = ?", (node, boot)
        ).fetchone()
        return row

    def boots(self, node: str, *, limit: int | None = None) -> list[Boot]:
        """A node's recorded boots, newest first (by first journal entry)."""
        node = checks.node_name(node, self._path)
        with self._reading(f"listing boots of {node}") as conn:
            rows = conn.execute(
                f"SELECT {decode.BOOT_COLUMNS} FROM boots WHERE node = ? "
                "ORDER BY first_entry IS NULL, first_entry DESC, recorded_at DESC LIMIT ?",
                (node, checks.limit(limit, self._path)),
            ).fetchall()
            return [decode.boot(row, self._path) for row in rows]
