"""``controller --check`` and ``spark-watchdog power status|cycle`` with the small-lab paths.

Each path against its stand-in or real server on loopback: the Shelly Gen1
plug stand-in (built from Shelly's gen1 ``/relay/N`` API docs); a homemade
relay board's script, run as real subprocesses, for ``exec``; the Home
Assistant stand-in (built from HA's REST API docs); a real NUT ``upsd``
(tests/conftest.py's ``nut_server``) for ``nut``; the Kasa stand-in (built from
the protocol as python-kasa documents it: no real plug runs here) for ``kasa``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_watchdog.cli.main import main
from spark_watchdog.lab.hardware.home_assistant_standin import HomeAssistantStandin
from spark_watchdog.lab.hardware.kasa_standin import KasaStandin
from spark_watchdog.lab.hardware.nut_server import NutServer
from spark_watchdog.lab.hardware.plug_standin import PlugStandin
from spark_watchdog.lab.hardware.relay_board import RelayBoard

pytestmark = pytest.mark.integration


def _secret(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text + "\n")
    path.chmod(0o600)
    return path


def _config(tmp_path: Path, device: dict[str, Any]) -> Path:
    config = {
        "nodes": [{"name": "spark-1", "agent": "http://127.0.0.1:9720", "power": [device]}],
        "policy": {"power_timeout": 10.0, "power_poll_interval": 0.2, "min_command_interval": 0},
    }
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _status_and_cycle(config: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """``controller --check``, ``power status`` and ``power cycle``; the cycle's JSON."""
    code, out, err = _run(["controller", "--config", str(config), "--check"], capsys)
    assert code == 0, err
    assert "ok (1 nodes: spark-1)" in out
    code, out, err = _run(["power", "--config", str(config), "spark-1", "status", "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["state_before"] == "on"
    argv = ["power", "--config", str(config), "spark-1", "cycle", "--yes", "--json"]
    code, out, err = _run([*argv, "--off-seconds", "1"], capsys)
    assert code == 0, err
    body: dict[str, Any] = json.loads(out)
    assert body["verified"] is True and body["state_after"] == "on"
    assert body["off_held_s"] >= 1.0
    return body


def test_shelly_gen1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    password = _secret(tmp_path, "plug-password", "gen1-secret")
    with PlugStandin("shelly_gen1", password="gen1-secret") as plug:
        config = _config(
            tmp_path,
            {"type": "shelly_gen1", "url": plug.url, "password_file": str(password)},
        )
        _status_and_cycle(config, capsys)
        # Self-timed: the off armed the relay's own timer, and the on was its own.
        assert [(c.on, c.answered) for c in plug.commands] == [(False, "yes"), (True, "own timer")]
        assert plug.is_on()
    bad = _config(tmp_path, {"type": "shelly_gen1", "url": plug.url, "user": "admin"})
    code, _, err = _run(["controller", "--config", str(bad), "--check"], capsys)
    assert code == 2
    assert "nodes[0].power[0].user: a Shelly Gen1 login needs its password" in err


def test_exec(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    board = RelayBoard(tmp_path)
    config = _config(tmp_path, board.device())
    body = _status_and_cycle(config, capsys)
    assert board.commands == ["off", "on"] and board.state() == "on"
    assert body["device"].startswith("exec ")
    code, out, err = _run(["power", "--config", str(config), "--check", "--json"], capsys)
    assert code == 0, err
    assert [row["state"] for row in json.loads(out)["devices"]] == ["on"]
    bad = _config(tmp_path, {**board.device(), "off_command": ["relay-board", "off"]})
    code, _, err = _run(["controller", "--config", str(bad), "--check"], capsys)
    assert code == 2
    assert "nodes[0].power[0].off_command[0]: expected the program's absolute path" in err


def test_home_assistant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = _secret(tmp_path, "ha-token", "standin-token")
    with HomeAssistantStandin("standin-token", lag_s=0.3, clock_offset_s=120.0) as home:
        device = {
            "type": "home_assistant",
            "url": home.url,
            "entity_id": "switch.spark_1",
            "token_file": str(token),
        }
        config = _config(tmp_path, device)
        _status_and_cycle(config, capsys)
        assert [c.service for c in home.calls] == ["turn_off", "turn_on"]
        assert home.state() == "on"
        code, out, err = _run(["power", "--config", str(config), "spark-1", "status"], capsys)
        assert "standin-token" not in out + err
    missing = _config(tmp_path, {**device, "token_file": str(tmp_path / "absent")})
    code, _, err = _run(["controller", "--config", str(missing), "--check"], capsys)
    assert code == 2 and "nodes[0].power[0].token_file" in err and "does not exist" in err


def test_nut(tmp_path: Path, capsys: pytest.CaptureFixture[str], nut_server: NutServer) -> None:
    password = _secret(tmp_path, "nut-password", nut_server.password)
    device = {
        "type": "nut",
        "host": nut_server.host,
        "port": nut_server.port,
        "ups": "rack",
        "outlet": 2,
        "user": "watchdog",
        "password_file": str(password),
    }
    config = _config(tmp_path, device)
    _status_and_cycle(config, capsys)
    assert nut_server.rack.commands == ["outlet.2.load.off", "outlet.2.load.on"]
    assert nut_server.rack.state(2) == "on"
    wrong = _secret(tmp_path, "wrong-password", "not-it")
    config = _config(tmp_path, {**device, "password_file": str(wrong)})
    argv = ["power", "--config", str(config), "spark-1", "off", "--yes", "--json"]
    code, out, _ = _run(argv, capsys)
    assert code == 1 and "ERR ACCESS-DENIED" in json.loads(out)["error"]
    assert "not-it" not in out and nut_server.rack.state(2) == "on"


@pytest.mark.skipif(importlib.util.find_spec("kasa") is None, reason="python-kasa not installed")
def test_kasa_strip_outlet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    user = _secret(tmp_path, "kasa-user", "owner@example.com")
    password = _secret(tmp_path, "kasa-password", "kasa-secret")
    with KasaStandin("klap", outlets=3, username="owner@example.com", password="kasa-secret") as kp:
        device = {
            "type": "kasa",
            "host": kp.host,
            "port": kp.port,
            "protocol": "klap",
            "outlet": 3,
            "username_file": str(user),
            "password_file": str(password),
        }
        config = _config(tmp_path, device)
        _status_and_cycle(config, capsys)
        assert [(s.outlet, s.on) for s in kp.switches] == [(3, False), (3, True)]
        assert kp.state(3) == "on"
        wrong = _secret(tmp_path, "wrong-password", "not-it")
        config = _config(tmp_path, {**device, "password_file": str(wrong)})
        code, out, err = _run(["power", "--config", str(config), "spark-1", "status"], capsys)
        assert code != 0 and "refused the credentials" in out + err
        assert "not-it" not in out + err and "kasa-secret" not in out + err
    missing = _config(tmp_path, {**device, "username_file": str(tmp_path / "absent")})
    code, _, err = _run(["controller", "--config", str(missing), "--check"], capsys)
    assert code == 2 and "nodes[0].power[0].username_file" in err and "does not exist" in err
