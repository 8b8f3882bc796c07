"""One entry point for the lab's simulated devices: python -m spark_watchdog.lab.hardware."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spark_watchdog.lab.hardware.__main__ import DEVICES

ENTRY = [sys.executable, "-m", "spark_watchdog.lab.hardware"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ENTRY, *args], capture_output=True, text=True, timeout=120)


def test_without_a_device_it_lists_them_and_fails() -> None:
    done = run()
    assert done.returncode == 2
    for name in DEVICES:
        assert name in done.stdout


def test_an_unknown_device_is_named_in_the_error() -> None:
    done = run("toaster")
    assert done.returncode == 2
    assert "no such device: 'toaster'" in done.stderr


@pytest.mark.parametrize("device", ["pdu", "plug", "vllm", "host", "ssh-command"])
def test_each_device_takes_its_own_arguments(device: str) -> None:
    done = run(device, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
