"""``spark-watchdog probe gpu``, driven in-process through argparse."""

from __future__ import annotations

import argparse
import ctypes
import json

import pytest

from spark_watchdog.cli import probe_gpu
from spark_watchdog.probes.gpu import GpuDevice, GpuReading


def _has_nvidia_driver() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="spark-watchdog probe")
    probe_gpu.add_parser(parser.add_subparsers(dest="probe", required=True))
    return parser.parse_args(["gpu", *argv])


GB10 = GpuReading(
    "ok",
    (
        GpuDevice(
            index=0,
            name="NVIDIA GB10",
            uuid="GPU-5d2e8f7a-1b3c-4d5e-8f9a-0b1c2d3e4f5a",
            power_w=21.4,
            utilization_gpu_pct=96,
            temperature_c=49,
            sm_clock_mhz=None,
            not_supported=("memory_used_bytes", "memory_total_bytes"),
            errors={"sm_clock_mhz": "Unknown Error"},
        ),
    ),
    duration_s=0.0021,
    driver_version="580.95.05",
    nvml_version="13.580.95.05",
)


@pytest.mark.integration
@pytest.mark.skipif(_has_nvidia_driver(), reason="this machine has an NVIDIA driver")
def test_without_a_gpu_json_says_unavailable_and_exits_1(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = parse("--json")
    assert args.deadline == 3.0
    assert args.func(args) == 1
    printed = json.loads(capsys.readouterr().out)
    assert {"state", "devices", "error"} <= set(printed)
    assert printed["state"] == "unavailable"
    assert printed["devices"] == []
    assert "no NVIDIA driver" in printed["error"]


@pytest.mark.integration
@pytest.mark.skipif(_has_nvidia_driver(), reason="this machine has an NVIDIA driver")
def test_without_a_gpu_the_table_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse("--deadline", "10")
    assert args.func(args) == 1
    out = capsys.readouterr().out
    assert out.startswith("GPU: unavailable: libnvidia-ml.so.1 not found")


@pytest.mark.parametrize("deadline", ["0", "-1", "fast", "inf", "nan"])
def test_a_bad_deadline_is_a_usage_error(deadline: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse("--deadline", deadline)
    assert exit_info.value.code == 2
    assert f'expected a number of seconds > 0, got "{deadline}"' in capsys.readouterr().err


def test_an_ok_reading_exits_0_and_round_trips(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    deadlines: list[float] = []

    def fake_read_once(deadline: float) -> GpuReading:
        deadlines.append(deadline)
        return GB10

    monkeypatch.setattr(probe_gpu, "read_once", fake_read_once)
    args = parse("--json", "--deadline", "1.5")
    assert args.func(args) == 0
    assert deadlines == [1.5]
    assert GpuReading.from_json(json.loads(capsys.readouterr().out)) == GB10


def test_the_table_marks_unsupported_and_failed_fields() -> None:
    lines = probe_gpu.render_table(GB10).splitlines()
    assert lines[0].split() == [
        "GPU", "NAME", "POWER", "W", "UTIL", "%", "TEMP", "°C", "SM", "MHz",
        "MEM", "USED", "GiB", "MEM", "TOTAL", "GiB",
    ]  # fmt: skip
    assert lines[1].split() == ["0", "NVIDIA", "GB10", "21.4", "96", "49", "err", "n/s", "n/s"]
    assert "driver 580.95.05, NVML 13.580.95.05, read in 2 ms" in lines
    assert "GPU 0 sm_clock_mhz: Unknown Error" in lines
