"""Another controller's incidents, read back from its page API as records. Pure.

Where controllers run on the Sparks each keeps its own history, and
``spark-watchdog history``, ``show``, ``status`` and the page show every
controller's incidents (docs/design.md, "One story from either node"). What
another controller answers is outside input, however it was produced: each
field is checked for its type and size and parsed into the history's own
records (:mod:`spark_watchdog.history.records`), so it is shown through the
same code as this controller's own, and whatever the answer carried beside
the documented fields is dropped. A field that is wrong refuses the whole
answer; the message names the field and the expected type, never the value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from spark_watchdog.history.records import (
    INCIDENT_STATUSES,
    Action,
    Boot,
    Incident,
    IncidentStep,
    IncidentTimeline,
    ServingRestart,
)

T = TypeVar("T")

# A node's name as the config takes it (config/colocated.py, _NODE_NAME).
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# Kinds, steps, operations, results, resolutions: the history's snake_case words.
_WORD = re.compile(r"[a-z][a-z0-9_]{0,63}")
_MAX_ID = 2**63 - 1  # SQLite's INTEGER: no history holds a larger id
# More than any cluster or incident has; an answer beyond them is not believed.
MAX_NODES = 1024
MAX_ROWS = 10_000  # steps, actions, restarts or boots of one incident
MAX_TEXT = 4000  # an error, a device's name, a profile
_MAX_TIME = 64  # an ISO-8601 time


class BadRecord(ValueError):
    """An answer that is not what a controller's page API answers."""


