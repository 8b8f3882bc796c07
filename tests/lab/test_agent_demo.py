"""The quick start's main job: the agent demo passes end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.integration
def test_agent_demo_catches_wedge_crash_and_restart() -> None:
    demo = ["lab", "agent-demo", "--json", "--stall-after", "3"]
    result = subprocess.run(
        [sys.executable, "-m", "spark_watchdog", *demo],
        capture_output=True,
        text=True,
        timeout=180,
    )
    report = json.loads(result.stdout)
    failed = [step for step in report["steps"] if not step["ok"]]
    assert result.returncode == 0, (failed, result.stderr[-2000:])
    assert report["passed"] is True
    names = [step["name"] for step in report["steps"]]
    assert "agent says stalled (stall_after 3s)" in names
    assert "SIGTERM: STOPPING=1 and exit 0" in names
    stalled = next(s for s in report["steps"] if s["name"].startswith("agent says stalled"))
    # Detection needs stall_after plus at most a scrape interval or two.
    assert 3.0 <= stalled["seconds"] < 3.0 + 5.0


def test_bad_stall_after_is_a_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "spark_watchdog", "lab", "agent-demo", "--stall-after", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--stall-after: expected seconds between 1 and 120" in result.stderr
