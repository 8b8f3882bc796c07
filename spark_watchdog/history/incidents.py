"""Incidents and the write-ahead log of their steps."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from spark_watchdog.errors import IncidentAlreadyOpen, InvalidRecord, UnknownRecord
from spark_watchdog.history import checks, decode
from spark_watchdog.history.core import Connection, StoreCore, writes
from spark_watchdog.history.records import RESOLUTIONS, Incident, IncidentStep, IncidentTimeline

# The incident kind that cuts power: at most one open per node.
FENCING_KIND = "host_frozen"


def _refuse_second_fencing(conn: Connection, names: Sequence[str]) -> None:
    """One open fencing incident per node (docs/design.md, invariant I2).

    Called inside BEGIN IMMEDIATE: no other writer can open one between the
    check and the insert.
    """
    for name in names:
        row = conn.execute(
            "SELECT i.id FROM incidents i JOIN incident_nodes n ON n.incident_id = i.id "
            "WHERE n.node = ? AND i.status = 'open' AND i.dry_run = 0 AND i.kind = ? "
            "LIMIT 1",
            (name, FENCING_KIND),
        ).fetchone()
        if row is not None:
            raise IncidentAlreadyOpen(name, int(row[0]))


class IncidentTables(StoreCore):
    """Incidents, and the steps the controller records before it takes them."""

    def _incidents(self, conn: Connection, rows: list[Any]) -> list[Incident]:
        ids = [row[0] for row in rows]
        nodes: dict[int, list[str]] = {i: [] for i in ids}
        for chunk in checks.chunks(ids, 500):  # old SQLite allows 999 parameters
            marks = ",".join("?" * len(chunk))
            for incident_id, node in conn.execute(
                f"SELECT incident_id, node FROM incident_nodes WHERE incident_id IN ({marks}) "
                "ORDER BY incident_id, position",
                chunk,
            ):
                nodes[incident_id].append(node)
        return [decode.incident(row, nodes[row[0]], self._path) for row in rows]

    @writes
    def open_incident(
        self,
        kind: str,
        nodes: Sequence[str],
        *,
        detected_at: float | None = None,
        evidence: Mapping[str, Any],
        fault_onset: float | None = None,
        dry_run: bool = False,
        at: float | None = None,
    ) -> Incident:
        """Open an incident and write its first step, ``incident_opened``, in one commit.

        ``detected_at`` defaults to now by the store's clock (a pair's: the
        database's, history/database_time.py). ``fault_onset`` is the last
        time the node(s) were seen healthy; ``time_to_detect_s`` is
        ``detected_at - fault_onset`` when it is known.
        """
        kind = checks.snake(kind, "incident kind", self._path)
        names = self._incident_nodes(nodes)
        detected = checks.seconds(
            self._clock() if detected_at is None else detected_at, "detected_at", self._path
        )
        onset = checks.optional_seconds(fault_onset, "fault_onset", self._path)
        evidence_json = self._dump(evidence, "incident evidence")
        now = self._now(at)
        ttd = None if onset is None else detected - onset
        with self._writing(f"opening a {kind} incident") as conn:
            if kind == FENCING_KIND and not dry_run:
                _refuse_second_fencing(conn, names)
            cur = conn.execute(
                "INSERT INTO incidents (kind, opened_at, detected_at, fault_onset, evidence, "
                "dry_run, status, time_to_detect_s) VALUES (?, ?, ?, ?, ?, ?, 'open', ?)",
                (kind, now, detected, onset, evidence_json, int(bool(dry_run)), ttd),
            )
            incident_id = cur.lastrowid
            assert incident_id is not None
            self._add_incident_nodes(conn, incident_id, names, now)
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

    def _incident_nodes(self, nodes: Sequence[str]) -> list[str]:
        """An incident's nodes: one or more valid names, none repeated."""
        if isinstance(nodes, str) or not nodes:
            raise InvalidRecord(
                self._path, f"an incident needs a list of one or more nodes, got {nodes!r}"
            )
        names = [checks.node_name(n, self._path) for n in nodes]
        if len(set(names)) != len(names):
            raise InvalidRecord(self._path, f"incident nodes repeat a node: {names}")
        return names

    def _add_incident_nodes(
        self, conn: Connection, incident_id: int, names: Sequence[str], now: float
    ) -> None:
        for position, name in enumerate(names):
            self._ensure_node(conn, name, now)
            conn.execute(
                "INSERT INTO incident_nodes (incident_id, position, node) VALUES (?, ?, ?)",
                (incident_id, position, name),
            )

    @writes
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
        resolution = checks.choice(resolution, RESOLUTIONS, "resolution", self._path)
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

    def _get_incident(self, conn: Connection, incident_id: int) -> Incident:
        rows = (
            conn.execute(
                f"SELECT {decode.INCIDENT_COLUMNS} FROM incidents WHERE id = ?", (incident_id,)
            ).fetchall()
            if checks.storable(incident_id)
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
                f"SELECT {decode.INCIDENT_COLUMNS} FROM incidents WHERE status = 'open' ORDER BY id"
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
            params.append(checks.seconds(since, "since", self._path))
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        if status is not None:
            where.append("status = ?")
            params.append(checks.choice(status, ("open", "resolved"), "status", self._path))
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        params.append(checks.limit(limit, self._path))
        with self._reading("listing incidents") as conn:
            rows = conn.execute(
                f"SELECT {decode.INCIDENT_COLUMNS} FROM incidents {clause} "
                "ORDER BY detected_at DESC, id DESC LIMIT ?",
                params,
            ).fetchall()
            return self._incidents(conn, rows)

    def incident(self, incident_id: int) -> IncidentTimeline | None:
        """One incident with its steps, actions, serving restarts and linked boots;
        None when there is none with this id (an id SQLite cannot hold included)."""
        if not checks.storable(incident_id):
            return None
        with self._reading(f"reading incident {incident_id}") as conn:
            rows = conn.execute(
                f"SELECT {decode.INCIDENT_COLUMNS} FROM incidents WHERE id = ?", (incident_id,)
            ).fetchall()
            if not rows:
                return None
            incident = self._incidents(conn, rows)[0]
            steps = conn.execute(
                f"SELECT {decode.STEP_COLUMNS} FROM incident_steps "
                "WHERE incident_id = ? ORDER BY seq",
                (incident_id,),
            ).fetchall()
            actions = conn.execute(
                f"SELECT {decode.ACTION_COLUMNS} FROM actions WHERE incident_id = ? ORDER BY id",
                (incident_id,),
            ).fetchall()
            restarts = conn.execute(
                f"SELECT {decode.RESTART_COLUMNS} FROM serving_restarts WHERE incident_id = ? "
                "ORDER BY id",
                (incident_id,),
            ).fetchall()
            boots = conn.execute(
                f"SELECT {decode.BOOT_COLUMNS} FROM boots WHERE incident_id = ? "
                "ORDER BY first_entry, node",
                (incident_id,),
            ).fetchall()
            return IncidentTimeline(
                incident=incident,
                steps=tuple(decode.step(r, self._path) for r in steps),
                actions=tuple(decode.action(r) for r in actions),
                serving_restarts=tuple(decode.serving_restart(r, self._path) for r in restarts),
                boots=tuple(decode.boot(r, self._path) for r in boots),
            )

    # -- the write-ahead log ---------------------------------------------------------

    @writes
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
        step = checks.snake(step, "step", self._path)
        name = None if node is None else checks.node_name(node, self._path)
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
                f"SELECT {decode.STEP_COLUMNS} FROM incident_steps "
                "WHERE incident_id = ? ORDER BY seq",
                (incident_id,),
            ).fetchall()
            return [decode.step(row, self._path) for row in rows]

    def last_step(self, incident_id: int, node: str | None = None) -> IncidentStep | None:
        """The newest step of an incident; with ``node``, the newest step about that node."""
        query = f"SELECT {decode.STEP_COLUMNS} FROM incident_steps WHERE incident_id = ?"
        params: list[Any] = [incident_id]
        if node is not None:
            query += " AND node = ?"
            params.append(node)
        with self._reading(f"reading steps of incident {incident_id}") as conn:
            row = conn.execute(query + " ORDER BY seq DESC LIMIT 1", params).fetchone()
            return None if row is None else decode.step(row, self._path)
