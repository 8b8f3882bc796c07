"""Validate plain YAML data into frozen dataclasses, reporting every problem.

A config class is an ordinary frozen dataclass whose fields are declared with
:func:`setting`. Types come from the annotations (bool, int, float, str,
Optional[...], Literal[...], tuple[X, ...], dict[str, X], Any for free-form
JSON, nested dataclasses). Every number must be finite (no ``.nan``, ``.inf``).
Constraints (minimum, maximum) live in the field metadata, so the schema is the one place
that says what a key accepts, and error messages are built from it:

    probes.vllm.interval: expected a number > 0, got "fast"
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterator
from typing import Any, Literal, TypeVar, Union

T = TypeVar("T")

_MISSING = dataclasses.MISSING

# No string of a config carries a NUL: an argv element, a path or a header
# with one fails at its first use (docs/bad-input.md).
NUL_PROBLEM = (
    "contains a NUL byte (\\0), which no program argument, environment value, label or path "
    "can carry; remove it (the value is not shown: it may be a secret)"
)


class InvalidSetting(ValueError):
    """Raised by a config class's ``__post_init__`` for a cross-field check."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        self.message = message
        super().__init__(f"{key}: {message}")


def setting(
    default: Any = _MISSING,
    *,
    minimum: float | None = None,
    above: float | None = None,
    maximum: float | None = None,
    default_factory: Any = _MISSING,
) -> Any:
    """Declare a config key. ``minimum`` is inclusive, ``above`` exclusive."""
    metadata = {"minimum": minimum, "above": above, "maximum": maximum}
    if default_factory is not _MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _finite(value: int | float) -> bool:
    """NaN and the infinities (YAML ``.nan``, ``.inf``, ``-.inf``, or ``1e999``) are no
    setting: NaN compares false with every bound, so it would pass them all. An integer
    too big for a float is refused too."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _show(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    if isinstance(value, int) and not isinstance(value, bool) and not _finite(value):
        return f"an integer of {len(str(abs(value)))} digits"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "nothing (null)"
    return repr(value)


def _bounds_text(meta: typing.Mapping[str, Any]) -> str:
    parts = []
    if meta.get("above") is not None:
        parts.append(f"> {meta['above']:g}")
    if meta.get("minimum") is not None:
        parts.append(f"≥ {meta['minimum']:g}")
    if meta.get("maximum") is not None:
        parts.append(f"≤ {meta['maximum']:g}")
    return (" " + " and ".join(parts)) if parts else ""


def _is_optional(tp: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def _convert(
    tp: Any, value: Any, path: str, meta: typing.Mapping[str, Any], problems: list[str]
) -> Any:
    optional, inner = _is_optional(tp)
    if value is None:
        if optional or tp is Any:  # null is a JSON value too
            return None
        problems.append(f"{path}: expected {_describe(inner, meta)}, got nothing (null)")
        return None
    tp = inner
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return _convert_union(typing.get_args(tp), value, path, meta, problems)
    if dataclasses.is_dataclass(tp):
        return _load(typing.cast(type, tp), value, path, problems)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            problems.append(
                f"{path}: expected one of {', '.join(map(str, choices))}, got {_show(value)}"
            )
            return None
        return value
    if origin is dict:
        return _convert_mapping(typing.get_args(tp)[1], value, path, meta, problems)
    if tp is Any:
        return _json_value(value, path, problems)
    if origin is tuple:
        return _convert_tuple(typing.get_args(tp)[0], value, path, meta, problems)
    if tp is bool:
        if not isinstance(value, bool):
            problems.append(f"{path}: expected true or false, got {_show(value)}")
            return None
        return value
    if tp in (int, float):
        return _convert_number(tp, value, path, meta, problems)
    if tp is str:
        if not isinstance(value, str) or not value:
            problems.append(f"{path}: expected a non-empty string, got {_show(value)}")
            return None
        if "\0" in value:
            problems.append(f"{path}: {NUL_PROBLEM}")
            return None
        return value
    raise TypeError(f"config schema: unsupported type {tp!r} at {path}")


def _convert_tuple(
    item_tp: Any, value: Any, path: str, meta: typing.Mapping[str, Any], problems: list[str]
) -> tuple[Any, ...] | None:
    """``tuple[X, ...]``: a list whose items are X."""
    if not isinstance(value, list):
        problems.append(f"{path}: expected a list, got {_show(value)}")
        return None
    return tuple(
        _convert(item_tp, item, f"{path}[{i}]", meta, problems) for i, item in enumerate(value)
    )


def _convert_number(
    tp: type[int] | type[float],
    value: Any,
    path: str,
    meta: typing.Mapping[str, Any],
    problems: list[str],
) -> int | float | None:
    """``int`` or ``float``: a finite number (never a bool) within the setting's bounds."""
    ok = isinstance(value, int) if tp is int else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        problems.append(f"{path}: expected {_describe(tp, meta)}, got {_show(value)}")
        return None
    if not _finite(value):
        problems.append(f"{path}: expected a finite number{_bounds_text(meta)}, got {_show(value)}")
        return None
    low, above, high = meta.get("minimum"), meta.get("above"), meta.get("maximum")
    if (
        (low is not None and value < low)
        or (above is not None and value <= above)
        or (high is not None and value > high)
    ):
        problems.append(f"{path}: expected {_describe(tp, meta)}, got {_show(value)}")
        return None
    return tp(value)


