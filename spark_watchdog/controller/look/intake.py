"""Everything the controller takes from an agent's ``/v1/state``, checked once
(docs/design.md, "What the controller takes from an agent").

One agent, or whatever answers on its port, must not be able to blind the
controller or the operator with one value: a time no clock gives, a count
beyond any integer a store can hold, a string of megabytes or with a NUL, a
list without end. ``take_state`` returns a bounded copy of the answer; what
fails is dropped field by field, each with the reason kept, and the rest of
the answer stands.

Times the agent gives (a GPU fault's, a memory guard kill's, ``stopping``'s)
are believed only within ``PAST_S`` before and ``FUTURE_S`` after the
controller's own clock: any other stands replaced by the controller's receipt
time, the agent's own value kept beside it as text (``agent_<field>``), so a
reader knows the time is the controller's. Ages (seconds since something the
agent saw) are finite, never negative and at most ``PAST_S``. Sequence
numbers and ids are whole numbers from 0 to ``MAX_INT``. Pure: no I/O, the
wall clock passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# An agent's time older than this, or later than FUTURE_S, is not a time.
PAST_S = 86_400.0
FUTURE_S = 300.0
# The largest integer SQLite (and PostgreSQL's bigint) holds.
MAX_INT = 2**63 - 1
MAX_STRING = 8_192  # characters of any one string
MAX_NAME = 256  # characters of a key, an id (boot id, agent start) or a name
MAX_ITEMS = 1_024  # items of a list (the newest kept) or keys of an object (the first kept)
MAX_DEPTH = 16  # objects and lists within each other
MAX_REASONS = 20  # drop reasons kept per answer (and how many more)
MAX_REASON = 300  # characters of one

TIME, AGE, COUNT, NAME = "time", "age", "count", "name"
_LEAF = ""  # the key of a path's rule in the rule tree (no JSON path element is "")
_ANY = "*"

# What each known field of /v1/state is (docs/api/agent.openapi.yaml).
RULES: dict[tuple[str, ...], str] = {
    ("seq",): COUNT,
    ("boot_id",): NAME,
    ("started_at",): NAME,
    ("node",): NAME,
    ("stopping", "since"): TIME,
    ("memory_guard", "last_kill", "at_unix"): TIME,
    ("memory_guard", "last_kill", "id"): COUNT,
    ("gpu_faults", "faults", _ANY, "at_unix"): TIME,
    ("gpu_faults", "faults", _ANY, "id"): COUNT,
    ("probes", "vllm", "seconds_without_progress"): AGE,
    ("probes", "vllm", "progress_ago_s"): AGE,
    ("peers", _ANY, "seq"): COUNT,
    ("peers", _ANY, "boot_id"): NAME,
    ("peers", _ANY, "progress_ago_s"): AGE,
    ("peers", _ANY, "answer_ago_s"): AGE,
    ("peers", _ANY, "heard_ago_s"): AGE,
}


@dataclass(frozen=True, slots=True)
class _Rules:
    """One place in the answer's shape: its own rule, and what its keys and
    items are; worked out once, not at every answer."""

    rule: str | None
    children: dict[str, _Rules]  # every key with a rule below it (``_ANY`` too)
    notes: frozenset[str]  # the fields only the controller writes here (agent_<time>)
    anything: _Rules | None  # what a key or item without one of its own is


def _tree(rules: Mapping[tuple[str, ...], str]) -> _Rules:
    root: dict[str, Any] = {}
    for path, kind in rules.items():
        node = root
        for key in path:
            node = node.setdefault(key, {})
        node[_LEAF] = kind
    return _rules_of(root)


def _rules_of(node: dict[str, Any]) -> _Rules:
    children = {k: _rules_of(sub) for k, sub in node.items() if k != _LEAF}
    notes = frozenset(agent_field(k) for k, sub in children.items() if sub.rule == TIME)
    return _Rules(node.get(_LEAF), children, notes, children.get(_ANY))


def agent_field(name: str) -> str:
    """Where the agent's own value of a time the controller replaced is kept."""
    return f"agent_{name}"


_TREE = _tree(RULES)
_NO_RULES = _Rules(None, {}, frozenset(), None)  # below a place without rules
_DROP = object()


@dataclass(frozen=True)
class Taken:
    """An agent's answer as the controller takes it, and what it left out."""

    state: dict[str, Any]
    dropped: tuple[str, ...] = ()


@dataclass
class _Intake:
    wall: float
    reasons: list[str] = field(default_factory=list)
    more: int = 0

    def drop(self, where: str, why: str) -> object:
        if len(self.reasons) < MAX_REASONS:
            reason = f"{where or '/v1/state'}: {why}"
            self.reasons.append(reason if len(reason) <= MAX_REASON else reason[:297] + "...")
        else:
            self.more += 1
        return _DROP

    def taken(self, state: dict[str, Any]) -> Taken:
        extra = (f"and {self.more} more",) if self.more else ()
        return Taken(state, tuple(self.reasons) + extra)


def take_state(answer: Mapping[str, Any], wall: float) -> Taken:
    """A bounded copy of an agent's ``/v1/state`` object, taken at ``wall`` (the
    controller's wall clock), with the reason for each field it dropped."""
    intake = _Intake(wall)
    return intake.taken(_mapping(answer, "", _TREE, 0, intake))


