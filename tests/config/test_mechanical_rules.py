"""Rules every config key gets from the schema, not from each section's own
checks: a new section cannot forget them (docs/bad-input.md, "Configs")."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

import pytest

from spark_watchdog.config.agent import AgentConfig, parse_agent_config
from spark_watchdog.config.controller import ControllerConfig, parse_controller_config
from spark_watchdog.errors import ConfigError

NODE = {"name": "spark-1", "agent": "http://127.0.0.1:9720"}
EXEC = {
    "type": "exec",
    "off_command": ["/bin/true"],
    "on_command": ["/bin/true"],
    "status_command": ["/bin/true"],
}


def _problems(parse: Any, data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse(data)
    problems: list[str] = caught.value.problems
    return problems


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"nodes": [{**NODE, "name": "spark\x001"}]}, "nodes[0].name"),
        (
            {"nodes": [{**NODE, "power": [{**EXEC, "off_command": ["/bin/true", "a\x00b"]}]}]},
            "nodes[0].power[0].off_command[1]",
        ),
    ],
)
def test_a_nul_anywhere_in_a_controller_config_is_refused_with_its_key(
    data: dict[str, Any], key: str
) -> None:
    problems = _problems(parse_controller_config, data)
    assert any(p.startswith(f"{key}:") and "NUL" in p for p in problems), problems


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"node": "spark-1", "listen": {"address": "127.0.0.1\x00"}}, "listen.address"),
        (
            {"node": "spark-1", "serving": {"command": ["vllm", "serve", "m\x00"]}},
            "serving.command[2]",
        ),
        (
            {"node": "spark-1", "serving": {"command": ["vllm"], "environment": {"X\x00": "1"}}},
            "serving.environment",
        ),
        (
            {"node": "spark-1", "serving": {"command": ["vllm"], "environment": {"X": "\x00"}}},
            "serving.environment.X",
        ),
        (
            {
                "node": "spark-1",
                "serving": {
                    "command": ["vllm"],
                    "profiles": {"safe": {"speculative_config": {"method": "a\x00"}}},
                },
            },
            "serving.profiles.safe.speculative_config.method",
        ),
    ],
)
def test_a_nul_anywhere_in_an_agent_config_is_refused_with_its_key(
    data: dict[str, Any], key: str
) -> None:
    problems = _problems(parse_agent_config, data)
    assert any(p.startswith(f"{key}:") and "NUL" in p for p in problems), problems


# -- every number bounded -------------------------------------------------------------


def _numbers(cls: Any, path: str, seen: set[Any]) -> list[tuple[str, Any]]:
    """(key path, field metadata) of every int or float key under ``cls``."""
    if cls in seen:
        return []
    seen.add(cls)
    found: list[tuple[str, Any]] = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        found += _numbers_in(hints[field.name], f"{path}.{field.name}", field.metadata, seen)
    return found


def _numbers_in(tp: Any, path: str, meta: Any, seen: set[Any]) -> list[tuple[str, Any]]:
    args = [a for a in typing.get_args(tp) if a not in (type(None), Ellipsis)]
    if typing.get_origin(tp) is typing.Literal or str in args:
        return []  # a choice among names (SNMP's version: 1, 2c or 3), checked as such
    if args:
        return [n for a in args for n in _numbers_in(a, path, meta, seen)]
    if dataclasses.is_dataclass(tp):
        return _numbers(tp, path, seen)
    if tp in (int, float):
        return [(path, meta)]
    return []


def test_every_number_of_every_section_has_both_bounds() -> None:
    unbounded = [
        path
        for root, name in ((AgentConfig, "agent"), (ControllerConfig, "controller"))
        for path, meta in _numbers(root, name, set())
        if meta.get("maximum") is None
        or (meta.get("minimum") is None and meta.get("above") is None)
    ]
    assert unbounded == [], "give these a minimum (or above) and a maximum: " + ", ".join(
        sorted(set(unbounded))
    )


def test_the_walk_finds_nested_and_listed_numbers() -> None:
    paths = {path for path, _ in _numbers(ControllerConfig, "controller", set())}
    assert "controller.detection.freeze_after" in paths
    assert "controller.nodes.power.timeout" in paths  # in a list of a union of devices
    assert len(paths) > 40
