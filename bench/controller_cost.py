"""The controller's own cost at defaults, 4 nodes: CPU and RSS of its process.

A controller that runs on a Spark beside the vLLM rank must stay light: at
most 1 % of one core and 80 MB RSS at its defaults for 4 nodes (issue 49).
The bench starts the lab's 4 simulated Sparks (real process trees: the real
agent at its production intervals, an SSH banner, the vLLM stand-in; the APC
stand-in over real SNMP) and the real controller as its own process, exactly
as deployed (``python -m spark_watchdog controller --config FILE``), with
every production detection, power, guard and serving default. It lets the
cluster settle, then reads the controller's process from outside (psutil):
CPU time over ``--seconds`` (its children's too, those reaped included) and
RSS sampled each second (the largest seen). Prometheus scrapes its
``/metrics`` every ``--scrape`` seconds meanwhile. The agents, the stand-ins
and this script run beside it and are not counted.

    .venv/bin/python -m bench.controller_cost --seconds 60 --json docs/results/controller_cost.json

``--overrides FILE`` merges a YAML mapping into the controller's config,
section by section (e.g. a ``colocated:`` section). Exit status 1 when a
budget is not met. Figures: docs/benchmarks.md, "The controller beside the rank".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import requests
import yaml

from bench.detection_latency import machine
from bench.production import PRODUCTION_TIMINGS, production_settings
from spark_watchdog import __version__
from spark_watchdog.lab.session import LabSession

NODES = 4
GOAL_CPU_PCT = 1.0  # of one core
GOAL_RSS_MB = 80.0
SAMPLE_EVERY_S = 1.0


def cpu_seconds(process: psutil.Process) -> float:
    """User and system time of the process and of its children it has reaped."""
    t = process.cpu_times()
    return float(t.user + t.system + t.children_user + t.children_system)


def tree_rss_mb(process: psutil.Process) -> tuple[float, float]:
    """RSS of the process and, summed, of its live children (MB)."""
    own = process.memory_info().rss / 1e6
    children = 0.0
    for child in process.children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a child gone since the listing
            children += child.memory_info().rss / 1e6
    return own, children


def _listens_on(process: psutil.Process, port: int) -> bool:
    """The answers come from this controller: benches run side by side may race
    for a free port."""
    # net_connections since psutil 6; connections before (Debian 12 ships 5.9).
    listing = getattr(process, "net_connections", None) or process.connections
    return any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in listing("tcp"))


def measure(process: psutil.Process, url: str, seconds: float, scrape: float) -> dict[str, Any]:
    """The controller's CPU and RSS over ``seconds``, read from outside."""
    session = requests.Session()
    own: list[float] = []
    children: list[float] = []
    scrapes = scrape_failures = 0
    wall0 = time.monotonic()
    cpu0 = cpu_seconds(process)
    next_scrape = wall0 + scrape if scrape > 0 else float("inf")
    next_sample = wall0
    while (now := time.monotonic()) - wall0 < seconds:
        if now >= next_scrape:
            try:
                scrapes += session.get(f"{url}/metrics", timeout=5).ok
            except requests.RequestException:
                scrape_failures += 1
            next_scrape += scrape
        a, b = tree_rss_mb(process)
        own.append(a)
        children.append(b)
        next_sample += SAMPLE_EVERY_S
        time.sleep(max(0.0, min(next_sample, next_scrape) - time.monotonic()))
    wall = time.monotonic() - wall0
    cpu = (cpu_seconds(process) - cpu0) / wall * 100
    totals = [a + b for a, b in zip(own, children, strict=True)]
    session.close()
    return {
        "measured_s": round(wall, 1),
        "cpu_pct_of_one_core": round(cpu, 3),
        "rss_mb": {"max": round(max(own), 1), "mean": round(statistics.fmean(own), 1)},
        "children_rss_mb_max": round(max(children), 1),
        "rss_with_children_mb_max": round(max(totals), 1),
        "rss_samples": len(own),
        "metrics_scrapes": scrapes,
        "metrics_scrape_failures": scrape_failures,
    }


