"""Host probe against a committed fake /proc tree and the real /proc."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from spark_watchdog.errors import ProbeError
from spark_watchdog.probes.host import HostProbe, parse_meminfo, parse_pressure, read_boot_id

FAKE_PROC = Path(__file__).resolve().parents[1] / "fixtures" / "proc"


def test_reads_the_fake_tree() -> None:
    reading = HostProbe(FAKE_PROC).read(loop_lag_s=0.012, now=100.0)
    assert reading.state == "ok"
    assert reading.boot_id == "6f1c4b0e9a574c1e8d0a3e2b7f9c1a44"
    assert reading.uptime_s == 84231.52
    assert reading.mem_available_bytes == 41251720 * 1024
    assert reading.mem_total_bytes == 127617808 * 1024
    assert reading.load1 == 3.52
    assert reading.to_json()["loop_lag_s"] == 0.012
    assert reading.mem_available_trend_bytes_per_s is None  # one sample is no trend


def test_mem_available_trend_follows_a_collapse(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(FAKE_PROC, proc)
    probe = HostProbe(proc)
    gib = 1024**3
    for second in range(6):
        kb = (40 * gib - second * gib) // 1024
        (proc / "meminfo").write_text(f"MemTotal: 127617808 kB\nMemAvailable: {kb} kB\n")
        reading = probe.read(now=float(second))
    assert reading.mem_available_trend_bytes_per_s == pytest.approx(-gib, rel=1e-6)


def test_missing_and_garbled_files_are_errors_not_crashes(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(FAKE_PROC, proc)
    (proc / "uptime").write_text("garbage\n")
    (proc / "meminfo").write_text("MemTotal: 1 kB\n")
    (proc / "sys/kernel/random/boot_id").write_text("not-a-uuid\n")
    reading = HostProbe(proc).read()
    assert reading.state == "error"
    assert reading.boot_id is None
    assert reading.error is not None
    assert "uptime: expected a number first" in reading.error
    assert "no MemAvailable line" in reading.error
    assert "expected a UUID, got 'not-a-uuid'" in reading.error


def test_boot_id_error_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ProbeError, match="boot_id: cannot read the boot id"):
        read_boot_id(tmp_path)


def test_parse_meminfo_units() -> None:
    assert parse_meminfo("MemAvailable: 2 kB\nHugePages_Total: 3\nbad line\nX:\n") == {
        "MemAvailable": 2048,
        "HugePages_Total": 3,
    }


def test_real_proc() -> None:
    reading = HostProbe("/proc").read()
    assert reading.state == "ok", reading.error
    assert reading.boot_id is not None and len(reading.boot_id) == 32
    assert reading.mem_available_bytes and reading.mem_available_bytes > 0


def test_memory_pressure_is_read_from_psi() -> None:
    reading = HostProbe(FAKE_PROC).read(now=1.0)
    assert (reading.mem_pressure_some_avg10, reading.mem_pressure_full_avg10) == (12.5, 4.25)
    assert parse_pressure("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n") == {"some": 0.0}


def test_a_kernel_without_psi_is_no_error_and_a_bad_file_is(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    shutil.copytree(FAKE_PROC, proc)
    (proc / "pressure" / "memory").unlink()
    reading = HostProbe(proc).read(now=1.0)
    assert reading.state == "ok" and reading.mem_pressure_full_avg10 is None
    for bad in ("full avg10=high\n", "some total=3\n", "full avg10=140.0\n"):
        (proc / "pressure" / "memory").write_text(bad)
        reading = HostProbe(proc).read(now=1.0)
        assert reading.state == "error" and "pressure/memory" in (reading.error or ""), bad
        assert reading.mem_available_bytes is not None  # the rest still read
    with pytest.raises(ValueError, match="avg10"):
        parse_pressure("full avg10=nan?\n")


def test_the_real_proc_has_psi_or_says_nothing() -> None:
    reading = HostProbe("/proc").read(now=1.0)
    if Path("/proc/pressure/memory").exists():
        assert reading.mem_pressure_full_avg10 is not None
    else:
        assert reading.mem_pressure_full_avg10 is None
