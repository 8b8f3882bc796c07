"""``spark-watchdog power`` against real HTTP plugs on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from spark_watchdog.cli.main import main
from spark_watchdog.lab.hardware.plug_standin import PlugStandin
from spark_watchdog.lab.ports import free_port as _dead_port

pytestmark = pytest.mark.integration


@pytest.fixture
def plugs(tmp_path: Path) -> Iterator[tuple[PlugStandin, PlugStandin, Path]]:
    password = tmp_path / "plug-password"
    password.write_text("plug-secret\n")
    password.chmod(0o600)
    with (
        PlugStandin("shelly", password="plug-secret") as shelly,
        PlugStandin("tasmota") as tasmota,
    ):
        config = {
            "nodes": [
                {
                    "name": "spark-1",
                    "agent": "http://127.0.0.1:9720",
                    "power": [
                        {"type": "shelly", "url": shelly.url, "password_file": str(password)},
                    ],
                },
                {
                    "name": "spark-2",
                    "agent": "http://127.0.0.1:9721",
                    "power": [{"type": "tasmota", "url": tasmota.url}],
                },
            ],
            "policy": {"power_timeout": 5.0, "power_poll_interval": 0.2, "min_command_interval": 0},
        }
        path = tmp_path / "controller.yaml"
        path.write_text(yaml.safe_dump(config))
        yield shelly, tasmota, path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_status(
    plugs: tuple[PlugStandin, PlugStandin, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, config = plugs
    code, out, _ = _run(["power", "--config", str(config), "spark-1", "status", "--json"], capsys)
    body = json.loads(out)
    assert code == 0
    assert body["node"] == "spark-1" and body["action"] == "status"
    assert body["state_before"] == "on" and body["verified"] is True


def test_cycle_is_verified_and_holds_off(
    plugs: tuple[PlugStandin, PlugStandin, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    shelly, _, config = plugs
    argv = ["power", "--config", str(config), "spark-1", "cycle", "--yes", "--json"]
    code, out, err = _run([*argv, "--off-seconds", "1"], capsys)
    body = json.loads(out)
    assert code == 0, err
    for key in (
        "node",
        "device",
        "action",
        "state_before",
        "state_after",
        "verified",
        "elapsed_s",
        "dry_run",
    ):
        assert key in body
    assert body["verified"] is True and body["state_after"] == "on"
    assert body["off_held_s"] >= 1.0
    assert [c.on for c in shelly.commands] == [False, True]
    assert "power: off_requested" in err and "power: on_verified" in err  # progress on stderr


def test_dry_run_sends_nothing(
    plugs: tuple[PlugStandin, PlugStandin, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    shelly, _, config = plugs
    code, out, _ = _run(
        ["power", "--config", str(config), "spark-1", "off", "--dry-run", "--json"], capsys
    )
    body = json.loads(out)
    assert code == 0 and body["dry_run"] is True and body["state_after"] == "on"
    assert shelly.commands == [] and shelly.is_on()


def test_off_without_yes_and_without_a_tty_is_refused(
    plugs: tuple[PlugStandin, PlugStandin, Path],
) -> None:
    shelly, _, config = plugs
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "spark_watchdog",
            "power",
            "--config",
            str(config),
            "spark-1",
            "off",
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "refusing to off spark-1 without --yes: stdin is not a terminal" in result.stderr
    assert shelly.commands == [] and shelly.is_on()


def test_a_refused_command_exits_1(
    plugs: tuple[PlugStandin, PlugStandin, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, tasmota, config = plugs
    tasmota.set_fault("refuse")
    code, out, _ = _run(
        ["power", "--config", str(config), "spark-2", "off", "--yes", "--json"], capsys
    )
    body = json.loads(out)
    assert code == 1
    assert body["verified"] is False and body["error"].startswith("Refused")
    assert tasmota.is_on()


def test_check_reads_every_device_and_fails_on_unreachable(
    plugs: tuple[PlugStandin, PlugStandin, Path],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    _, _, config = plugs
    code, out, _ = _run(["power", "--config", str(config), "--check"], capsys)
    assert code == 0, out
    assert "spark-1" in out and "spark-2" in out and " on " in out
    data = yaml.safe_load(config.read_text())
    data["nodes"][1]["power"][0]["url"] = f"http://127.0.0.1:{_dead_port()}"
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(data))
    code, out, _ = _run(["power", "--config", str(broken), "--check", "--json"], capsys)
    rows = json.loads(out)["devices"]
    assert code == 1
    assert [r["state"] for r in rows] == ["on", "unreachable"]


def test_usage_errors_exit_2(
    plugs: tuple[PlugStandin, PlugStandin, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _, _, config = plugs
    code, _, err = _run(["power", "--config", str(config), "spark-9", "status"], capsys)
    assert code == 2 and 'no node "spark-9" in the config; known: spark-1, spark-2' in err
    code, _, err = _run(["power", "--config", str(config), "spark-1"], capsys)
    assert code == 2 and "expected NODE and ACTION" in err
    code, _, err = _run(
        ["power", "--config", str(config), "spark-1", "status", "--path", "3"], capsys
    )
    assert code == 2 and "has 1 power path(s); got 3" in err
    inline = tmp_path / "inline.yaml"
    data = yaml.safe_load(config.read_text())
    data["nodes"][0]["power"][0]["password"] = "plug-secret"
    inline.write_text(yaml.safe_dump(data))
    code, _, err = _run(["power", "--config", str(inline), "spark-1", "status"], capsys)
    assert code == 2 and "inline secrets are not accepted" in err
    assert "plug-secret" not in err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        (
            "--off-seconds",
            "nan",
            "argument --off-seconds: expected a number of seconds ≥ 0, got 'nan'",
        ),
        (
            "--off-seconds",
            "inf",
            "argument --off-seconds: expected a number of seconds ≥ 0, got 'inf'",
        ),
        (
            "--off-seconds",
            "-1",
            "argument --off-seconds: expected a number of seconds ≥ 0, got '-1'",
        ),
        ("--path", "0", "argument --path: expected a whole number from 1 to 64, got '0'"),
        ("--path", "x", "argument --path: expected a whole number from 1 to 64, got 'x'"),
    ],
)
def test_numbers_that_make_no_sense_are_usage_errors_and_send_nothing(
    plugs: tuple[PlugStandin, PlugStandin, Path],
    capsys: pytest.CaptureFixture[str],
    option: str,
    value: str,
    message: str,
) -> None:
    shelly, _, config = plugs
    with pytest.raises(SystemExit) as exited:
        main(["power", "--config", str(config), "spark-1", "cycle", "--yes", option, value])
    _, err = capsys.readouterr()
    assert exited.value.code == 2 and f"error: {message}\n" in err
    assert shelly.commands == [] and shelly.is_on()
