"""Checks on what callers hand the history: every value is checked before it
is written, and a bad one is an ``InvalidRecord`` naming it (a bug in the
caller, never a row the store cannot read back)."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from spark_watchdog.errors import InvalidRecord
from spark_watchdog.history.records import CLUSTER

# SQLite's INTEGER is 64-bit signed: row ids and limits above this cannot be bound.
SQLITE_MAX_INT = 2**63 - 1

_SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")
SETTING_KEY = re.compile(r"^[a-z][a-z0-9_.-]*$")


def seconds(value: Any, what: str, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRecord(path, f"{what} must be a finite number of seconds, got {value!r}")
    return float(value)


def optional_seconds(value: Any, what: str, path: str) -> float | None:
    return None if value is None else seconds(value, what, path)


def parse_time(value: Any, what: str, path: str) -> float | None:
    """An agent's ISO-8601 time (or UNIX seconds) as UNIX seconds."""
    if value is None or isinstance(value, (int, float)):
        return optional_seconds(value, what, path)
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


def choice(value: Any, options: Sequence[str], what: str, path: str) -> str:
    if value not in options:
        raise InvalidRecord(path, f"{what} must be one of {', '.join(options)}; got {value!r}")
    chosen: str = value
    return chosen


def snake(value: Any, what: str, path: str) -> str:
    if not isinstance(value, str) or not _SNAKE.match(value):
        raise InvalidRecord(path, f"{what} must be snake_case, got {value!r}")
    return value


def node_name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value or value == CLUSTER or not value.isprintable():
        raise InvalidRecord(path, f"not a node name: {value!r}")
    return value


def hold_target(value: Any, path: str) -> str:
    return CLUSTER if value == CLUSTER else node_name(value, path)


def boot_id(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRecord(path, f"not a boot id: {value!r}")
    # The host and journal probes drop the dashes of /proc's form; match them.
    return value.strip().replace("-", "").lower()


def who(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidRecord(path, f"'by' must name who acts (a user, or 'controller'): {value!r}")
    return value


def limit(value: int | None, path: str) -> int:
    if value is None:
        return SQLITE_MAX_INT  # no limit; both engines take it (PostgreSQL refuses -1)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SQLITE_MAX_INT:
        raise InvalidRecord(
            path, f"limit must be an integer from 0 to {SQLITE_MAX_INT}, got {value!r}"
        )
    return value


def storable(value: object) -> bool:
    """An integer SQLite can compare with (a larger one raises OverflowError)."""
    return isinstance(value, int) and -SQLITE_MAX_INT - 1 <= value <= SQLITE_MAX_INT


def chunks(items: Sequence[int], size: int) -> Iterable[Sequence[int]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