def verdict(figures: dict[str, Any]) -> dict[str, Any]:
    """Against the budget; RSS counts the controller's children with it."""
    cpu = figures["cpu_pct_of_one_core"]
    rss = figures["rss_with_children_mb_max"]
    return {
        "cpu_pct": GOAL_CPU_PCT,
        "rss_mb": GOAL_RSS_MB,
        "cpu_met": cpu <= GOAL_CPU_PCT,
        "rss_met": rss <= GOAL_RSS_MB,
        "met": cpu <= GOAL_CPU_PCT and rss <= GOAL_RSS_MB,
    }


def run(seconds: float, settle: float, scrape: float, overrides: dict[str, Any]) -> dict[str, Any]:
    settings: dict[str, Any] = production_settings()
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(settings.get(key), dict):
            settings[key] = {**settings[key], **value}
        else:
            settings[key] = value
    with tempfile.TemporaryDirectory(prefix="sw-bench-controller-cost-") as tmp:
        session = LabSession(
            Path(tmp),
            nodes=NODES,
            timings=PRODUCTION_TIMINGS,
            controller_mode="process",
            controller_overrides=settings,
        )
        with session:
            controller = session.controller
            pid = getattr(controller, "pid", None)
            assert controller is not None and pid is not None
            process = psutil.Process(pid)
            if not _listens_on(process, controller.config.listen.port):
                raise SystemExit("bench: the controller's port answers for another; run again")
            session.wait_healthy(timeout=120)
            time.sleep(settle)
            ticks0 = (session.status() or {}).get("ticks", 0)
            figures = measure(process, controller.url, seconds, scrape)
            status = session.status() or {}
    verdicts: dict[str, int] = {}
    for node in status.get("nodes", []):
        verdicts[str(node.get("verdict"))] = verdicts.get(str(node.get("verdict")), 0) + 1
    return {
        "benchmark": "controller_cost",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "version": __version__,
        "nodes": NODES,
        "settle_s": settle,
        "scrape_every_s": scrape,
        "settings": settings,
        **figures,
        "ticks": int(status.get("ticks", 0)) - int(ticks0),
        "verdicts_at_end": verdicts,
        "goals": verdict(figures),
    }


def render(result: dict[str, Any]) -> str:
    goals = result["goals"]
    rows = [
        ("measured", f"{result['measured_s']} s after {result['settle_s']:g} s settling"),
        ("controller CPU", f"{result['cpu_pct_of_one_core']:.3f} % of one core"),
        ("controller RSS max / mean", "{max} / {mean} MB".format(**result["rss_mb"])),
        ("with its children, RSS max", f"{result['rss_with_children_mb_max']} MB"),
        ("sweeps (ticks)", str(result["ticks"])),
        (
            "/metrics scrapes (failed)",
            f"{result['metrics_scrapes']} ({result['metrics_scrape_failures']})",
        ),
        (
            "verdicts at the end",
            ", ".join(f"{k} {v}" for k, v in result["verdicts_at_end"].items()),
        ),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    lines.append(
        f"{'PASS' if goals['met'] else 'FAIL'}: CPU ≤ {goals['cpu_pct']:g} % of a core "
        f"{'met' if goals['cpu_met'] else 'NOT met'}; RSS ≤ {goals['rss_mb']:g} MB "
        f"{'met' if goals['rss_met'] else 'NOT met'}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="seconds measured (60)")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds before (15)")
    parser.add_argument(
        "--scrape", type=float, default=15.0, help="/metrics every so many seconds (0: none)"
    )
    parser.add_argument("--overrides", type=Path, help="YAML merged into the controller config")
    parser.add_argument("--json", type=Path, help="write the figures here as JSON ('-': stdout)")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    overrides = yaml.safe_load(args.overrides.read_text()) if args.overrides else {}
    if not isinstance(overrides, dict):
        parser.error("--overrides: expected a mapping of config sections")
    result = run(args.seconds, args.settle, args.scrape, overrides)
    if args.json is not None and str(args.json) == "-":
        print(json.dumps(result, indent=2))
    else:
        print(render(result))
        if args.json is not None:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["goals"]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
