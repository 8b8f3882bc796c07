"""The table of power device types (config/power_device_types.py) is complete: each
entry states every column, has its row in docs/power.md, names tests that exist and
a factory that builds its config class, and every type that cuts power names the
physical thing it switches, so two nodes on one outlet are refused at load."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_watchdog.config.controller import PowerDevice, parse_controller_config
from spark_watchdog.config.power_device_types import (
    POWER_DEVICE_TYPES,
    PowerDeviceType,
    no_physical_target,
)
from spark_watchdog.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
POWER_DOC = ROOT / "docs" / "power.md"
EXAMPLE = ROOT / "config" / "controller.example.yaml"

# Keys ending in _file that name no secret: a CA certificate, ssh's known hosts.
NOT_SECRETS = {"ca_file", "known_hosts_file"}


def test_every_config_class_has_one_entry_in_the_unions_order() -> None:
    """The config's ``type`` dispatch (``PowerDevice``) and the table list the same
    types, in one order (a refused ``type`` lists them in it)."""
    assert [t.config for t in POWER_DEVICE_TYPES] == list(typing.get_args(PowerDevice))
    names = [t.name for t in POWER_DEVICE_TYPES]
    assert len(set(names)) == len(names), names


def test_every_column_is_required() -> None:
    fields = dataclasses.fields(PowerDeviceType)
    assert all(
        f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        for f in fields
    )
    whole = {f.name: getattr(POWER_DEVICE_TYPES[0], f.name) for f in fields}
    PowerDeviceType(**whole)  # the whole row is accepted
    for field in fields:
        row = {name: value for name, value in whole.items() if name != field.name}
        with pytest.raises(TypeError, match=field.name):
            PowerDeviceType(**row)


# -- docs/power.md, "Every supported device" ------------------------------------------


def documented_rows(text: str) -> dict[str, str]:
    """The device table of docs/power.md: each `type` with its "device" cell."""
    section = text.split("## Every supported device", 1)[1].split("\n## ", 1)[0]
    body = section.split("\n|---", 1)[1]  # the rows under the header
    rows: dict[str, str] = {}
    for line in body.splitlines():
        match = re.match(r"^\| `([a-z_0-9]+)` \| (.*?) \|", line)
        if match is not None:
            rows[match.group(1)] = match.group(2)
    return rows


def docs_problems(types: tuple[PowerDeviceType[Any], ...], text: str) -> list[str]:
    rows = documented_rows(text)
    problems = [
        f"{t.name}: docs/power.md's row says {rows.get(t.name)!r}, the table {t.docs_row!r}"
        for t in types
        if rows.get(t.name) != t.docs_row
    ]
    stale = sorted(set(rows) - {t.name for t in types})
    return problems + [f"docs/power.md has a row for {name}, not in the table" for name in stale]


def test_each_type_has_its_row_in_docs_power_and_no_row_is_stale() -> None:
    assert docs_problems(POWER_DEVICE_TYPES, POWER_DOC.read_text()) == []


def test_the_docs_check_can_fail() -> None:
    text = POWER_DOC.read_text()
    first = POWER_DEVICE_TYPES[0]
    changed = (dataclasses.replace(first, docs_row="a toaster"), *POWER_DEVICE_TYPES[1:])
    assert docs_problems(changed, text) == [
        f"{first.name}: docs/power.md's row says {first.docs_row!r}, the table 'a toaster'"
    ]
    assert docs_problems(POWER_DEVICE_TYPES[1:], text) == [
        f"docs/power.md has a row for {first.name}, not in the table"
    ]


# -- tests, factory, secrets --------------------------------------------------------


@pytest.mark.parametrize("device_type", POWER_DEVICE_TYPES, ids=lambda t: t.name)
def test_each_listed_test_file_exists_and_drives_its_type(
    device_type: PowerDeviceType[Any],
) -> None:
    assert device_type.tests, f"{device_type.name}: no tests listed"
    named = re.compile(
        rf"\b{device_type.config.__name__}\b|[\"']{device_type.name}[\"']"
        rf"|type: {device_type.name}\b"
    )
    for test in device_type.tests:
        path = ROOT / test
        assert path.is_file(), f"{device_type.name}: {test} does not exist"
        assert named.search(path.read_text()), f"{test} never names {device_type.name}"


@pytest.mark.parametrize(
    "device_type", [t for t in POWER_DEVICE_TYPES if t.switches_power], ids=lambda t: t.name
)
def test_each_factory_builds_its_config_class(device_type: PowerDeviceType[Any]) -> None:
    assert device_type.factory is not None
    module, _, function = device_type.factory.partition(":")
    assert module.startswith("spark_watchdog.power."), device_type.factory
    builder = getattr(importlib.import_module(module), function)
    first = next(iter(inspect.signature(builder).parameters))
    assert typing.get_type_hints(builder)[first] is device_type.config


@pytest.mark.parametrize("device_type", POWER_DEVICE_TYPES, ids=lambda t: t.name)
def test_each_secret_file_is_a_key_of_its_type_and_none_is_left_out(
    device_type: PowerDeviceType[Any],
) -> None:
    keys = {f.name for f in dataclasses.fields(device_type.config)}
    secrets = [s.key for s in device_type.secret_files]
    assert set(secrets) <= keys, f"{device_type.name}: {set(secrets) - keys} are not its keys"
    files = {key for key in keys if key.endswith("_file")} - NOT_SECRETS
    assert files == set(secrets), f"{device_type.name}: secret files unlisted"


# -- physical targets ------------------------------------------------------------------


def example_devices() -> dict[str, dict[str, Any]]:
    """The first device of each type in the controller's example config."""
    found: dict[str, dict[str, Any]] = {}
    for node in yaml.safe_load(EXAMPLE.read_text())["nodes"]:
        for device in node["power"]:
            found.setdefault(device["type"], device)
    return found


