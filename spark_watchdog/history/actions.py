"""Power and reboot actions, recorded before they are sent, and the budgets counted from them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from spark_watchdog.errors import InvalidRecord, UnknownRecord
from spark_watchdog.history import checks, decode
from spark_watchdog.history.core import Connection, StoreCore, writes
from spark_watchdog.history.records import (
    ACTION_OPERATIONS,
    ACTION_RESULTS,
    POWER_CUT_OPERATIONS,
    Action,
)
from spark_watchdog.redact import redact_text


class ActionTables(StoreCore):
    """Actions and the counts the budgets take from them."""

    @writes
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
        name = checks.node_name(node, self._path)
        operation = checks.choice(operation, ACTION_OPERATIONS, "operation", self._path)
        if not isinstance(device, str) or not device:
            raise InvalidRecord(self._path, f"action device must be a non-empty string: {device!r}")
        if rung is not None and (not isinstance(rung, int) or isinstance(rung, bool)):
            raise InvalidRecord(self._path, f"rung must be an integer, got {rung!r}")
        if step is not None:
            step = checks.snake(step, "step", self._path)
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

    @writes
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
        result = checks.choice(result, ACTION_RESULTS, "action result", self._path)
        if result == "pending":
            raise InvalidRecord(self._path, "an action cannot be finished as pending")
        if error is not None and not isinstance(error, str):
            raise InvalidRecord(self._path, f"action error must be text, got {error!r}")
        if error is not None:
            error = redact_text(error)
        if step is not None:
            step = checks.snake(step, "step", self._path)
        extra = self._dump({} if step_detail is None else step_detail, "step detail")
        now = self._now(at)
        verified = checks.optional_seconds(verified_at, "verified_at", self._path)
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

    def _get_action(self, conn: Connection, action_id: int) -> Action:
        row = conn.execute(
            f"SELECT {decode.ACTION_COLUMNS} FROM actions WHERE id = ?", (action_id,)
        ).fetchone()
        if row is None:
            raise UnknownRecord(self._path, f"no action {action_id} in history {self._path}")
        return decode.action(row)

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
        params.append(checks.limit(limit, self._path))
        with self._reading("listing actions") as conn:
            rows = conn.execute(
                f"SELECT {decode.ACTION_COLUMNS} FROM actions {clause} ORDER BY id DESC LIMIT ?",
                params,
            ).fetchall()
            return [decode.action(row) for row in rows]

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
        start = checks.seconds(since, "since", self._path)
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
        start = checks.seconds(since, "since", self._path)
        ops = ",".join(f"'{op}'" for op in POWER_CUT_OPERATIONS)
        query = (
            f"SELECT id, node, requested_at FROM actions WHERE operation IN ({ops}) "
            "AND dry_run = 0 AND requested_at >= ? ORDER BY requested_at"
        )
        with self._reading("counting power cycles") as conn:
            return [(row[0], row[1], row[2]) for row in conn.execute(query, (start,))]

    def repeat_offenders(self, since: float) -> tuple[dict[str, int], dict[str, int]]:
        """Per node: host_frozen incidents detected at or after ``since`` (not dry
        runs, not false alarms), and power cycles ever (not dry runs)."""
        start = checks.seconds(since, "since", self._path)
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
