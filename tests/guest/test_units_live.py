"""Both units under a real systemd as PID 1 (docs/install.md, "Tried on").

Two guests booted from one Debian image: ``swnode`` runs the agent
installed with ``deploy/install.sh node --serving``, ``swcontrol`` the
controller installed with ``deploy/install.sh controller``; the controller
watches the agent over loopback. The tests run in file order on the same
two guests (each leaves them running for the next).
"""

from __future__ import annotations

import json
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import requests
import yaml

from spark_watchdog.lab.hardware.pdu_standin import PduStandin, PduStandinThread, StandinConfig
from spark_watchdog.lab.ports import free_port
from spark_watchdog.power.base import PowerState
from spark_watchdog.power.snmp_profiles import profile_by_name

if TYPE_CHECKING:
    from conftest import Guest

AGENT = "spark-watchdog-agent.service"
CONTROLLER = "spark-watchdog-controller.service"
TOKEN = secrets.token_hex(16)
COMMUNITY = secrets.token_hex(8)
RELEASE_PYTHON = "/opt/spark-watchdog/bin/python"


class Ports:
    """The guests' ports (they share this machine's network), picked when the
    module's tests begin: every worker imports this module, and a port picked
    at import would be bound minutes later."""

    agent = vllm = controller = banner = 0


@pytest.fixture(scope="module", autouse=True)
def _ports() -> None:
    Ports.agent, Ports.vllm, Ports.controller, Ports.banner = (free_port() for _ in range(4))


# The node's SSH banner for the controller's check (the image has no sshd):
# frozen with the rest of the guest, its port still completes the handshake
# in the kernel and sends nothing, as a frozen Spark's sshd does.
BANNER_SCRIPT = """import socket, sys
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))
while True:
    peer, _ = server.accept()
    try:
        peer.sendall(b"SSH-2.0-OpenSSH_9.2 swnode\\r\\n")
    except OSError:
        pass
    peer.close()
"""


def _banner_service() -> str:
    return f"""[Unit]
Description=An SSH banner on the guest's SSH port (the controller's check)
[Service]
ExecStart=/usr/bin/python3 /usr/local/bin/guest-ssh-banner {Ports.banner}
[Install]
WantedBy=multi-user.target
"""


def _wheel(kind: str, wheels: dict[str, Path]) -> str:
    return f"/wheels/{kind}/{wheels[kind].name}"


def _agent_config() -> dict[str, Any]:
    return {
        "node": "swnode",
        "listen": {"address": "127.0.0.1", "port": Ports.agent},
        "loop_interval": 1.0,
        "probes": {
            "vllm": {"url": f"http://127.0.0.1:{Ports.vllm}", "interval": 1.0},
            "journal": {"interval": 2.0},
        },
        "serving": {
            "enabled": True,
            "command": [
                RELEASE_PYTHON,
                "/src/tests/guest/wx_rank.py",
                "--host",
                "127.0.0.1",
                "--port",
                str(Ports.vllm),
                "--model",
                "guest-model",
            ],
            "token_file": "serving-token",
            "default_profile": "plain",
            "stop_timeout": 10.0,
        },
    }


def _controller_config(pdu_port: int) -> dict[str, Any]:
    return {
        "nodes": [
            {
                "name": "swnode",
                "agent": f"http://127.0.0.1:{Ports.agent}",
                "power": [
                    {
                        "type": "snmp",
                        "host": "127.0.0.1",
                        "port": pdu_port,
                        "outlet": 1,
                        "vendor": "apc_rpdu2",
                        "community_file": "pdu-community",
                        "timeout": 1.0,
                    }
                ],
            }
        ],
        # The node guest reboots and loses power below; its outlet powers nothing.
        "guards": {"dry_run": True},
        "serving": {"head": "swnode", "token_file": "serving-token", "auto_restart": False},
        "listen": {"address": "127.0.0.1", "port": Ports.controller},
    }


@pytest.fixture(scope="module")
def outlet_wiring() -> list[Callable[[int, PowerState], None]]:
    """What an outlet of the PDU powers: filled in by the test that needs it."""
    return []


@pytest.fixture(scope="module")
def pdu(outlet_wiring: list[Callable[[int, PowerState], None]]) -> Iterator[PduStandinThread]:
    def changed(outlet: int, state: PowerState) -> None:
        for wire in outlet_wiring:
            wire(outlet, state)

    standin = PduStandin(
        StandinConfig(
            profile=profile_by_name("apc_rpdu2"),
            outlets=8,
            names={1: "swnode"},
            write_community=COMMUNITY,
        ),
        on_change=changed,
    )
    thread = PduStandinThread(standin).start()
    try:
        yield thread
    finally:
        thread.stop()


