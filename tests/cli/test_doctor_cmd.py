"""``spark-watchdog doctor`` through the real entry point: exit codes, the --json
document, the human report, against real components on loopback (the agent daemon,
an SNMP PDU, vLLM and NVML stand-ins, real journal files)."""

from __future__ import annotations

import ctypes.util
import json
import os
import shutil
import socketserver
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from spark_watchdog.cli import doctor_cmd
from spark_watchdog.cli.main import main
from spark_watchdog.doctor.result import STATUSES
from spark_watchdog.lab.hardware import gpu_standin
from spark_watchdog.lab.hardware.journal_writer import Ending, boot_entries, write_boot
from spark_watchdog.lab.hardware.pdu_standin import PduStandin, PduStandinThread, StandinConfig
from spark_watchdog.lab.hardware.vllm_standin import VllmStandin
from spark_watchdog.lab.ports import free_port
from spark_watchdog.lab.stories.agent_demo import AgentProcess
from spark_watchdog.power.snmp_profiles import APC_RPDU2

pytestmark = pytest.mark.integration

TOKEN = "doctor-test-token-0123456789"
COMMUNITY = "doctor-test-community"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _doctor(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_watchdog", "doctor", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


def _by_name(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {check["name"]: check for check in document["checks"]}


def _assert_document_shape(document: dict[str, Any]) -> None:
    assert set(document) == {"checks", "ok", "failures", "warnings"}
    assert document["checks"], "no checks in the report"
    for check in document["checks"]:
        assert set(check) == {"name", "status", "detail", "fix"}
        assert check["status"] in STATUSES
        if check["status"] in ("warn", "fail"):
            assert check["fix"], f"{check['name']} has no fix"
    statuses = [c["status"] for c in document["checks"]]
    assert document["failures"] == statuses.count("fail")
    assert document["warnings"] == statuses.count("warn")
    assert document["ok"] is (document["failures"] == 0)


# -- usage -----------------------------------------------------------------------------


def test_help_lists_doctor(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "doctor" in capsys.readouterr().out


def test_no_config_anywhere_names_both_default_paths_and_exits_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    agent, controller = tmp_path / "agent.yaml", tmp_path / "controller.yaml"
    monkeypatch.setattr(doctor_cmd, "DEFAULT_AGENT_CONFIG", agent)
    monkeypatch.setattr(doctor_cmd, "DEFAULT_CONTROLLER_CONFIG", controller)
    code, out, err = _run(["doctor"], capsys)
    assert code == 2 and out == ""
    assert str(agent) in err and str(controller) in err


def test_a_default_config_that_exists_is_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    controller = tmp_path / "controller.yaml"
    controller.write_text("nodes: []\n")
    monkeypatch.setattr(doctor_cmd, "DEFAULT_AGENT_CONFIG", tmp_path / "agent.yaml")
    monkeypatch.setattr(doctor_cmd, "DEFAULT_CONTROLLER_CONFIG", controller)
    code, out, _ = _run(["doctor", "--json"], capsys)
    checks = _by_name(json.loads(out))
    assert code == 1
    assert checks["config.controller"]["status"] == "fail"
    assert "nodes: expected at least one node" in checks["config.controller"]["detail"]


def test_a_config_file_that_does_not_exist_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "agent.yaml"
    code, out, err = _run(["doctor", "--agent-config", str(missing)], capsys)
    assert code == 2 and out == ""
    assert f"--agent-config {missing}: file not found" in err


def test_an_invalid_config_is_a_failed_check_with_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("node: spark-1\nlisten: {port: 70000}\nprobes: {vllm: {interval: fast}}\n")
    code, out, _ = _run(["doctor", "--agent-config", str(path), "--json"], capsys)
    document = json.loads(out)
    _assert_document_shape(document)
    checks = _by_name(document)
    assert code == 1
    assert "listen.port: expected an integer" in checks["config.agent"]["detail"]
    assert "probes.vllm.interval: expected a number" in checks["config.agent"]["detail"]
    assert checks["node"]["status"] == "skip"


# -- a node --------------------------------------------------------------------------


@pytest.fixture
def node_files(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A node's journal (a boot that froze), a 0600 token, a vLLM stand-in, and the lab's
    NVML stand-in installed as pynvml in a directory for PYTHONPATH."""
    journal = tmp_path / "journal"
    write_boot(
        journal,
        boot_entries(
            uuid.uuid4().hex,
            datetime.now(timezone.utc) - timedelta(hours=2),
            ending=Ending.POWER_LOSS,
        ),
    )
    token = tmp_path / "serving-token"
    token.write_text(TOKEN + "\n")
    token.chmod(0o600)
    nvml = tmp_path / "nvml"
    nvml.mkdir()
    shutil.copyfile(gpu_standin.__file__, nvml / "pynvml.py")
    with VllmStandin() as vllm:
        config = {
            "node": "spark-1",
            "probes": {
                "vllm": {"url": vllm.url},
                "gpu": {"deadline": 5.0},
                "journal": {"directory": str(journal)},
            },
            "serving": {
                "enabled": True,
                "command": ["vllm", "serve", "some/model"],
                "token_file": str(token),
                "log_file": str(tmp_path / "serving.log"),
            },
        }
        path = tmp_path / "agent.yaml"
        path.write_text(yaml.safe_dump(config))
        yield {"config": path, "token": token, "nvml": nvml, "node_dir": tmp_path}


def _with_nvml_standin(files: dict[str, Any]) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(files["nvml"]),
        "SPARK_WATCHDOG_NODE_DIR": str(files["node_dir"]),
    }


def test_a_healthy_node_exits_0_with_warnings_allowed(node_files: dict[str, Any]) -> None:
    done = _doctor(
        ["--agent-config", str(node_files["config"]), "--json"], _with_nvml_standin(node_files)
    )
    document = json.loads(done.stdout)
    _assert_document_shape(document)
    checks = _by_name(document)
    assert done.returncode == 0, done.stdout + done.stderr
    assert checks["node.gpu"]["status"] == "ok" and "NVIDIA GB10" in checks["node.gpu"]["detail"]
    assert checks["node.vllm"]["status"] == "ok"
    assert checks["node.journal.previous_boot"]["status"] == "ok"
    assert "UNCLEANLY" in checks["node.journal.previous_boot"]["detail"]
    assert checks["node.secret.serving.token_file"]["status"] == "ok"
    assert checks["node.watchdog"]["status"] in ("ok", "warn")


def test_a_token_readable_by_others_fails_and_is_never_printed(
    node_files: dict[str, Any],
) -> None:
    node_files["token"].chmod(0o644)
    env = _with_nvml_standin(node_files)
    done = _doctor(["--agent-config", str(node_files["config"]), "--json"], env)
    checks = _by_name(json.loads(done.stdout))
    assert done.returncode == 1
    token_check = checks["node.secret.serving.token_file"]
    assert token_check["status"] == "fail" and "mode 0644" in token_check["detail"]
    human = _doctor(["--agent-config", str(node_files["config"])], env)
    for output in (done.stdout, done.stderr, human.stdout, human.stderr):
        assert TOKEN not in output


def test_hanging_nvml_fails_within_the_deadline(node_files: dict[str, Any]) -> None:
    gpu_standin.write_mode(node_files["node_dir"], "hang")
    started = time.monotonic()
    done = _doctor(
        ["--agent-config", str(node_files["config"]), "--json"], _with_nvml_standin(node_files)
    )
    assert time.monotonic() - started < 60
    gpu = _by_name(json.loads(done.stdout))["node.gpu"]
    assert done.returncode == 1
    # The doctor starts a fresh NVML worker: its read deadline (5 s) plus the
    # worker's start allowance (5 s).
    assert gpu["status"] == "fail"
    assert "freshly started NVML worker did not answer within 10 s" in gpu["detail"]


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has an NVIDIA driver"
)
def test_this_machine_without_a_driver_fails_the_gpu_check(node_files: dict[str, Any]) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = _doctor(["--agent-config", str(node_files["config"]), "--json"], env)
    gpu = _by_name(json.loads(done.stdout))["node.gpu"]
    assert done.returncode == 1
    assert gpu["status"] == "fail"
    assert "no NVIDIA driver" in gpu["detail"] and "serving.enabled" in gpu["detail"]


# -- a controller ----------------------------------------------------------------------


class _Banner(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(b"SSH-2.0-OpenSSH_9.2p1\r\n")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """The real agent daemon as spark-1, an SSH banner, an SNMP PDU feeding spark-1 on
    outlet 1, and a controller.yaml tying them together."""
    journal = tmp_path / "journal"
    write_boot(journal, boot_entries(uuid.uuid4().hex, datetime.now(timezone.utc)))
    port = free_port()
    agent_yaml = tmp_path / "agent.yaml"
    agent_yaml.write_text(
        yaml.safe_dump(
            {
                "node": "spark-1",
                "listen": {"address": "127.0.0.1", "port": port},
                "loop_interval": 0.2,
                "probes": {
                    "vllm": {"url": f"http://127.0.0.1:{free_port()}"},
                    "gpu": {"deadline": 1.0},
                    "journal": {"directory": str(journal)},
                },
            }
        )
    )
    community = tmp_path / "pdu-community"
    community.write_text(COMMUNITY)
    community.chmod(0o600)
    banner = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Banner)
    threading.Thread(target=banner.serve_forever, daemon=True).start()
    pdu = PduStandinThread(
        PduStandin(StandinConfig(APC_RPDU2, names={1: "spark-1"}, write_community=COMMUNITY))
    ).start()
    agent = AgentProcess(agent_yaml, tmp_path)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{base}/v1/state", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert agent.process.poll() is None and time.monotonic() < deadline, (
                agent.log_path.read_text()
            )
            time.sleep(0.1)
        banner_port = banner.server_address[1]
        controller = {
            "nodes": [
                {
                    "name": "spark-1",
                    "agent": base,
                    "ssh_host": "127.0.0.1",
                    "ssh_port": banner_port,
                    "power": [
                        {
                            "type": "snmp",
                            "host": "127.0.0.1",
                            "port": pdu.port,
                            "outlet": 1,
                            "community_file": str(community),
                            "timeout": 0.5,
                            "retries": 0,
                        }
                    ],
                }
            ],
            "witness": [f"tcp://127.0.0.1:{banner_port}"],
        }
        path = tmp_path / "controller.yaml"
        path.write_text(yaml.safe_dump(controller))
        yield {"config": path, "pdu": pdu, "controller": controller}
    finally:
        agent.close()
        pdu.stop()
        banner.shutdown()
        banner.server_close()


def test_a_healthy_controller_exits_0_and_the_pdu_received_no_set(
    cluster: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(["doctor", "--controller-config", str(cluster["config"]), "--json"], capsys)
    document = json.loads(out)
    _assert_document_shape(document)
    checks = _by_name(document)
    assert code == 0, out
    for name in (
        "config.controller",
        "controller.agent.spark-1",
        "controller.clock.spark-1",
        "controller.ssh.spark-1",
        "controller.power.spark-1.1",
        "controller.witness",
        "controller.secret.nodes[0].power[0].community_file",
    ):
        assert checks[name]["status"] == "ok", checks[name]
    assert '"spark-1"' in checks["controller.power.spark-1.1"]["detail"]
    assert cluster["pdu"].standin.set_requests == []
    assert COMMUNITY not in out


def test_the_human_report_has_one_line_per_check_a_fix_under_problems_and_a_summary(
    cluster: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    controller = dict(cluster["controller"])
    controller["witness"] = [f"tcp://127.0.0.1:{free_port()}"]  # nothing answers there
    path = tmp_path / "controller-bad-witness.yaml"
    path.write_text(yaml.safe_dump(controller))
    code, out, err = _run(["doctor", "--controller-config", str(path)], capsys)
    lines = out.splitlines()
    assert code == 1
    assert err == ""  # progress lines only on a terminal
    witness = next(i for i, line in enumerate(lines) if "controller.witness" in line)
    assert lines[witness].startswith("FAIL  controller.witness")
    assert lines[witness + 1].startswith("      fix: ")
    assert any(line.startswith("OK    controller.power.spark-1.1") for line in lines)
    assert lines[-1].startswith("doctor: ") and lines[-1].endswith("FAILED")
    assert "1 failure" in lines[-1]
    assert cluster["pdu"].standin.set_requests == []
