"""The hardware-watchdog check: systemd's answer and a sysfs tree of the device."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from spark_watchdog.doctor.hw_watchdog import (
    BUSCTL_ARGV,
    USEC_INFINITY,
    Runner,
    check_hardware_watchdog,
    read_runtime_watchdog,
)


def _systemd(busctl: tuple[int, str], systemctl: tuple[int, str] = (1, "")) -> Runner:
    """A runner that answers the two queries the way the real tools print."""

    def run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        code, out = busctl if tuple(argv) == BUSCTL_ARGV else systemctl
        return subprocess.CompletedProcess(list(argv), code, out, "" if code == 0 else out)

    return run


def _device(root: Path, state: str = "active") -> None:
    (root / "dev").mkdir(parents=True, exist_ok=True)
    (root / "dev/watchdog0").write_text("")
    sysfs = root / "sys/class/watchdog/watchdog0"
    sysfs.mkdir(parents=True)
    (sysfs / "identity").write_text("SBSA Generic Watchdog\n")
    (sysfs / "timeout").write_text("30\n")
    (sysfs / "state").write_text(state + "\n")


def test_armed_with_the_device_active(tmp_path: Path) -> None:
    _device(tmp_path)
    found = check_hardware_watchdog(tmp_path, _systemd((0, "t 30000000\n")))
    assert found.status == "ok"
    assert "RuntimeWatchdogUSec=30s" in found.detail and "SBSA Generic Watchdog" in found.detail
    assert "first layer only" in found.detail


def test_not_armed_warns_with_the_system_conf_fix(tmp_path: Path) -> None:
    _device(tmp_path, state="inactive")
    found = check_hardware_watchdog(tmp_path, _systemd((0, "t 0\n")))
    assert found.status == "warn"
    assert found.fix is not None and "RuntimeWatchdogSec=30s" in found.fix


def test_armed_without_a_driver_warns(tmp_path: Path) -> None:
    found = check_hardware_watchdog(tmp_path, _systemd((0, "t 30000000\n")))
    assert found.status == "warn" and "no /dev/watchdog0" in found.detail
    assert found.fix is not None and "sbsa_gwdt" in found.fix


def test_systemctl_is_the_fallback_and_default_means_armed(tmp_path: Path) -> None:
    runner = _systemd((1, "Failed to connect to bus"), (0, "RuntimeWatchdogUSec=infinity\n"))
    assert read_runtime_watchdog(runner).usec == USEC_INFINITY
    _device(tmp_path)
    assert check_hardware_watchdog(tmp_path, runner).status == "ok"


@pytest.mark.parametrize(("text", "usec"), [("30s", 30_000_000), ("1min", 60_000_000), ("0", 0)])
def test_systemctl_time_spans(text: str, usec: int) -> None:
    runner = _systemd((1, "no bus"), (0, f"RuntimeWatchdogUSec={text}\n"))
    assert read_runtime_watchdog(runner).usec == usec


def test_this_machine_answers_without_failing() -> None:
    """The real tools on the real machine: armed or not, never a failure, always the caveat."""
    found = check_hardware_watchdog()
    assert found.status in ("ok", "warn")
    assert "first layer only" in found.detail
