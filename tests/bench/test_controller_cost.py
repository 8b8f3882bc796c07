"""The controller cost bench's own reading: CPU time of a process with the
children it reaped, and the verdict against the budget."""

from __future__ import annotations

import subprocess
import sys

import psutil
import pytest

from bench.controller_cost import cpu_seconds, render, verdict


def test_the_cost_counts_children_the_controller_reaped() -> None:
    me = psutil.Process()
    before = cpu_seconds(me)
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert cpu_seconds(me) - before >= 0.25


@pytest.mark.parametrize(
    ("cpu", "rss", "line"),
    [
        (0.4, 36.0, "PASS: CPU ≤ 1 % of a core met; RSS ≤ 80 MB met"),
        (1.2, 36.0, "FAIL: CPU ≤ 1 % of a core NOT met; RSS ≤ 80 MB met"),
        (0.4, 81.0, "FAIL: CPU ≤ 1 % of a core met; RSS ≤ 80 MB NOT met"),
    ],
)
def test_the_cost_bench_judges_the_budget(cpu: float, rss: float, line: str) -> None:
    figures = {
        "measured_s": 60.0,
        "cpu_pct_of_one_core": cpu,
        "rss_mb": {"max": rss - 1, "mean": rss - 2},
        "rss_with_children_mb_max": rss,  # the children count against it
        "metrics_scrapes": 4,
        "metrics_scrape_failures": 0,
    }
    result = {
        **figures,
        "settle_s": 15.0,
        "ticks": 60,
        "verdicts_at_end": {"healthy": 4},
        "goals": verdict(figures),
    }
    assert render(result).splitlines()[-1] == line