# systemd-nspawn gives the guest a boot id of its own by a mount over
# /proc/sys/kernel/random/boot_id, which the private /proc of a sandboxed
# service does not carry: the agent would read the test machine's boot id
# while journald stamps the guest's. On a real host there is one boot id.
# The guest therefore publishes its boot id in /run, and the agent's unit gets
# it bound over the kernel's file; nothing else of the shipped unit changes.
BOOT_ID_SERVICE = """[Unit]
Description=The guest's boot id for sandboxed services (systemd-nspawn guests)
DefaultDependencies=no
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/cp /proc/sys/kernel/random/boot_id /run/guest-boot-id
"""
BOOT_ID_DROP_IN = """[Unit]
Requires=guest-boot-id.service
After=guest-boot-id.service
[Service]
BindReadOnlyPaths=/run/guest-boot-id:/proc/sys/kernel/random/boot_id
"""


@pytest.fixture(scope="module")
def node(guests: dict[str, Guest], wheels: dict[str, Path]) -> Guest:
    guest = guests["swnode"]
    guest.write("/etc/systemd/system/guest-boot-id.service", BOOT_ID_SERVICE)
    guest.write(f"/etc/systemd/system/{AGENT}.d/guest-boot-id.conf", BOOT_ID_DROP_IN)
    guest.write("/etc/spark-watchdog/credentials/serving-token", TOKEN + "\n", 0o600)
    guest.write("/etc/spark-watchdog/agent.yaml", yaml.safe_dump(_agent_config()))
    guest.write("/usr/local/bin/guest-ssh-banner", BANNER_SCRIPT)
    guest.write("/etc/systemd/system/guest-ssh-banner.service", _banner_service())
    guest.run("systemctl", "daemon-reload")
    guest.run("systemctl", "enable", "--now", "guest-ssh-banner.service")
    # A node that only watches first (the agent's own sandbox, a dynamic user);
    # the serving drop-in comes with its test below.
    guest.install("node", "--from", _wheel("current", wheels))
    return guest


@pytest.fixture(scope="module")
def control(
    guests: dict[str, Guest], wheels: dict[str, Path], pdu: PduStandinThread, node: Guest
) -> Guest:
    guest = guests["swcontrol"]
    guest.write("/etc/spark-watchdog/credentials/pdu-community", COMMUNITY + "\n", 0o600)
    guest.write("/etc/spark-watchdog/credentials/serving-token", TOKEN + "\n", 0o600)
    guest.write("/etc/spark-watchdog/controller.yaml", yaml.safe_dump(_controller_config(pdu.port)))
    guest.install("controller", "--from", _wheel("current", wheels))
    return guest


def _get_json(port: int, path: str) -> dict[str, Any] | None:
    """An answer of the agent or the controller over loopback (the guests share
    this machine's network); None while it does not answer."""
    try:
        answer = requests.get(f"http://127.0.0.1:{port}{path}", timeout=2)
        body: dict[str, Any] = answer.json()
    except (requests.RequestException, ValueError):
        return None
    return body if answer.ok else None


def _node_status() -> dict[str, Any]:
    """The controller's view of the node, from its /v1/status."""
    status = _get_json(Ports.controller, "/v1/status") or {}
    return next((n for n in status.get("nodes", []) if n.get("name") == "swnode"), {})


def _wait_agent(guest: Guest, ready: Any, what: str, timeout: float = 120.0) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def check() -> bool:
        state = _get_json(Ports.agent, "/v1/state")
        if state is None:
            return False
        seen.clear()
        seen.update(state)
        return bool(ready(state))

    try:
        guest.wait_for(check, timeout, what)
    except AssertionError as failed:
        probes = json.dumps(seen.get("probes"), indent=1)[:3000]
        raise AssertionError(f"{failed}\nthe agent's probes last: {probes}") from None
    return seen