def _nodes(device: dict[str, Any], count: int) -> dict[str, Any]:
    """A config of ``count`` nodes, each with ``device`` as its one power path."""
    return {
        "nodes": [
            {"name": f"spark-{i}", "agent": f"http://10.0.9.{i}:9720", "power": [device]}
            for i in range(1, count + 1)
        ]
    }


def uncovered(types: tuple[PowerDeviceType[Any], ...]) -> list[str]:
    """The types whose shared outlet (plug, BMC, command) would not be caught."""
    examples = example_devices()
    missed: list[str] = []
    for device_type in types:
        config = parse_controller_config(_nodes(examples[device_type.name], 1))
        targets = device_type.physical_targets(config.nodes[0].power[0])
        if device_type.switches_power != bool(targets):
            missed.append(device_type.name)
    return missed


def test_every_type_is_in_the_example() -> None:
    assert set(example_devices()) == {t.name for t in POWER_DEVICE_TYPES}


def test_every_type_that_cuts_power_names_its_physical_target() -> None:
    assert uncovered(POWER_DEVICE_TYPES) == []
    for device_type in POWER_DEVICE_TYPES:
        if not device_type.switches_power:
            assert device_type.physical_targets is no_physical_target


def test_the_physical_target_check_can_fail() -> None:
    forgot = [
        dataclasses.replace(t, physical_targets=no_physical_target) if t.name == "nut" else t
        for t in POWER_DEVICE_TYPES
    ]
    assert uncovered(tuple(forgot)) == ["nut"]


@pytest.mark.parametrize(
    "device_type", [t for t in POWER_DEVICE_TYPES if t.switches_power], ids=lambda t: t.name
)
def test_two_nodes_on_one_device_of_each_type_are_refused(
    device_type: PowerDeviceType[Any],
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_controller_config(_nodes(example_devices()[device_type.name], 2))
    (problem,) = caught.value.problems
    assert problem.startswith("nodes[1].power[0]: "), problem
    assert "is already nodes[0].power[0] (spark-1); two nodes on one" in problem


def test_two_nodes_may_share_the_soft_path_s_host() -> None:
    """An SSH reboot switches no power of its own: nothing to share."""
    for device_type in POWER_DEVICE_TYPES:
        if not device_type.switches_power:
            config = parse_controller_config(_nodes(example_devices()[device_type.name], 2))
            assert len(config.nodes) == 2
