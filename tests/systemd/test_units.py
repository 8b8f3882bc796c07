"""The shipped units pass systemd's own checks: the agent, the controller, the
agent with the serving drop-in that nodes launching vLLM ranks install, and the
controller with the drop-in of a controller that runs on a Spark beside the agent."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "systemd"
AGENT = UNITS / "spark-watchdog-agent.service"
CONTROLLER = UNITS / "spark-watchdog-controller.service"
SERVING = UNITS / "spark-watchdog-agent.service.d" / "serving.conf"
DOCKER = UNITS / "spark-watchdog-agent.service.d" / "docker.conf"
COLOCATED = UNITS / "spark-watchdog-controller.service.d" / "colocated.conf"
INSTALLED = "/opt/spark-watchdog/bin/spark-watchdog"
# systemd-analyze takes the threshold in tenths of the exposure score:
# 25 means "fail above 2.5" (checked: an exposure of 1.8 fails at 17, passes at 18).
THRESHOLD = 25

pytestmark = pytest.mark.integration

# (name, unit file, drop-ins applied in order)
VARIANTS = {
    "agent": (AGENT, ()),
    "controller": (CONTROLLER, ()),
    "agent+serving": (AGENT, (SERVING,)),
    "agent+docker": (AGENT, (DOCKER,)),
    "controller+colocated": (CONTROLLER, (COLOCATED,)),
}


def _analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed (Debian package systemd)")
    return tool


def _merged(variant: str, tmp_path: Path, entry: str = INSTALLED) -> Path:
    """The unit with its drop-ins appended: systemd reads drop-ins after the
    unit, section by section, exactly as a later part of the same file."""
    unit, dropins = VARIANTS[variant]
    text = "\n".join(p.read_text() for p in (unit, *dropins))
    path = tmp_path / unit.name
    path.write_text(text.replace(INSTALLED, entry))
    return path


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_unit_verifies(variant: str, tmp_path: Path) -> None:
    tool = _analyze()
    # ExecStart names the installed path (/opt/spark-watchdog); verify checks
    # that the binary exists, so point it at this checkout's entry point.
    entry = Path(sys.executable).with_name("spark-watchdog")
    assert entry.exists(), f"{entry} missing: install the project (pip install -e .)"
    unit = _merged(variant, tmp_path, str(entry))
    result = subprocess.run(
        [tool, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr + result.stdout
    assert unit.name not in result.stderr, result.stderr


def _exposure(tool: str, unit: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    result = subprocess.run(
        [tool, "security", "--offline=yes", f"--threshold={THRESHOLD}", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d)", result.stdout)
    assert match, result.stdout + result.stderr
    return float(match.group(1)), result


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_security_exposure_at_most_threshold(variant: str, tmp_path: Path) -> None:
    tool = _analyze()
    exposure, result = _exposure(tool, _merged(variant, tmp_path))
    assert exposure <= THRESHOLD / 10, result.stdout[-3000:]
    assert result.returncode == 0, result.stdout[-2000:]


def test_threshold_really_fails_a_weaker_unit(tmp_path: Path) -> None:
    tool = _analyze()
    weak = tmp_path / "weak.service"
    weak.write_text("[Service]\nType=notify\nExecStart=/bin/true\n")
    exposure, result = _exposure(tool, weak)
    assert exposure > THRESHOLD / 10
    assert result.returncode != 0


def test_the_serving_dropin_relaxes_what_vllm_needs(tmp_path: Path) -> None:
    """The drop-in must actually take effect on the settings that break a
    vLLM rank (not only be well-formed): the analyzer's view changes."""
    tool = _analyze()

    def flagged(variant: str) -> set[str]:
        _, result = _exposure(tool, _merged(variant, tmp_path))
        return {m.group(1) for m in re.finditer(r"^✗ (\S+?)=", result.stdout, re.M)}

    plain, serving = flagged("agent"), flagged("agent+serving")
    assert "MemoryDenyWriteExecute" not in plain
    assert "MemoryDenyWriteExecute" in serving
    assert "RestrictAddressFamilies" in serving  # AF_NETLINK for NCCL
    text = SERVING.read_text()
    assert re.search(r"^LimitMEMLOCK=infinity$", text, re.M)
    assert re.search(r"^DynamicUser=no$", text, re.M)


@pytest.mark.parametrize("unit", [AGENT, CONTROLLER], ids=["agent", "controller"])
def test_unit_is_notify_with_a_watchdog(unit: Path) -> None:
    text = unit.read_text()
    assert re.search(r"^Type=notify$", text, re.M)
    assert re.search(r"^WatchdogSec=\d+s$", text, re.M)
    assert re.search(r"^Restart=\w+", text, re.M)
    assert re.search(r"^StateDirectory=spark-watchdog$", text, re.M)
    assert re.search(r"^ExecStart=/opt/spark-watchdog/bin/spark-watchdog ", text, re.M)


def test_controller_checks_its_config_before_starting() -> None:
    text = CONTROLLER.read_text()
    start = re.search(r"^ExecStart=(.*)$", text, re.M)
    pre = re.search(r"^ExecStartPre=(.*)$", text, re.M)
    assert start and pre
    assert pre.group(1) == start.group(1) + " --check"


def _effective(variant: str, key: str) -> list[str]:
    """A list setting as systemd reads it: each line adds, an empty one clears."""
    unit, dropins = VARIANTS[variant]
    values: list[str] = []
    for path in (unit, *dropins):
        for match in re.finditer(rf"^{key}=(.*)$", path.read_text(), re.M):
            values = values + match.group(1).split() if match.group(1) else []
    return values


@pytest.mark.parametrize("agent", ["agent", "agent+serving", "agent+docker"])
def test_a_controller_on_a_spark_keeps_its_state_apart_from_the_agent_s(agent: str) -> None:
    """Both units name spark-watchdog, each as a user of its own: on one host systemd
    would hand the directory to whichever starts. The colocated drop-in moves the
    controller's state out of the agent's way, readable by the controller only."""
    assert _effective("controller", "StateDirectory") == _effective(agent, "StateDirectory")
    controller = _effective("controller+colocated", "StateDirectory")
    assert controller == ["spark-watchdog-controller"]
    assert not set(controller) & set(_effective(agent, "StateDirectory"))
    assert _effective("controller+colocated", "StateDirectoryMode")[-1] == "0700"  # the last wins
    assert "/var/lib/spark-watchdog-controller/history.db" in COLOCATED.read_text()
