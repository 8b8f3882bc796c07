"""What a power path will need is checked at load, by ``controller --check`` and
before a start: its numbers within documented bounds, the programs of an
``exec`` path there and executable (docs/power.md, "Bounds")."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_watchdog.cli.main import main
from spark_watchdog.config import power_devices
from spark_watchdog.config.controller import parse_controller_config, power_libraries_missing
from spark_watchdog.errors import ConfigError
from spark_watchdog.lab.ports import free_port

# Numbers checked against a list in __post_init__ rather than by bounds.
_LISTED = {("SnmpDevice", "version")}


def _numbers(cls: type) -> list[tuple[str, dict[str, Any]]]:
    hints = typing.get_type_hints(cls)
    found = []
    for field in dataclasses.fields(cls):
        kinds = set(typing.get_args(hints[field.name])) | {hints[field.name]}
        for kind in list(kinds):
            kinds |= set(typing.get_args(kind))
        if kinds & {int, float} and (cls.__name__, field.name) not in _LISTED:
            found.append((field.name, dict(field.metadata)))
    return found


@pytest.mark.parametrize("cls", typing.get_args(power_devices.PowerDevice))
def test_every_number_of_every_power_device_has_both_bounds(cls: type) -> None:
    for name, meta in _numbers(cls):
        assert meta.get("maximum") is not None, f"{cls.__name__}.{name} has no maximum"
        low = meta.get("minimum") if meta.get("minimum") is not None else meta.get("above")
        assert low is not None, f"{cls.__name__}.{name} has no minimum"


def _config(*devices: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodes": [{"name": "spark-1", "agent": "http://127.0.0.1:9720", "power": list(devices)}]
    }


_SHELLY = {"type": "shelly", "url": "http://plug-1"}


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        ({**_SHELLY, "timeout": 1e300}, "nodes[0].power[0].timeout: expected a number > 0 and ≤ 3"),
        ({**_SHELLY, "switch_id": 2**70}, "nodes[0].power[0].switch_id: expected"),
        (
            {"type": "nut", "host": "ups", "ups": "u", "outlet": 10**30, "user": "u",
             "password_file": "/p"},
            "nodes[0].power[0].outlet: expected an integer ≥ 0 and ≤ 1000",
        ),
        (
            {"type": "snmp", "host": "pdu", "outlet": 2**40, "community_file": "/c"},
            "nodes[0].power[0].outlet: expected",
        ),
    ],
)  # fmt: skip
def test_a_number_past_its_bound_is_refused_naming_the_key(
    device: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_controller_config(_config(device))
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems


def _exec(program: str) -> dict[str, Any]:
    return {
        "type": "exec",
        "off_command": [program, "off"],
        "on_command": ["/bin/true"],
        "status_command": ["/bin/true"],
    }


def _unusable(tmp_path: Path) -> dict[str, tuple[str, str]]:
    plain = tmp_path / "relay.txt"
    plain.write_text("#!/bin/sh\n")
    plain.chmod(0o644)
    return {
        "missing": (str(tmp_path / "no-such-relay"), "does not exist"),
        "directory": (str(tmp_path), "is a directory"),
        "not executable": (str(plain), "is not executable"),
        "device node": ("/dev/null", "is not a regular file"),
    }


@pytest.mark.parametrize("case", ["missing", "directory", "not executable", "device node"])
def test_an_exec_program_that_cannot_run_is_refused_naming_the_key(
    tmp_path: Path, case: str
) -> None:
    program, why = _unusable(tmp_path)[case]
    config = parse_controller_config(_config(_exec(program)))
    problems = power_libraries_missing(config)
    assert len(problems) == 1
    assert problems[0].startswith(f'nodes[0].power[0].off_command[0]: "{program}" {why}')


def test_an_executable_program_passes(tmp_path: Path) -> None:
    program = tmp_path / "relay"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    assert power_libraries_missing(parse_controller_config(_config(_exec(str(program))))) == []


@pytest.mark.integration
def test_controller_check_refuses_a_missing_exec_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _config(_exec(str(tmp_path / "no-such-relay")))
    config["listen"] = {"address": "127.0.0.1", "port": free_port()}
    config["history"] = str(tmp_path / "history.db")
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["controller", "--config", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert "nodes[0].power[0].off_command[0]:" in err and "does not exist" in err


@pytest.mark.parametrize(
    "url",
    [
        "ftp://admin:hunter2@plug-1/",
        "http://admin:hunter2@plug-1:99999/",
        "http://plug-1/?access_token=tok123456 x",
        "http://admin:hunter2@plug 1/?access_token=tok123456",
        "http://plug-1/;token=tok123456 x",
    ],
)
def test_config_errors_never_echo_a_urls_credentials(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_controller_config(_config({**_SHELLY, "url": url}))
    shown = str(caught.value)
    assert "nodes[0].power[0].url:" in shown
    assert "hunter2" not in shown and "tok123456" not in shown
    assert "***" in shown


@pytest.mark.parametrize("key", ["user", "ups"])
def test_a_nut_name_with_a_line_break_after_it_is_refused(key: str) -> None:
    """YAML's block scalar ends a value with a line break; upsd would read two lines."""
    device = {
        "type": "nut",
        "host": "ups",
        "ups": "u",
        "outlet": 1,
        "user": "u",
        "password_file": "/p",
    }
    with pytest.raises(ConfigError) as caught:
        parse_controller_config(_config({**device, key: "admin\n"}))
    assert any(
        p.startswith(f"nodes[0].power[0].{key}: expected a name") and "'admin\\n'" in p
        for p in caught.value.problems
    ), caught.value.problems
