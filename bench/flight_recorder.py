"""What the flight recorder costs: memory per node, bytes per incident, time per sample.

A realistic agent snapshot (the shape of ``/v1/state``: host, GPU, vLLM,
memory guard) is noted once a second per node for ``--seconds`` (the
recorder's window), for ``--nodes`` nodes; tracemalloc measures what the
recorder holds, and one node's evidence is encoded as the history stores it.

    .venv/bin/python -m bench.flight_recorder --json-out docs/results/flight_recorder.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import tracemalloc
from pathlib import Path
from typing import Any

from spark_watchdog.controller.look.flight_recorder import FlightRecorder

GIB = 1024**3


def snapshot(t: int) -> dict[str, Any]:
    return {
        "probes": {
            "host": {
                "mem_available_bytes": 36 * GIB - t * 4096,
                "mem_pressure_full_avg10": 0.12,
            },
            "gpu": {
                "state": "ok",
                "devices": [{"power_w": 45.0 + (t % 7), "sm_clock_mhz": 2398}],
            },
            "vllm": {
                "state": "progressing",
                "running": 4 + t % 3,
                "waiting": t % 2,
                "engine_steps": 1_000_000 + t * 37,
            },
        },
        "memory_guard": {"state": "clear"},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    snapshots = [snapshot(t) for t in range(int(args.seconds) + 1)]
    names = [f"spark-{i}" for i in range(args.nodes)]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    recorder = FlightRecorder(args.seconds)
    for t, snap in enumerate(snapshots):
        for name in names:
            recorder.note(name, snap, 1_800_000_000.0 + t)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    # Timed again without tracemalloc, which slows every allocation.
    timed = FlightRecorder(args.seconds)
    began = time.perf_counter()
    for t, snap in enumerate(snapshots):
        for name in names:
            timed.note(name, snap, 1_800_000_000.0 + t)
    took = time.perf_counter() - began
    notes = len(snapshots) * len(names)
    evidence = json.dumps(recorder.evidence(names[0]), separators=(",", ":"))
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
        "nodes": args.nodes,
        "seconds": args.seconds,
        "samples_per_node": len(recorder.samples(names[0])),
        "bytes_held": held,
        "bytes_per_node": round(held / args.nodes),
        "evidence_bytes_per_incident": len(evidence),
        "note_us": round(took / notes * 1e6, 2),
        "sweep_share_ms_at_1000_nodes": round(took / notes * 1000 * 1000, 2),
    }
    print(
        f"{args.nodes} nodes x {result['samples_per_node']} samples: "
        f"{held / 1024**2:.1f} MiB held ({result['bytes_per_node']:,} B per node); "
        f"{result['evidence_bytes_per_incident']:,} B of evidence per incident; "
        f"{result['note_us']} us per sample ({result['sweep_share_ms_at_1000_nodes']} ms "
        "of each 1000-node sweep)"
    )
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
