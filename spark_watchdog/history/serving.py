"""Serving restarts: when each began, how it ended, how long each step took."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from spark_watchdog.errors import InvalidRecord, UnknownRecord
from spark_watchdog.history import checks, decode
from spark_watchdog.history.core import Connection, StoreCore, writes
from spark_watchdog.history.records import SERVING_RESTART_RESULTS, ServingRestart
from spark_watchdog.redact import redact_text


class ServingRestartTables(StoreCore):
    """Serving restarts."""

    @writes
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

    @writes
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
        result = checks.choice(
            result, SERVING_RESTART_RESULTS, "serving restart result", self._path
        )
        if result == "running":
            raise InvalidRecord(self._path, "a serving restart cannot be finished as running")
        for step, seconds in dict(step_durations).items():
            if not isinstance(step, str):
                raise InvalidRecord(self._path, f"step_durations key must be text: {step!r}")
            checks.seconds(seconds, f"step_durations[{step!r}]", self._path)
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

    def _get_serving_restart(self, conn: Connection, restart_id: int) -> ServingRestart:
        row = conn.execute(
            f"SELECT {decode.RESTART_COLUMNS} FROM serving_restarts WHERE id = ?", (restart_id,)
        ).fetchone()
        if row is None:
            raise UnknownRecord(
                self._path, f"no serving restart {restart_id} in history {self._path}"
            )
        return decode.serving_restart(row, self._path)

    def serving_restarts_for(self, kinds: Sequence[str], since: float) -> list[int]:
        """Ids of serving restarts started at or after ``since`` (UNIX seconds) for an
        incident of one of ``kinds``, oldest first."""
        marks = ", ".join("?" for _ in kinds)
        with self._reading("listing serving restarts by incident kind") as conn:
            rows = conn.execute(
                "SELECT r.id FROM serving_restarts r JOIN incidents i ON i.id = r.incident_id "
                f"WHERE r.started_at >= ? AND i.kind IN ({marks}) ORDER BY r.id",
                (checks.seconds(since, "since", self._path), *kinds),
            ).fetchall()
            return [int(row[0]) for row in rows]

    def serving_restarts(self, *, limit: int | None = 20) -> list[ServingRestart]:
        """Serving restarts newest first, operator-initiated ones included."""
        with self._reading("listing serving restarts") as conn:
            rows = conn.execute(
                f"SELECT {decode.RESTART_COLUMNS} FROM serving_restarts ORDER BY id DESC LIMIT ?",
                (checks.limit(limit, self._path),),
            ).fetchall()
            return [decode.serving_restart(row, self._path) for row in rows]
