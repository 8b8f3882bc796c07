"""The flight recorder keeps each node's last seconds, compactly, tolerates any
snapshot, and ``show`` draws what it kept."""

from __future__ import annotations

from typing import Any

from spark_watchdog.cli.flight_view import render, sparkline
from spark_watchdog.controller.look.flight_recorder import FIELDS, FlightRecorder, sample_of

GIB = 1024**3


def _snapshot(available: int, steps: int, gpu: str = "ok", power: float = 45.0) -> dict[str, Any]:
    return {
        "probes": {
            "host": {"mem_available_bytes": available, "mem_pressure_full_avg10": 0.5},
            "gpu": {"state": gpu, "devices": [{"power_w": power, "sm_clock_mhz": 2398}]},
            "vllm": {"state": "progressing", "running": 3, "waiting": 0, "engine_steps": steps},
        },
        "memory_guard": {"state": "clear"},
    }


def test_it_keeps_the_last_seconds_per_node_only() -> None:
    recorder = FlightRecorder(10.0)
    for t in range(30):
        recorder.note("spark-1", _snapshot(40 * GIB - t * GIB, t * 10), 1000.0 + t)
    recorder.note("spark-2", _snapshot(GIB, 0), 1029.0)
    kept = recorder.samples("spark-1")
    assert [s[0] for s in kept] == [1000.0 + t for t in range(19, 30)]
    assert len(kept[0]) == len(FIELDS)
    evidence = recorder.evidence("spark-1")
    assert evidence["fields"] == list(FIELDS) and len(evidence["samples"]) == 11
    assert recorder.evidence("spark-9")["samples"] == []
    off = FlightRecorder(0.0)
    off.note("spark-1", _snapshot(GIB, 0), 1.0)
    assert off.samples("spark-1") == []


def test_a_malformed_snapshot_is_a_sample_of_nothing() -> None:
    bad: object
    for bad in (
        {},
        {"probes": []},
        {"probes": {"host": {"mem_available_bytes": "lots"}}},
        {"probes": {"gpu": {"devices": ["x"], "state": True}}},
    ):
        sample = sample_of(bad, 5.0)
        assert sample[0] == 5.0 and all(v is None for v in sample[1:]), bad
    long = sample_of({"probes": {"vllm": {"state": "x" * 500}}}, 1.0)
    assert len(long[FIELDS.index("vllm_state")]) == 32


def test_show_draws_the_fall_and_the_state_changes() -> None:
    recorder = FlightRecorder(120.0)
    for t in range(60):
        gpu = "timeout" if t >= 50 else "ok"
        recorder.note("spark-2", _snapshot(36 * GIB - t * GIB // 2, t * 7, gpu), 2000.0 + t)
    lines = render(recorder.evidence("spark-2"), detected_at=2060.0)
    assert lines[0].startswith("flight recorder (spark-2: 60 samples from -60s to -1s")
    mem = next(line for line in lines if "MemAvailable GiB" in line)
    assert "36 → 6.5" in mem and "█" in mem and "▁" in mem
    assert any("engine steps/s" in line for line in lines)
    gpu = next(line for line in lines if line.strip().startswith("gpu "))
    assert "ok (-60s) → timeout (-10s)" in gpu
    assert render({"fields": list(FIELDS), "samples": []}, 0.0) == []
    assert render({"samples": "nope"}, 0.0) == []


def test_sparkline_buckets_and_gaps() -> None:
    assert sparkline([1.0, 2.0, 3.0]) == "▁▅█"
    assert sparkline([5.0, 5.0]) == "▁▁"
    assert sparkline([None, 1.0]) == " ▁"
    assert len(sparkline([float(i) for i in range(600)], width=60)) == 60
    assert sparkline([]) == ""