def plausible_time(value: Any, wall: float) -> float | None:
    """An agent's UNIX time the controller believes at ``wall``; None: not one."""
    seconds = _finite(value)
    if seconds is None or not wall - PAST_S <= seconds <= wall + FUTURE_S:
        return None
    return seconds


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return seconds if math.isfinite(seconds) else None


def _shown(value: Any) -> str:
    """A value from outside, in a reason: ASCII-escaped and short."""
    text = ascii(value) if isinstance(value, str) else ascii(_short_repr(value))[1:-1]
    return text if len(text) <= 48 else text[:45] + "..."


def _short_repr(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        return f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, (dict, list)):
        return type(value).__name__
    return repr(value)


def _mapping(
    raw: Mapping[str, Any], where: str, tree: _Rules | None, depth: int, intake: _Intake
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    rules = _NO_RULES if tree is None else tree
    children, notes, anything = rules.children, rules.notes, rules.anything
    for count, (key, value) in enumerate(raw.items()):
        if count >= MAX_ITEMS:
            intake.drop(where, f"more than {MAX_ITEMS} keys; the rest left out")
            break
        if not isinstance(key, str) or len(key) > MAX_NAME or "\0" in key:
            intake.drop(where, f"a key that is not a short text: {_shown(key)}")
            continue
        sub = children.get(key, anything)
        if sub is None and key not in notes:
            # No rule here: a plain JSON scalar within bounds is kept as it is
            # (what _value would keep), without building its path.
            kind = type(value)
            if (
                value is None
                or kind is bool
                or (kind is str and len(value) <= MAX_STRING and "\0" not in value)
                or (kind is int and -MAX_INT <= value <= MAX_INT)
                or (kind is float and math.isfinite(value))
            ):
                out[key] = value
                continue
        shown = key if key.isascii() and key.isprintable() else ascii(key)
        path = f"{where}.{shown}" if where else shown
        if key in notes:
            intake.drop(path, "a field only the controller writes")
            continue
        rule = None if sub is None else sub.rule
        if rule == TIME:
            _take_time(out, key, value, path, intake)
            continue
        cleaned = _value(value, path, sub, depth + 1, intake)
        if rule is not None and cleaned is not _DROP:
            cleaned = _ruled(rule, cleaned, path, intake)
        if cleaned is not _DROP:
            out[key] = cleaned
    return out


def _take_time(out: dict[str, Any], key: str, value: Any, where: str, intake: _Intake) -> None:
    seconds = plausible_time(value, intake.wall)
    if seconds is not None:
        out[key] = value
        return
    if value is None:
        out[key] = None
        return
    shown = _shown(value)
    out[key] = intake.wall
    out[agent_field(key)] = shown
    intake.drop(
        where,
        f"{shown} is not a time within {PAST_S / 3600:g} h before or {FUTURE_S:g} s after "
        "the controller's clock; the controller's receipt time stands in",
    )


def _ruled(rule: str, value: Any, where: str, intake: _Intake) -> Any:
    if rule == COUNT:
        whole = isinstance(value, int) and not isinstance(value, bool)
        if value is not None and not (whole and 0 <= value <= MAX_INT):
            return intake.drop(where, f"{_shown(value)} is not a whole number from 0 to 2**63-1")
    elif rule == AGE:
        seconds = _finite(value)
        if value is not None and (seconds is None or not 0 <= seconds <= PAST_S):
            return intake.drop(where, f"{_shown(value)} is not an age from 0 to {PAST_S:g} s")
    elif rule == NAME:
        fits = isinstance(value, str) and len(value) <= MAX_NAME and value.isprintable()
        if value is not None and not fits:
            return intake.drop(where, f"{_shown(value)} is not a short printable text")
    return value


def _value(value: Any, where: str, tree: _Rules | None, depth: int, intake: _Intake) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if abs(value) > MAX_INT:
            return intake.drop(where, f"{_shown(value)} is beyond 2**63-1")
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else intake.drop(where, f"{value!r} is no number")
    if isinstance(value, str):
        if len(value) > MAX_STRING:
            return intake.drop(where, f"a text of {len(value)} characters (at most {MAX_STRING})")
        return value if "\0" not in value else intake.drop(where, "a text with a NUL")
    if depth > MAX_DEPTH:
        return intake.drop(where, f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, Mapping):
        return _mapping(value, where, tree, depth, intake)
    if isinstance(value, list):
        return _list(value, where, tree, depth, intake)
    return intake.drop(where, f"a {type(value).__name__}, not JSON")


def _list(
    raw: list[Any], where: str, tree: _Rules | None, depth: int, intake: _Intake
) -> list[Any]:
    if len(raw) > MAX_ITEMS:
        intake.drop(where, f"{len(raw)} items; the newest {MAX_ITEMS} kept")
        raw = raw[-MAX_ITEMS:]
    sub = None if tree is None else tree.anything
    kept = (_value(item, f"{where}[{n}]", sub, depth + 1, intake) for n, item in enumerate(raw))
    return [item for item in kept if item is not _DROP]
