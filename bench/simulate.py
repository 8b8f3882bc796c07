"""Long runs of the controller simulation: simulated node-hours per wall second, and violations.

Runs seeds in worker processes (one per core by default), each a 4-node
cluster under random faults for ``--minutes`` simulated minutes plus its
quiet tail (docs/simulation.md), until ``--node-hours`` simulated
node-hours are done. Prints progress every few seconds, then the figures;
any violation is printed with its seed, so ``simulate(seed)`` replays it.

    .venv/bin/python -m bench.simulate --node-hours 10000 --json-out docs/results/simulate.json

``--colocated``: the controllers on the Sparks themselves instead, 2 or 4 nodes
each (simulation/colocated.py), with their own figures: the controller
processes started, the freezes, the single ones recovered within their bound.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from spark_watchdog.simulation.colocated import simulate_colocated
from spark_watchdog.simulation.placed_report import PlacedReport
from spark_watchdog.simulation.run import Report, simulate

_MINUTES = 10.0
_COLOCATED = False


def _one(seed: int) -> Report:
    if _COLOCATED:
        return simulate_colocated(seed, _MINUTES)
    return simulate(seed, _MINUTES)


def _colocated_figures(runs: list[Report]) -> dict[str, Any]:
    """The figures of controllers on the Sparks: nodes, order, processes, freezes."""
    placed = [r for r in runs if isinstance(r, PlacedReport)]
    freezes: Counter[str] = Counter()
    worst = 0.0
    for report in placed:
        for key, value in report.freezes.items():
            if key == "worst_share_of_bound":
                worst = max(worst, value)
            else:
                freezes[key] += int(value)
    return {
        "two_node_runs": sum(1 for r in placed if r.nodes == 2),
        "four_node_runs": sum(1 for r in placed if r.nodes == 4),
        "runs_with_a_controller_on_every_node": sum(1 for r in placed if len(r.order) == r.nodes),
        "controller_processes": sum(r.processes for r in placed),
        "freezes": dict(freezes),
        "worst_share_of_bound": worst,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--node-hours", type=float, default=100.0, help="simulated node-hours")
    parser.add_argument("--minutes", type=float, default=10.0, help="fault minutes per run")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json-out", type=Path, help="write the figures as JSON here")
    parser.add_argument(
        "--colocated", action="store_true", help="the controllers on the Sparks themselves"
    )
    args = parser.parse_args(argv)
    if not args.node_hours > 0 or not args.minutes > 0 or args.workers < 1:
        parser.error("--node-hours and --minutes must be > 0, --workers >= 1")
    global _MINUTES, _COLOCATED
    _MINUTES, _COLOCATED = args.minutes, args.colocated
    started = time.monotonic()
    cpu_at_start = _cpu_s()
    hours = 0.0
    runs: list[Report] = []
    violations: list[str] = []
    faults: Counter[str] = Counter()
    last_line = started
    seed = args.first_seed
    with multiprocessing.get_context("fork").Pool(args.workers) as pool:
        while hours < args.node_hours:
            batch = range(seed, seed + 20 * args.workers)
            seed += len(batch)
            for report in pool.imap_unordered(_one, batch, chunksize=4):
                runs.append(report)
                hours += report.node_hours
                violations += report.violations
                faults.update(report.faults)
            now = time.monotonic()
            if now - last_line >= 5.0:
                last_line = now
                rate = hours / (now - started)
                print(
                    f"{hours:,.0f} / {args.node_hours:,.0f} node-hours, {len(runs)} runs, "
                    f"{rate:,.1f} node-hours/s, {len(violations)} violations",
                    file=sys.stderr,
                    flush=True,
                )
    wall = time.monotonic() - started
    cpu = _cpu_s() - cpu_at_start
    figures: dict[str, Any] = {
        "node_hours": round(hours, 1),
        "runs": len(runs),
        "seeds": [args.first_seed, seed - 1],
        "wall_s": round(wall, 1),
        "node_hours_per_wall_s": round(hours / wall, 2),
        "cpu_s": round(cpu, 1),  # every worker's, summed
        "workers": args.workers,
        "fault_minutes_per_run": args.minutes,
        "faults": dict(sorted(faults.items())),
        "power_commands": sum(r.commands for r in runs),
        "incidents": sum(r.incidents for r in runs),
        "recovered": sum(r.recovered for r in runs),
        "controller_crashes": sum(r.crashes for r in runs),
        "dry_run_runs": sum(1 for r in runs if r.dry_run),
        # Runs with a controller pair (simulation/pair.py), the leaderships
        # taken in them, and of those the ones taken after another had led.
        "pair_runs": sum(1 for r in runs if r.pair),
        "leaderships": sum(r.epochs for r in runs),
        "takeovers": sum(r.takeovers for r in runs),
        **(_colocated_figures(runs) if args.colocated else {}),
        "violations": violations,
        "machine": (
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
        ),
    }
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json_out is not None:
        args.json_out.write_text(text + "\n")
    return 1 if violations else 0


def _cpu_s() -> float:
    """CPU seconds of this process and of its ended children (the pool's workers)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


if __name__ == "__main__":
    sys.exit(main())