def test_both_units_reach_running_after_ready_with_their_status_line(
    node: Guest, control: Guest
) -> None:
    for guest, unit in ((node, AGENT), (control, CONTROLLER)):
        guest.wait_active(unit)
        # Type=notify: "active (running)" only after READY=1; STATUS= is the agent's
        # or controller's own line, shown by systemctl status.
        status = guest.run("systemctl", "status", unit, "--no-pager", check=False).stdout
        print(f"--- {guest.name}: systemctl status {unit}\n{status}")
        assert "active (running)" in status
        shown = [line.strip() for line in status.splitlines() if 'Status: "' in line]
        assert shown and len(shown[0]) > len('Status: ""'), status
    # DynamicUser=: a user of its own from systemd's dynamic range (61184-65519).
    uid = int(node.run("ps", "-o", "uid=", "-p", str(node.main_pid(AGENT))).stdout)
    assert 61184 <= uid <= 65519, uid
    state = _wait_agent(node, lambda s: s["probes"]["journal"]["state"] == "ok", "the journal")
    # The dynamic user reads the system journal through its systemd-journal group,
    # and finds the boot it runs in.
    journal = state["probes"]["journal"]
    boot_id = node.run("cat", "/proc/sys/kernel/random/boot_id").stdout.strip()
    assert journal["current_boot_id"] == boot_id.replace("-", ""), journal
    assert state["probes"]["host"]["boot_id"] == journal["current_boot_id"]


def test_the_controller_reads_the_agent_and_keeps_its_history_private(
    node: Guest, control: Guest
) -> None:
    # A boot id comes only from the agent's own /v1/state.
    control.wait_for(
        lambda: bool(_node_status().get("boot_id")), 120, "the controller to see the node's agent"
    )
    state = control.root / "var/lib/private/spark-watchdog"
    history = state / "history.db"
    assert history.is_file(), f"no history in the state directory: {list(state.iterdir())}"
    uid = history.stat().st_uid
    assert uid != 0, "the history belongs to the service's dynamic user, not root"
    assert state.stat().st_mode & 0o777 == 0o700
    for path in (history, state / "history.db-wal"):
        assert path.stat().st_mode & 0o777 == 0o600, f"{path}: {path.stat().st_mode:o}"
        assert path.stat().st_uid == uid
    listing = control.run("ls", "-l", "/var/lib/private/spark-watchdog").stdout
    print(f"--- swcontrol: ls -l /var/lib/private/spark-watchdog\n{listing}")
    # The credential as the service sees it ($CREDENTIALS_DIRECTORY): its own, mode 0400.
    pid = control.main_pid(CONTROLLER)
    credential = f"/proc/{pid}/root/run/credentials/{CONTROLLER}/pdu-community"
    assert control.run("cat", credential).stdout.strip() == COMMUNITY
    mode, owner = control.run("stat", "-c", "%a %u", credential).stdout.split()
    assert mode == "400" and int(owner) == uid, (mode, owner)


def test_a_missing_credential_stops_the_controller_at_its_check(
    control: Guest, wheels: dict[str, Path]
) -> None:
    secret = "/etc/spark-watchdog/credentials/pdu-community"
    held = control.root / "root/pdu-community"
    (control.root / secret.lstrip("/")).rename(held)
    try:
        control.run("systemctl", "stop", CONTROLLER)
        control.install("controller", "--from", _wheel("current", wheels), "--no-start")
        started = control.run("systemctl", "start", CONTROLLER, check=False)
        assert started.returncode != 0, "the controller started without its PDU community"
        journal = control.journal(CONTROLLER)
        assert "pdu-community" in journal, journal
        assert COMMUNITY not in journal, "a secret reached the journal"
    finally:
        held.rename(control.root / secret.lstrip("/"))
        control.install("controller", "--from", _wheel("current", wheels), "--no-start")
        control.run("systemctl", "reset-failed", CONTROLLER, check=False)
        control.run("systemctl", "start", CONTROLLER)
    control.wait_active(CONTROLLER)


