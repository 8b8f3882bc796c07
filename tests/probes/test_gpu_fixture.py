"""Real GPU answers, captured with ``spark-watchdog probe gpu --json`` on real machines.

Each ``tests/fixtures/gpu/*.json`` is one capture. It must parse, survive a
round trip without losing a key, and show at least one GPU read for real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.probes.gpu import GpuReading

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu"
CAPTURES = sorted(FIXTURES.glob("*.json"))


@pytest.mark.skipif(not CAPTURES, reason=f"no captured GPU readings in {FIXTURES}")
@pytest.mark.parametrize("capture", CAPTURES, ids=[path.name for path in CAPTURES])
def test_a_captured_reading_parses_and_round_trips(capture: Path) -> None:
    payload: dict[str, Any] = json.loads(capture.read_text())
    reading = GpuReading.from_json(payload)
    assert reading.state == "ok", reading.error
    assert reading.devices
    for device in reading.devices:
        assert device.name, device
        assert device.uuid, device
        assert device.power_w is not None, device
    assert GpuReading.from_json(reading.to_json()) == reading
    rendered = reading.to_json()
    assert {key: rendered.get(key) for key in payload} == payload  # nothing dropped or changed