def _kind_of(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _field(record: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in record:
        raise BadRecord(f"{where}: no {key}")
    return record[key]


def _whole(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_ID:
        raise BadRecord(f"{where}: expected a whole number, got {_kind_of(value)}")
    return value


def _text(
    value: Any, where: str, *, limit: int = MAX_TEXT, pattern: re.Pattern[str] | None = None
) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise BadRecord(f"{where}: expected text of at most {limit} characters")
    if pattern is not None and not pattern.fullmatch(value):
        raise BadRecord(f"{where}: expected a name such as {pattern.pattern}")
    return value


def _word(value: Any, where: str) -> str:
    return _text(value, where, limit=64, pattern=_WORD)


def _name(value: Any, where: str) -> str:
    return _text(value, where, limit=63, pattern=NODE_NAME)


def _maybe(check: Callable[[Any, str], T]) -> Callable[[Any, str], T | None]:
    """``check`` that also takes null."""

    def checked(value: Any, where: str) -> T | None:
        return None if value is None else check(value, where)

    return checked


def _time(value: Any, where: str) -> float | None:
    """An ISO-8601 time as ``to_json`` writes it, as UNIX seconds; None: unknown."""
    if value is None:
        return None
    text = _text(value, where, limit=_MAX_TIME)
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadRecord(f"{where}: expected an ISO-8601 time") from None
    if parsed.tzinfo is None:
        raise BadRecord(f"{where}: expected a time with its UTC offset")
    return parsed.timestamp()


def _known_time(value: Any, where: str) -> float:
    """A time every record has; unknown (a row no clock gives) reads as NaN, shown as unknown."""
    seconds = _time(value, where)
    return math.nan if seconds is None else seconds


def _number(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadRecord(f"{where}: expected a number, got {_kind_of(value)}")
    number = float(value)
    return number if math.isfinite(number) else None


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise BadRecord(f"{where}: expected true or false, got {_kind_of(value)}")
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRecord(f"{where}: expected an object, got {_kind_of(value)}")
    return value


_opt_whole, _opt_flag = _maybe(_whole), _maybe(_flag)
_opt_text, _opt_word, _opt_name = _maybe(_text), _maybe(_word), _maybe(_name)


class _Fields:
    """A record's fields, each with where it is: ``_whole(*f("id"))``."""

    def __init__(self, raw: Any, where: str) -> None:
        self.record = _object(raw, where)
        self.where = where

    def __call__(self, key: str) -> tuple[Any, str]:
        return _field(self.record, key, self.where), f"{self.where}.{key}"


def _rows(
    record: Mapping[str, Any], key: str, where: str, each: Callable[[Any, str], T], limit: int
) -> tuple[T, ...]:
    value = _field(record, key, where)
    if not isinstance(value, list) or len(value) > limit:
        raise BadRecord(f"{where}.{key}: expected a list of at most {limit}")
    return tuple(each(item, f"{where}.{key}[{i}]") for i, item in enumerate(value))


def incident(raw: Any, where: str, *, whole: bool) -> tuple[Incident, tuple[str, ...]]:
    """An incident and the names of its evidence. ``whole``: with its evidence (a
    timeline's); else a list's, with ``evidence_keys`` only."""
    f = _Fields(raw, where)
    record = f.record
    status = _word(*f("status"))
    if status not in INCIDENT_STATUSES:
        raise BadRecord(f"{where}.status: expected one of {', '.join(INCIDENT_STATUSES)}")
    if whole:
        evidence = _object(*f("evidence"))
        keys = tuple(sorted(evidence))
    else:
        evidence = {}
        keys = _rows(record, "evidence_keys", where, _key, 256)
    found = Incident(
        id=_whole(*f("id")),
        kind=_word(*f("kind")),
        nodes=_rows(record, "nodes", where, _name, MAX_NODES),
        opened_at=_known_time(*f("opened_at")),
        detected_at=_known_time(*f("detected_at")),
        fault_onset=_time(*f("fault_onset")),
        evidence=evidence,
        dry_run=_flag(*f("dry_run")),
        status=status,
        resolution=_opt_word(*f("resolution")),
        resolved_at=_time(*f("resolved_at")),
        time_to_detect_s=_number(*f("time_to_detect_s")),
        time_to_recover_s=_number(*f("time_to_recover_s")),
    )
    if found.id < 1:
        raise BadRecord(f"{where}.id: expected a positive whole number")
    return found, keys


def _key(value: Any, where: str) -> str:
    return _text(value, where, limit=64)


def incident_list(raw: Any, limit: int) -> list[tuple[Incident, tuple[str, ...]]]:
    """``GET /v1/incidents``'s answer: at most ``limit`` incidents, each with the
    names of its evidence."""
    body = _object(raw, "answer")
    listed = _field(body, "incidents", "answer")
    if not isinstance(listed, list) or len(listed) > limit:
        raise BadRecord(f"answer.incidents: expected a list of at most {limit}")
    return [incident(item, f"incidents[{i}]", whole=False) for i, item in enumerate(listed)]


def _step(raw: Any, where: str) -> IncidentStep:
    f = _Fields(raw, where)
    return IncidentStep(
        incident_id=_whole(*f("incident_id")),
        seq=_whole(*f("seq")),
        at=_known_time(*f("at")),
        node=_opt_name(*f("node")),
        step=_word(*f("step")),
        detail=_object(*f("detail")),
        epoch=_opt_whole(f.record.get("epoch"), f"{where}.epoch"),
    )


def _action(raw: Any, where: str) -> Action:
    f = _Fields(raw, where)
    return Action(
        id=_whole(*f("id")),
        incident_id=_opt_whole(*f("incident_id")),
        node=_name(*f("node")),
        rung=_opt_whole(*f("rung")),
        device=_text(*f("device")),
        operation=_word(*f("operation")),
        requested_at=_known_time(*f("requested_at")),
        verified_at=_time(*f("verified_at")),
        result=_word(*f("result")),
        error=_opt_text(*f("error")),
        dry_run=_flag(*f("dry_run")),
    )


def _restart(raw: Any, where: str) -> ServingRestart:
    f = _Fields(raw, where)
    durations = _object(*f("step_durations"))
    if len(durations) > 64:
        raise BadRecord(f"{where}.step_durations: expected at most 64 steps")
    return ServingRestart(
        id=_whole(*f("id")),
        incident_id=_opt_whole(*f("incident_id")),
        profile=_text(*f("profile"), limit=200),
        started_at=_known_time(*f("started_at")),
        finished_at=_time(*f("finished_at")),
        duration_s=_number(*f("duration_s")),
        result=_word(*f("result")),
        error=_opt_text(*f("error")),
        step_durations={
            _key(k, f"{where}.step_durations"): _number(v, f"{where}.step_durations") or 0.0
            for k, v in durations.items()
        },
    )


def _boot(raw: Any, where: str) -> Boot:
    f = _Fields(raw, where)
    return Boot(
        node=_name(*f("node")),
        boot_id=_text(*f("boot_id"), limit=128),
        first_entry=_time(*f("first_entry")),
        last_entry=_time(*f("last_entry")),
        clean_shutdown=_opt_flag(*f("clean_shutdown")),
        evidence=_object(*f("evidence")),
        recorded_at=_known_time(*f("recorded_at")),
        updated_at=_known_time(*f("updated_at")),
        incident_id=_opt_whole(*f("incident_id")),
    )


def timeline(raw: Any, incident_id: int) -> IncidentTimeline:
    """``GET /v1/incidents/{id}``'s answer for incident ``incident_id``."""
    body = _object(raw, "answer")
    found, _ = incident(_field(body, "incident", "answer"), "incident", whole=True)
    if found.id != incident_id:
        raise BadRecord(f"incident.id: asked for incident {incident_id}, got another")
    return IncidentTimeline(
        incident=found,
        steps=_rows(body, "steps", "answer", _step, MAX_ROWS),
        actions=_rows(body, "actions", "answer", _action, MAX_ROWS),
        serving_restarts=_rows(body, "serving_restarts", "answer", _restart, MAX_ROWS),
        boots=_rows(body, "boots", "answer", _boot, MAX_ROWS),
    )