def _convert_mapping(
    value_tp: Any, value: Any, path: str, meta: typing.Mapping[str, Any], problems: list[str]
) -> dict[str, Any] | None:
    """``dict[str, X]``: a mapping whose keys are names and whose values are X."""
    if not isinstance(value, dict):
        problems.append(f"{path}: expected a mapping, got {_show(value)}")
        return None
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            problems.append(f"{path}: expected non-empty string keys, got key {_show(key)}")
            continue
        if "\0" in key:
            problems.append(f"{path}: a key {NUL_PROBLEM}")
            continue
        out[key] = _convert(value_tp, item, _join(path, key), meta, problems)
    return out


def _json_value(value: Any, path: str, problems: list[str]) -> Any:
    """``Any``: free-form JSON (the YAML subset JSON can carry), checked all the way down."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not _finite(value):
        problems.append(
            f"{path}: expected a finite number (JSON has no NaN or infinity), got {_show(value)}"
        )
        return None
    if isinstance(value, str) and "\0" in value:
        problems.append(f"{path}: {NUL_PROBLEM}")
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, list):
        return [_json_value(item, f"{path}[{i}]", problems) for i, item in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(f"{path}: expected string keys (JSON), got key {_show(key)}")
                continue
            if "\0" in key:
                problems.append(f"{path}: a key {NUL_PROBLEM}")
                continue
            out[key] = _json_value(item, _join(path, key), problems)
        return out
    problems.append(
        f"{path}: expected a JSON value (string, number, true/false, null, list or mapping), "
        f"got {type(value).__name__} {value!r}"
    )
    return None


def _convert_union(
    choices: tuple[Any, ...],
    value: Any,
    path: str,
    meta: typing.Mapping[str, Any],
    problems: list[str],
) -> Any:
    """``int | str`` picks by the value's type; dataclasses pick by their ``type`` key."""
    classes = [c for c in choices if dataclasses.is_dataclass(c)]
    if classes:
        kinds = {_type_tag(c): c for c in classes}
        where = path or "top level"
        if not isinstance(value, dict):
            problems.append(f"{where}: expected a mapping with a type key, got {_show(value)}")
            return None
        tag = value.get("type")
        if not isinstance(tag, str) or tag not in kinds:
            problems.append(
                f"{_join(path, 'type')}: expected one of {', '.join(kinds)}, got {_show(tag)}"
            )
            return None
        return _load(typing.cast(type, kinds[tag]), value, path, problems)
    for choice in choices:
        if choice is bool and isinstance(value, bool):
            return value
        if choice is int and isinstance(value, int) and not isinstance(value, bool):
            return _convert(int, value, path, meta, problems)
        if choice is str and isinstance(value, str):
            return _convert(str, value, path, meta, problems)
    wanted = " or ".join(_describe(c, meta) for c in choices)
    problems.append(f"{path}: expected {wanted}, got {_show(value)}")
    return None


_HINTS: dict[Any, typing.Mapping[str, Any]] = {}


def _hints(cls: Any) -> typing.Mapping[str, Any]:
    """The resolved field types of a config class, read once per class (resolving
    them is most of the cost of checking a config)."""
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = types.MappingProxyType(typing.get_type_hints(cls))
    return hints


def _type_tag(cls: Any) -> str:
    hint = _hints(cls)["type"]
    (tag,) = typing.get_args(hint)
    return str(tag)


def _describe(tp: Any, meta: typing.Mapping[str, Any]) -> str:
    if tp is int:
        return "an integer" + _bounds_text(meta)
    if tp is float:
        return "a number" + _bounds_text(meta)
    if tp is bool:
        return "true or false"
    if tp is str:
        return "a non-empty string"
    if dataclasses.is_dataclass(tp) or typing.get_origin(tp) is dict:
        return "a mapping"
    return str(tp)


def _load(cls: type[T], data: Any, path: str, problems: list[str]) -> T | None:
    where = path or "top level"
    if not isinstance(data, dict):
        problems.append(f"{where}: expected a mapping, got {_show(data)}")
        return None
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    for key in data:
        if key in fields:
            continue
        if f"{key}_file" in fields:
            problems.append(
                f"{_join(path, str(key))}: inline secrets are not accepted; put the secret "
                f"in a file readable only by the service (chmod 600) and set {key}_file, "
                "or use systemd LoadCredential="
            )
            continue
        known = ", ".join(sorted(fields))
        problems.append(f"{_join(path, str(key))}: unknown key; expected one of {known}")
    values: dict[str, Any] = {}
    before = len(problems)
    for name, f in fields.items():
        key_path = _join(path, name)
        if name in data:
            values[name] = _convert(hints[name], data[name], key_path, f.metadata, problems)
        elif f.default is _MISSING and f.default_factory is _MISSING:
            problems.append(f"{key_path}: required key is missing")
    if len(problems) > before:
        return None
    try:
        return cls(**values)
    except InvalidSetting as exc:  # cross-field checks in __post_init__
        problems.append(f"{_join(path, exc.key)}: {exc.message}")
        return None
    except ValueError as exc:  # a check that raised something plainer: still no traceback
        problems.append(f"{where}: {exc}")
        return None


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def load(cls: type[T], data: Any, problems: list[str]) -> T | None:
    """Build ``cls`` from ``data``, appending every problem found to ``problems``."""
    return _load(cls, {} if data is None else data, "", problems)


def key_paths(cls: type, prefix: str = "") -> Iterator[str]:
    """Every key path the schema accepts (``probes.vllm.url``), for docs and tests."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        path = _join(prefix, f.name)
        yield path
        _, inner = _is_optional(hints[f.name])
        if dataclasses.is_dataclass(inner):
            yield from key_paths(typing.cast(type, inner), path)
