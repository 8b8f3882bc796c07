"""Controller checks against real components on loopback: the agent daemon, an SNMP
PDU, an SSH banner, witness targets, and an agent whose clock is off."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.config.controller import ControllerConfig, parse_controller_config
from spark_watchdog.doctor.clock_skew import check_clock_skew
from spark_watchdog.doctor.controller_checks import (
    check_agent,
    check_banner,
    check_witness_targets,
)
from spark_watchdog.doctor.launcher_checks import check_launcher
from spark_watchdog.doctor.plan import controller_plan
from spark_watchdog.doctor.power_check import (
    ReadOnlyBackend,
    ReadOnlyViolation,
    check_power_path,
)
from spark_watchdog.doctor.runner import run_plan
from spark_watchdog.lab.hardware.pdu_standin import PduStandinThread
from spark_watchdog.lab.ports import free_port
from spark_watchdog.power.base import PowerState, PowerTiming, VerifiedPower
from spark_watchdog.power.paths import (
    build_backend,
    power_paths,
    read_device_secrets,
)

pytestmark = pytest.mark.integration


def _nut(nut: Any, tmp_path: Path, outlet: int) -> dict[str, Any]:
    password = tmp_path / "nut-password"
    password.write_text(nut.password + "\n")
    password.chmod(0o600)
    return {
        "type": "nut",
        "host": nut.host,
        "port": nut.port,
        "ups": "pdu",
        "outlet": outlet,
        "user": "watchdog",
        "password_file": str(password),
    }


def _config(nodes: list[dict[str, Any]], **extra: Any) -> ControllerConfig:
    return parse_controller_config(
        {"nodes": nodes, "detection": {"agent_timeout": 0.8, "banner_timeout": 1.0}, **extra}
    )


def _node(name: str, agent: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "agent": agent, "ssh_host": "127.0.0.1", **extra}


def _snmp(pdu: PduStandinThread, outlet: int | str, community: Path) -> dict[str, Any]:
    return {
        "type": "snmp",
        "host": "127.0.0.1",
        "port": pdu.port,
        "outlet": outlet,
        "community_file": str(community),
        "timeout": 0.5,
        "retries": 0,
    }


# -- agents ------------------------------------------------------------------------


def test_a_running_agent_answers_with_its_node_name(agent_url: str) -> None:
    config = _config([_node("spark-3", agent_url)])
    found = asyncio.run(check_agent(config.nodes[0], config.detection))
    assert found.status == "ok", found
    assert "node spark-3" in found.detail and "seq" in found.detail


def test_an_agent_that_calls_itself_another_node_fails(agent_url: str) -> None:
    config = _config([_node("spark-4", agent_url)])
    found = asyncio.run(check_agent(config.nodes[0], config.detection))
    assert found.status == "fail"
    assert "'spark-3'" in found.detail and "wrong machine" in found.detail


def test_no_agent_listening_fails_with_a_fix() -> None:
    config = _config([_node("spark-1", f"http://127.0.0.1:{free_port()}")])
    found = asyncio.run(check_agent(config.nodes[0], config.detection))
    assert found.status == "fail"
    assert found.fix is not None and "spark-watchdog-agent" in found.fix


# -- clock skew --------------------------------------------------------------------


def test_the_real_agent_shares_this_clock(agent_url: str) -> None:
    config = _config([_node("spark-3", agent_url)])
    found = asyncio.run(check_clock_skew(config.nodes[0]))
    assert found.status == "ok", found


@pytest.mark.parametrize(
    ("shift", "status", "word"),
    [(12.0, "fail", "ahead of"), (-12.0, "fail", "behind"), (2.5, "warn", "ahead of")],
)
def test_a_skewed_clock_is_found(
    skewed_agent: Callable[[str, float], str], shift: float, status: str, word: str
) -> None:
    config = _config([_node("spark-2", skewed_agent("spark-2", shift))])
    found = asyncio.run(check_clock_skew(config.nodes[0]))
    assert found.status == status, found
    assert word in found.detail
    assert found.fix is not None and "NTP" in found.fix


def test_skew_of_a_silent_agent_is_skipped_not_failed() -> None:
    config = _config([_node("spark-1", f"http://127.0.0.1:{free_port()}")])
    found = asyncio.run(check_clock_skew(config.nodes[0], samples=1))
    assert found.status == "skip"


# -- ssh banner and witness -------------------------------------------------------


def test_ssh_banner_answers(banner_port: int) -> None:
    config = _config([_node("spark-1", "http://127.0.0.1:9", ssh_port=banner_port)])
    found = asyncio.run(check_banner(config.nodes[0], config.detection))
    assert found.status == "ok" and "SSH-2.0-OpenSSH" in found.detail


def test_a_refused_ssh_port_fails_because_a_freeze_would_never_count() -> None:
    config = _config([_node("spark-1", "http://127.0.0.1:9", ssh_port=free_port())])
    found = asyncio.run(check_banner(config.nodes[0], config.detection))
    assert found.status == "fail"
    assert "refused" in found.detail and "never count as frozen" in found.detail


def test_witness_targets(banner_port: int) -> None:
    reached = f"tcp://127.0.0.1:{banner_port}"
    missed = f"tcp://127.0.0.1:{free_port()}"
    assert asyncio.run(check_witness_targets([reached])).status == "ok"
    partly = asyncio.run(check_witness_targets([reached, missed]))
    assert partly.status == "warn" and missed in partly.detail
    assert asyncio.run(check_witness_targets([missed])).status == "fail"
    assert asyncio.run(check_witness_targets([])).status == "warn"


# -- power devices: read, never switch --------------------------------------------


def test_power_device_state_and_outlet_name_without_a_single_set(
    pdu: PduStandinThread, community_file: Path
) -> None:
    config = _config(
        [_node("spark-3", "http://127.0.0.1:9", power=[_snmp(pdu, 3, community_file)])]
    )
    path = power_paths(config, config.nodes[0])[0]
    found = asyncio.run(check_power_path(config, path))
    assert found.status == "ok", found
    assert "power on" in found.detail and 'outlet 3 "spark-3"' in found.detail
    # The PDU's own reboot (5 s) is shorter than the 60 s hold: it cannot time the cycle.
    assert "self-timed on: no, the outlet's reboot duration is 5s" in found.detail
    assert pdu.standin.set_requests == []


def test_an_outlet_named_for_another_machine_warns(
    pdu: PduStandinThread, community_file: Path
) -> None:
    config = _config(
        [_node("spark-3", "http://127.0.0.1:9", power=[_snmp(pdu, 4, community_file)])]
    )
    found = asyncio.run(check_power_path(config, power_paths(config, config.nodes[0])[0]))
    assert found.status == "warn"
    assert '"db-1"' in found.detail and "cuts another machine" in found.detail
    assert pdu.standin.set_requests == []


def test_an_outlet_that_reads_off_warns(pdu: PduStandinThread, community_file: Path) -> None:
    pdu.call(lambda: setattr(pdu.standin.outlets[3], "on", False))
    config = _config(
        [_node("spark-3", "http://127.0.0.1:9", power=[_snmp(pdu, 3, community_file)])]
    )
    found = asyncio.run(check_power_path(config, power_paths(config, config.nodes[0])[0]))
    assert found.status == "warn" and "power off" in found.detail
    assert pdu.standin.set_requests == []
    assert pdu.standin.state(3) is PowerState.OFF


def test_a_silent_pdu_fails_as_unreachable(pdu: PduStandinThread, community_file: Path) -> None:
    pdu.standin.silent = True
    config = _config(
        [_node("spark-3", "http://127.0.0.1:9", power=[_snmp(pdu, 3, community_file)])]
    )
    found = asyncio.run(check_power_path(config, power_paths(config, config.nodes[0])[0]))
    assert found.status == "fail" and "does not answer" in found.detail
    assert pdu.standin.set_requests == []


def test_the_read_only_backend_refuses_a_command_before_anything_is_sent(
    pdu: PduStandinThread, community_file: Path
) -> None:
    config = _config(
        [_node("spark-3", "http://127.0.0.1:9", power=[_snmp(pdu, 3, community_file)])]
    )
    path = power_paths(config, config.nodes[0])[0]

    async def try_to_switch_off() -> None:
        backend = build_backend(path, read_device_secrets(path))
        power = VerifiedPower(ReadOnlyBackend(backend), PowerTiming(min_command_interval=0))
        try:
            assert await power.state() is PowerState.ON  # reads pass through
            with pytest.raises(ReadOnlyViolation):
                await power.off()
        finally:
            await backend.aclose()

    asyncio.run(try_to_switch_off())
    assert pdu.standin.set_requests == []
    assert pdu.standin.state(3) is PowerState.ON


def test_the_whole_controller_plan_sends_no_set(
    pdu: PduStandinThread, community_file: Path, agent_url: str, banner_port: int
) -> None:
    config = _config(
        [
            _node(
                "spark-3", agent_url, ssh_port=banner_port, power=[_snmp(pdu, 3, community_file)]
            ),
            _node(
                "spark-1",
                f"http://127.0.0.1:{free_port()}",
                ssh_port=banner_port,
                power=[_snmp(pdu, "spark-1", community_file)],
            ),
        ],
        witness=[f"tcp://127.0.0.1:{banner_port}"],
    )
    checks = {c.name: c for c in asyncio.run(run_plan(controller_plan(config)))}
    assert checks["controller.agent.spark-3"].status == "ok"
    assert checks["controller.agent.spark-1"].status == "fail"
    assert checks["controller.power.spark-3.1"].status == "ok"
    assert checks["controller.power.spark-1.1"].status == "ok"  # outlet given by name
    assert checks["controller.witness"].status == "ok"
    assert checks["controller.secret.nodes[0].power[0].community_file"].status == "ok"
    assert pdu.standin.set_requests == []
    # Nothing the report says carries the community string.
    assert all("doctor-write-community" not in c.detail for c in checks.values())


def test_a_node_without_a_power_path_warns() -> None:
    config = _config([_node("spark-1", "http://127.0.0.1:9")])
    coverage = [p for p in controller_plan(config) if p.name == "controller.power.spark-1"]
    (found,) = asyncio.run(run_plan(coverage))
    assert found.status == "warn"
    assert "a person must cut its power" in found.detail


@pytest.mark.parametrize(
    ("kind", "power_on", "status", "says"),
    [
        ("shelly", "restore_last", "ok", None),
        ("shelly", "on", "ok", None),
        ("shelly", "off", "warn", "stays off after its own power loss"),
        ("shelly", "match_input", "warn", "follows its button"),
        ("shelly_gen1", "last", "ok", None),
        ("shelly_gen1", "on", "ok", None),
        ("shelly_gen1", "off", "warn", "stays off after its own power loss"),
        ("shelly_gen1", "switch", "warn", "follows its button"),
        ("tasmota", 3, "ok", None),
        ("tasmota", 0, "warn", "stays off after its own power loss"),
        ("tasmota", 4, "warn", "the controller cannot cut power"),
        ("tasmota", 5, "warn", "PulseTime"),
    ],
)
def test_a_plug_that_would_leave_the_node_off_after_an_outage_warns(
    kind: str, power_on: str | int, status: str, says: str | None
) -> None:
    from spark_watchdog.lab.hardware.plug_standin import PlugStandin

    with PlugStandin(kind, power_on=power_on) as plug:
        device = {"type": kind, "url": plug.url, "timeout": 2.0}
        config = _config([_node("spark-2", "http://127.0.0.1:9", power=[device])])
        found = asyncio.run(check_power_path(config, power_paths(config, config.nodes[0])[0]))
        assert found.status == status, found
        if says is not None:
            assert says in found.detail and found.fix is not None
            assert "restore_last" in found.fix
        assert plug.commands == [], "doctor switched the plug"


@pytest.mark.parametrize("kind", ["shelly", "shelly_gen1", "tasmota"])
def test_doctor_says_whether_a_plug_switches_the_node_back_on_by_itself(kind: str) -> None:
    from spark_watchdog.lab.hardware.plug_standin import PlugStandin

    with PlugStandin(kind) as plug:
        device = {"type": kind, "url": plug.url, "timeout": 2.0}
        config = _config([_node("spark-2", "http://127.0.0.1:9", power=[device])])
        path = power_paths(config, config.nodes[0])[0]
        found = asyncio.run(check_power_path(config, path))
        assert found.status == "ok", found
        assert "self-timed on: yes" in found.detail and "on 62s after the off" in found.detail
        long_off = replace(config, policy=replace(config.policy, power_off_seconds=600.0))
        found = asyncio.run(check_power_path(long_off, path))
        if kind == "tasmota":  # Delay tops out at 360 s
            assert "self-timed on: no, Tasmota's Delay tops out at 360s" in found.detail
        else:
            assert "self-timed on: yes" in found.detail
        assert plug.commands == [], "doctor switched the plug"


@pytest.mark.parametrize(
    ("command", "status", "says"),
    [
        (["docker", "run", "--restart=always", "vllm/vllm-openai"], "warn", "behind the agent's"),
        (["/usr/bin/podman", "run", "--restart", "on-failure", "img"], "warn", "behind the"),
        (["docker", "run", "--restart", "no", "img"], "warn", "only the client"),
        (["docker", "run", "--rm", "img"], "warn", "only the client"),
        (["vllm", "serve", "m", "--restart", "always"], "ok", "not a container runtime"),
        ([], "skip", "empty"),
    ],
)
def test_a_rank_under_a_container_runtime_warns(command: list[str], status: str, says: str) -> None:
    from spark_watchdog.doctor.node_checks import check_restart_policy

    found = check_restart_policy(command)
    assert found.status == status, found
    assert says in found.detail, found


def _launcher_config(tmp_path: Path, stop: list[str], **launcher: Any) -> ControllerConfig:
    settings: dict[str, Any] = {"type": "command", "stop": stop, "start": [sys.executable]}
    settings.update(launcher)
    return _config(
        [_node("spark-1", "http://127.0.0.1:9")],
        serving={"head": "spark-1", "launcher": settings},
    )


def test_the_launchers_commands_are_found_before_an_incident(tmp_path: Path) -> None:
    script = tmp_path / "launch-cluster.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    found = _launcher_config(
        tmp_path, ["./launch-cluster.sh", "stop"], working_directory=str(tmp_path)
    )
    missing = _launcher_config(
        tmp_path, ["./launch-cluster.sh", "stop"], working_directory="/nonexistent"
    )
    agents = _config([_node("spark-1", "http://127.0.0.1:9")])

    assert asyncio.run(check_launcher(found)).status == "ok"
    failed = asyncio.run(check_launcher(missing))
    assert (
        failed.status == "fail" and "./launch-cluster.sh cannot run on this host" in failed.detail
    )
    assert "working_directory" in (failed.fix or "")
    assert (
        asyncio.run(check_launcher(agents)).detail
        == "the agents stop and start the ranks (native order)"
    )


def test_doctor_reads_an_exec_path_without_switching(tmp_path: Path) -> None:
    from spark_watchdog.lab.hardware.relay_board import RelayBoard

    board = RelayBoard(tmp_path, initially_on=False)
    config = _config([_node("spark-2", "http://127.0.0.1:9", power=[board.device()])])
    found = asyncio.run(check_power_path(config, power_paths(config, config.nodes[0])[0]))
    assert found.status == "warn" and "power off: spark-2 is not powered now" in found.detail
    board.set_fault("garbage")
    found = asyncio.run(check_power_path(config, power_paths(config, config.nodes[0])[0]))
    assert found.status == "fail" and "relay 3 is ON-ish" in found.detail
    assert board.commands == [], "doctor switched the relay"


def test_doctor_reads_a_home_assistant_switch_without_switching(tmp_path: Path) -> None:
    from spark_watchdog.lab.hardware.home_assistant_standin import HomeAssistantStandin

    token = tmp_path / "ha-token"
    token.write_text("doctor-token\n")
    token.chmod(0o600)
    with HomeAssistantStandin("doctor-token") as home:
        device = {
            "type": "home_assistant",
            "url": home.url,
            "entity_id": "switch.spark_1",
            "token_file": str(token),
        }
        config = _config([_node("spark-2", "http://127.0.0.1:9", power=[device])])
        path = power_paths(config, config.nodes[0])[0]
        found = asyncio.run(check_power_path(config, path))
        assert found.status == "ok" and "switch.spark_1: power on" in found.detail, found
        home.set_state("unavailable")
        found = asyncio.run(check_power_path(config, path))
        assert found.status == "fail" and "Home Assistant cannot see the device" in found.detail
        assert home.calls == [], "doctor switched the entity"


def test_doctor_reads_a_nut_outlet_without_switching(nut_server: Any, tmp_path: Path) -> None:
    """Against dummy-ups behind a real upsd; the test plays the device for outlet 2."""
    nut_server.set_var("pdu", "outlet.2.status", "off")
    nut_server.wait_var("pdu", "outlet.2.status", "off")
    config = _config(
        [
            _node("spark-1", "http://127.0.0.1:9", power=[_nut(nut_server, tmp_path, 1)]),
            _node("spark-2", "http://127.0.0.1:9", power=[_nut(nut_server, tmp_path, 2)]),
        ]
    )
    first = asyncio.run(check_power_path(config, power_paths(config, config.nodes[0])[0]))
    second = asyncio.run(check_power_path(config, power_paths(config, config.nodes[1])[0]))
    assert first.status == "ok" and "nut pdu@" in first.detail and "power on" in first.detail
    assert second.status == "warn" and "spark-2 is not powered now" in second.detail


def test_doctor_reads_a_kasa_plug_without_switching(tmp_path: Path) -> None:
    """Against the Kasa stand-in (built from the protocol: no real plug runs here)."""
    pytest.importorskip("kasa", reason="python-kasa (the kasa extra)")
    from spark_watchdog.lab.hardware.kasa_standin import KasaStandin

    with KasaStandin("legacy", outlets=2) as strip:
        device = {"type": "kasa", "host": strip.host, "port": strip.port, "outlet": 2}
        config = _config([_node("spark-2", "http://127.0.0.1:9", power=[device])])
        path = power_paths(config, config.nodes[0])[0]
        found = asyncio.run(check_power_path(config, path))
        assert found.status == "ok" and "outlet 2: power on" in found.detail, found
        strip.set_state(False, 2)
        found = asyncio.run(check_power_path(config, path))
        assert found.status == "warn" and "spark-2 is not powered now" in found.detail
        wrong = {**device, "outlet": 4}
        config = _config([_node("spark-2", "http://127.0.0.1:9", power=[wrong])])
        found = asyncio.run(check_power_path(config, power_paths(config, config.nodes[0])[0]))
        assert found.status == "fail" and "no outlet 4: the strip has 2" in found.detail
        assert strip.switches == [], "doctor switched the outlet"