def test_the_serving_drop_in_runs_the_rank_under_the_relaxed_policy(
    node: Guest, wheels: dict[str, Path]
) -> None:
    node.install("node", "--serving", "--from", _wheel("current", wheels))
    node.wait_active(AGENT)
    _wait_agent(node, lambda s: True, "the agent to answer again")
    answer = requests.post(
        f"http://127.0.0.1:{Ports.agent}/v1/serving/start",
        json={"profile": "plain"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    )
    assert answer.ok, answer.text
    log = node.root / "var/lib/spark-watchdog/serving.log"
    try:
        _wait_agent(
            node, lambda s: s["probes"]["vllm"]["state"] == "progressing", "the rank to serve"
        )
    except AssertionError as failed:
        text = log.read_text()[-3000:] if log.exists() else "(no serving.log)"
        raise AssertionError(f"{failed}\n{text}\n{node.journal(AGENT)}") from None
    ranks = node.run("pgrep", "-u", "vllm", "-f", "spark_watchdog.lab.hardware vllm").stdout
    assert ranks.split(), "the rank runs as the serving user of the drop-in (User=vllm)"
    assert "wx-mapping: allowed" in log.read_text(), (
        "MemoryDenyWriteExecute=no of the drop-in did not reach the rank"
    )
    # The state directory moved out of /var/lib/private, to the serving user.
    assert not (node.root / "var/lib/spark-watchdog").is_symlink()
    agent_pid = node.main_pid(AGENT)
    user = node.run("ps", "-o", "user=", "-p", str(agent_pid)).stdout.strip()
    assert user == "vllm"


def test_the_watchdog_restarts_an_agent_and_a_controller_that_stopped(
    node: Guest, control: Guest
) -> None:
    stopped = {}
    for guest, unit in ((node, AGENT), (control, CONTROLLER)):
        shown = guest.show(unit, "MainPID", "NRestarts")
        stopped[unit] = (guest, int(shown["MainPID"]), int(shown["NRestarts"]))
        # A main loop that no longer runs: the whole process stopped, as a hang.
        guest.run("kill", "-STOP", shown["MainPID"])
    for unit, (guest, pid, restarts) in stopped.items():

        def restarted(guest: Guest = guest, unit: str = unit, pid: int = pid) -> bool:
            shown = guest.show(unit, "MainPID", "ActiveState", "SubState")
            return shown["MainPID"] not in ("0", str(pid)) and shown["SubState"] == "running"

        # WatchdogSec=30s, then (the agent) the abort's own timeout, then RestartSec;
        # the controller is killed at once (WatchdogSignal=SIGKILL).
        guest.wait_for(restarted, 180, f"systemd to restart {unit} after its watchdog")
        journal = guest.journal(unit, lines=400)
        print(f"--- {guest.name}: journalctl -u {unit} (watchdog)\n{journal[-1500:]}")
        assert "Watchdog timeout" in journal, journal
        assert int(guest.show(unit, "NRestarts")["NRestarts"]) == restarts + 1
    node.wait_active(AGENT)
    control.wait_active(CONTROLLER)


def test_the_agent_tells_a_clean_reboot_from_a_power_loss(node: Guest) -> None:
    before = _wait_agent(node, lambda s: s["probes"]["journal"]["state"] == "ok", "the journal")
    first = before["probes"]["journal"]["current_boot_id"]
    node.reboot()
    node.wait_active(AGENT)
    after_reboot = _wait_agent(
        node,
        lambda s: s["probes"]["journal"]["previous_boot_id"] == first,
        "the agent to report the rebooted boot",
    )["probes"]["journal"]
    print(f"--- swnode after a clean reboot: {json.dumps(after_reboot, indent=1)}")
    assert after_reboot["previous_boot_clean_shutdown"] is True
    second = after_reboot["current_boot_id"]
    assert second != first
    # Let journald move the new boot into /var/log/journal before the power goes.
    node.run("journalctl", "--flush")
    node.power_loss()
    node.wait_active(AGENT)
    after_loss = _wait_agent(
        node,
        lambda s: s["probes"]["journal"]["previous_boot_id"] == second,
        "the agent to report the boot that lost power",
    )["probes"]["journal"]
    print(f"--- swnode after a power loss: {json.dumps(after_loss, indent=1)}")
    assert after_loss["previous_boot_clean_shutdown"] is False


def test_an_upgrade_and_a_rollback_restart_the_agent_on_the_other_release(
    node: Guest, wheels: dict[str, Path]
) -> None:
    def version() -> str:
        return node.run("/usr/local/bin/spark-watchdog", "--version").stdout.strip()

    was = version()
    pid = node.main_pid(AGENT)
    node.install("node", "--serving", "--from", _wheel("later", wheels))
    assert version() != was and version().endswith(".post1"), version()
    node.wait_for(lambda: node.main_pid(AGENT) not in (0, pid), 120, "the agent's restart")
    node.wait_active(AGENT)
    releases = sorted(
        line for line in node.run("ls", "-1", "/opt/spark-watchdog/releases").stdout.split() if line
    )
    assert len(releases) == 2, releases
    upgraded = node.main_pid(AGENT)
    # The rollback docs/install.md gives, word for word.
    previous = f"/opt/spark-watchdog/releases/{releases[0]}/bin"
    node.run("ln", "-sfn", previous, "/opt/spark-watchdog/bin.new")
    node.run("mv", "-Tf", "/opt/spark-watchdog/bin.new", "/opt/spark-watchdog/bin")
    node.run("systemctl", "restart", "spark-watchdog-agent")
    node.wait_active(AGENT)
    assert version() == was
    assert node.main_pid(AGENT) != upgraded
    assert _wait_agent(node, lambda s: True, "the rolled-back agent to answer")


def test_nothing_of_the_project_is_world_readable(node: Guest, control: Guest) -> None:
    for guest in (node, control):
        found = guest.run(
            "find",
            "/etc/spark-watchdog/credentials",
            "/var/lib/private/spark-watchdog",
            "/var/lib/spark-watchdog/",
            "-perm",
            "-o+r",
            "-type",
            "f",
            check=False,
        ).stdout.split()
        assert not found, f"{guest.name}: readable by anyone: {found}"


def test_a_frozen_node_is_power_cycled_through_the_pdu_and_comes_back(
    node: Guest,
    control: Guest,
    pdu: PduStandinThread,
    outlet_wiring: list[Callable[[int, PowerState], None]],
) -> None:
    """The whole loop with real systemd on both sides: the node guest freezes,
    the controller (its community a credential) cuts outlet 1, which powers
    the node guest; the guest boots again; the controller sees the new boot
    and restarts serving with the safe profile (its token a credential)."""
    config = _controller_config(pdu.port)
    config["nodes"][0].update({"ssh_host": "127.0.0.1", "ssh_port": Ports.banner})
    # One node: its freeze is the whole cluster unhealthy, which the breaker
    # would take for a network fault.
    config["guards"] = {"dry_run": False, "max_unhealthy_fraction": 1.0, "boot_timeout": 240.0}
    config["policy"] = {
        "power_off_seconds": 3.0,
        "power_timeout": 15.0,
        "power_poll_interval": 0.5,
        "min_command_interval": 0.5,
        "self_timed_on": False,
    }
    config["detection"] = {
        "poll_interval": 1.0,
        "freeze_after": 5.0,
        "banner_misses": 2,
        "banner_timeout": 1.0,
        "banner_interval": 2.0,
    }
    config["serving"] = {
        "head": "swnode",
        "token_file": "serving-token",
        "auto_restart": True,
        "start_timeout": 240.0,
        "restart_cooldown": 0.0,
    }
    control.write("/etc/spark-watchdog/controller.yaml", yaml.safe_dump(config))
    control.run("systemctl", "restart", CONTROLLER)
    control.wait_active(CONTROLLER)
    control.wait_for(lambda: _node_status().get("verdict") == "healthy", 120, "a healthy node")
    before = _wait_agent(node, lambda s: True, "the agent")["probes"]["journal"]["current_boot_id"]
    powered: list[str] = []

    def outlet_powers_the_node(outlet: int, state: PowerState) -> None:
        if outlet != 1:
            return
        powered.append(state.name.lower())
        if state is PowerState.OFF:
            node.cut_power()
        else:
            threading.Thread(target=node.start, name="swnode-boot", daemon=True).start()

    outlet_wiring.append(outlet_powers_the_node)
    try:
        node.freeze()

        def recovered() -> bool:
            seen = _node_status()
            return (
                seen.get("power_cycles_total", 0) >= 1
                and seen.get("incident_id") is None
                and seen.get("verdict") == "healthy"
                and seen.get("boot_id") not in (None, before)
            )

        try:
            control.wait_for(recovered, 420, "the controller to power-cycle the node and recover")
        except AssertionError as failed:
            raise AssertionError(
                f"{failed}\noutlet: {powered}\nnode: {_node_status()}\n"
                f"{control.journal(CONTROLLER, lines=80)}"
            ) from None
    finally:
        outlet_wiring.clear()
    print(f"--- swcontrol: journalctl -u {CONTROLLER} (the power cycle)")
    print(control.journal(CONTROLLER, lines=40))
    assert powered == ["off", "on"], powered
    journal = _wait_agent(
        node,
        lambda s: s["probes"]["journal"]["previous_boot_id"] == before,
        "the agent to report the boot that lost power",
    )["probes"]["journal"]
    assert journal["previous_boot_clean_shutdown"] is False
    serving = _wait_agent(
        node, lambda s: s["serving"].get("state") == "running", "serving after the recovery"
    )["serving"]
    assert serving["profile"] == "safe", serving
    assert COMMUNITY not in control.journal(CONTROLLER, lines=400)
