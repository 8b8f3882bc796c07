"""Every key the agent accepts is in config/agent.example.yaml, with a comment; every
setting of every power device type is in config/controller.example.yaml, with one."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import yaml

from spark_watchdog.config.agent import AgentConfig
from spark_watchdog.config.controller import PowerDevice
from spark_watchdog.config.schema import key_paths

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "agent.example.yaml"


def _documented_keys(text: str) -> dict[str, bool]:
    """Map each key path in the file to whether a comment explains it.

    A key counts as documented when the line right above it is a comment at
    the same indentation, or the key's own line carries a trailing comment.
    """
    found: dict[str, bool] = {}
    stack: list[tuple[int, str]] = []
    lines = text.splitlines()
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        key = stripped.split(":", 1)[0].strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key])
        above = lines[number - 1].strip() if number else ""
        above_indent = len(lines[number - 1]) - len(lines[number - 1].lstrip()) if number else -1
        commented = (above.startswith("#") and above_indent == indent) or " #" in line
        found[path] = commented
        stack.append((indent, key))
    return found


def test_every_key_is_documented() -> None:
    documented = _documented_keys(EXAMPLE.read_text())
    missing = [p for p in key_paths(AgentConfig) if p not in documented]
    uncommented = [p for p in key_paths(AgentConfig) if documented.get(p) is False]
    assert not missing, f"keys missing from {EXAMPLE.name}: {missing}"
    assert not uncommented, f"keys without a comment in {EXAMPLE.name}: {uncommented}"


def test_example_has_no_unknown_keys() -> None:
    known = set(key_paths(AgentConfig))
    documented = _documented_keys(EXAMPLE.read_text())
    assert set(documented) <= known, sorted(set(documented) - known)


def test_the_documentation_check_can_fail() -> None:
    text = "node: a\n# Listen.\nlisten:\n  address: x\n"
    assert _documented_keys(text) == {"node": False, "listen": True, "listen.address": False}
    assert yaml.safe_load(text)["listen"]["address"] == "x"


# -- the controller's power devices ------------------------------------------------

CONTROLLER_EXAMPLE = EXAMPLE.with_name("controller.example.yaml")


def _device_entries(text: str) -> dict[str, dict[str, bool]]:
    """The first power entry of each ``type`` in the file: its keys, each with whether a
    comment explains it (the line above at the key's indentation, or a trailing one)."""
    lines = text.splitlines()
    entries: dict[str, dict[str, bool]] = {}
    for number, line in enumerate(lines):
        match = re.match(r"^(\s*)- type: ([a-z_0-9]+)", line)
        if match is None or match.group(2) in entries:
            continue
        dash = len(match.group(1))
        keys: dict[str, bool] = {}
        for at in range(number, len(lines)):
            current = lines[at]
            stripped = current.strip()
            indent = len(current) - len(current.lstrip())
            if at > number and stripped and indent <= dash:
                break  # the next entry, or the end of the list
            key = re.match(r"^\s*(?:- )?([a-z_]+):", current)
            if key is None or (at > number and indent != dash + 2):
                continue
            above = lines[at - 1]
            above_indent = len(above) - len(above.lstrip())
            wanted = dash if at == number else dash + 2
            keys[key.group(1)] = (
                above.strip().startswith("#") and above_indent == wanted
            ) or " #" in current
        entries[match.group(2)] = keys
    return entries


def test_every_power_device_type_is_shown_with_every_setting_explained() -> None:
    """Each device type has an entry in the controller example that names every one
    of its settings, each with a comment: the example is the reference for a new path."""
    entries = _device_entries(CONTROLLER_EXAMPLE.read_text())
    for device in typing.get_args(PowerDevice):
        kind = typing.get_args(typing.get_type_hints(device)["type"])[0]
        assert kind in entries, f"no `type: {kind}` entry in {CONTROLLER_EXAMPLE.name}"
        fields = [f.name for f in dataclasses.fields(device)]
        missing = [name for name in fields if name not in entries[kind]]
        uncommented = [name for name in fields if entries[kind].get(name) is False]
        assert not missing, f"type {kind}: settings missing from the example: {missing}"
        assert not uncommented, f"type {kind}: settings without a comment: {uncommented}"
        unknown = set(entries[kind]) - set(fields)
        assert not unknown, f"type {kind}: the example shows unknown settings {unknown}"


def test_the_device_documentation_check_can_fail() -> None:
    text = (
        "power:\n"
        "  # A plug.\n"
        "  - type: shelly\n"
        "    # Its address.\n"
        "    url: http://x\n"
        "    timeout: 2\n"
        "  - type: ssh\n"
        "    host: h\n"
    )
    assert _device_entries(text) == {
        "shelly": {"type": True, "url": True, "timeout": False},
        "ssh": {"type": False, "host": False},
    }
