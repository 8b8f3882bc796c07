"""Detection latency and recovery overhead, in the lab, with production thresholds.

One lab per fault (4 simulated Sparks, the real controller, the APC stand-in
over real SNMP). The agents run with their production intervals (loop 1 s,
vLLM scrape 2 s, stall_after 15 s, GPU 2 s) and the controller with its
production detection settings (poll 1 s, agent timeout 0.8 s, freeze_after
8 s, 2 banner misses of 2 s, late banner checks every 2 s) and production
power timing (readback poll 1 s, 2 s between commands). Some settings are not
production, to fit 20 repetitions in a run, and none is on the detection
path of an isolated fault: the off hold (``--off-seconds``, production 60 s;
a plain sleep, reported as its own share), the per-node and cluster budgets
(raised so that 20 cycles are allowed; production 3 per node and 8 per
cluster in 6 h), and the serving restart cooldown (5 s; production 60 s, so
that a fault that returns within a minute of a restart waits for it).

Each repetition injects the fault, waits until the controller has resolved
the incident it opened and every node is healthy again, and reads the
incident's recorded steps from the history:

- verdict: incident opened (``detected_at``) minus fault onset;
- first action: the first power SET (``off_requested``) for ``freeze``, the
  serving restart (``serving_restart_started``) for ``wedge`` and ``crash``;
- for ``freeze``, time to recover split into off hold, boot (power verified
  on to the new boot id seen), serving start, and the watchdog's own share
  (the rest, beyond detection: decisions, PDU switching with read-back,
  waits for the next poll).

    .venv/bin/python -m bench.detection_latency --faults freeze wedge crash --repeat 20 \\
        --json-out docs/results/detection_latency.json

``--peers`` (root) puts the nodes in network namespaces with a management
link and a fabric (``lab up --netns``): the agents pulse each other over the
fabric at the production interval, the controller weighs what they saw, and
the head's stand-in engine steps only while every rank answers it there, so
its steps are life for the workers too (``serving.step_group``). A freeze
must still be called within the same goal (docs/design.md, "Peers").

``--cpu-hog`` runs it beside a rank loading every core: one busy process per
core at normal priority, and the controller as its own process at the nice
value of its unit (``Nice=``, systemd/spark-watchdog-controller.service), as a
controller on a Spark runs beside its vLLM rank. A freeze must still be
called within the same goal: docs/benchmarks.md, "The controller beside the rank".

    .venv/bin/python -m bench.detection_latency --faults freeze --repeat 5 --cpu-hog
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

from bench._beside_rank import RankLoad
from bench.production import PRODUCTION_TIMINGS, production_settings
from spark_watchdog.history.records import Incident, IncidentStep
from spark_watchdog.lab.session import LabSession, LabTimeout

KINDS = {"freeze": "host_frozen", "wedge": "serving_stalled", "crash": "serving_dead"}
FIRST_ACTION = {"freeze": "off_requested", "wedge": "serving_restart_started"}
GOALS = {"host_frozen": 10.0, "serving_stalled": 25.0}
RESOLVE_TIMEOUT_S = 180.0
SERVING_COOLDOWN_S = 5.0


@dataclass
class Repetition:
    fault: str
    node: str
    incident_id: int | None = None
    kind: str | None = None
    resolution: str | None = None
    verdict_s: float | None = None
    first_action_s: float | None = None
    recovered_s: float | None = None
    split: dict[str, float] = field(default_factory=dict)
    # Every recorded step, seconds after fault onset.
    steps: list[tuple[str, float]] = field(default_factory=list)
    error: str | None = None


def production_overrides(off_seconds: float) -> dict[str, Any]:
    """Production settings, but for what makes 20 repetitions fit in one run."""
    settings = production_settings()
    settings["policy"]["power_off_seconds"] = off_seconds
    settings["guards"].update(node_budget=1000, cluster_budget=1000, boot_timeout=120.0)
    # Production 60 s: a serving fault within a minute of the last restart
    # waits for it. Not on the path of an isolated fault's detection.
    settings["serving"]["restart_cooldown"] = SERVING_COOLDOWN_S
    return settings


def _first(steps: list[IncidentStep], name: str) -> float | None:
    return next((s.at for s in steps if s.step == name), None)


def recovery_split(incident: Incident, steps: list[IncidentStep], onset: float) -> dict[str, float]:
    """Where the time to recover went (seconds), from the recorded steps."""
    at = {name: _first(steps, name) for name in _SPLIT_STEPS}
    if incident.resolved_at is None or any(v is None for v in at.values()):
        return {}
    t = {k: float(v) for k, v in at.items() if v is not None}
    total = incident.resolved_at - onset
    detection = incident.detected_at - onset
    off_hold = t["on_requested"] - t["off_verified"]
    boot = t["new_boot_seen"] - t["on_verified"]
    serving = t["serving_restart_done"] - t["serving_restart_started"]
    switching = (t["off_verified"] - t["off_requested"]) + (t["on_verified"] - t["on_requested"])
    return {
        "total": total,
        "detection": detection,
        "off_hold": off_hold,
        "boot": boot,
        "serving_start": serving,
        "watchdog_beyond_detection": total - detection - off_hold - boot - serving,
        "of_which_pdu_switching": switching,
        "of_which_decision": t["off_requested"] - incident.detected_at,
    }


_SPLIT_STEPS = (
    "off_requested",
    "off_verified",
    "on_requested",
    "on_verified",
    "new_boot_seen",
    "serving_restart_started",
    "serving_restart_done",
)


def run_fault(
    fault: str,
    repeat: int,
    off_seconds: float,
    workdir: Path,
    peers: bool = False,
    load: RankLoad | None = None,
) -> list[Repetition]:
    """``load``: the controller as its own process at its unit's weight, every
    core loaded beside it (``--cpu-hog``)."""
    session = LabSession(
        workdir / fault,
        nodes=4,
        timings=PRODUCTION_TIMINGS,
        controller_overrides=production_overrides(off_seconds),
        netns=peers,
        controller_mode="thread" if load is None else "process",
    )
    reps: list[Repetition] = []
    with session, _beside(session, load):
        lab = session.lab
        for i in range(repeat):
            session.wait_healthy(timeout=120)
            time.sleep(2.0)  # a settled cluster: every agent polled since the last boot
            store = session.store()
            before = {x.id for x in store.list_incidents()}
            node = lab.nodes[1 + i % 3] if fault == "freeze" else lab.head
            rep = Repetition(fault, node.name)
            lab.inject(fault, node if fault == "freeze" else None)
            onset = time.time()
            try:
                incident = _await_resolution(session, before)
            except LabTimeout as exc:
                rep.error = str(exc)
                reps.append(rep)
                _say(f"{fault} #{i + 1}: {exc}")
                lab.heal()
                continue
            steps = store.steps(incident.id)
            rep.incident_id, rep.kind = incident.id, incident.kind
            rep.resolution = incident.resolution
            rep.verdict_s = incident.detected_at - onset
            rep.steps = [(s.step, round(s.at - onset, 3)) for s in steps]
            action = _first(steps, FIRST_ACTION.get(fault, "serving_restart_started"))
            rep.first_action_s = None if action is None else action - onset
            if incident.resolved_at is not None:
                rep.recovered_s = incident.resolved_at - onset
            if fault == "freeze":
                rep.split = recovery_split(incident, steps, onset)
            reps.append(rep)
            _say(
                f"{fault} #{i + 1} on {node.name}: {incident.kind} after {rep.verdict_s:.2f}s, "
                f"first action {_fmt(rep.first_action_s)}, {incident.resolution} after "
                f"{_fmt(rep.recovered_s)}"
            )
    return reps


def _beside(session: LabSession, load: RankLoad | None) -> contextlib.AbstractContextManager[Any]:
    if load is None:
        return contextlib.nullcontext()
    return load.beside(getattr(session.controller, "pid", None))


def _await_resolution(session: LabSession, before: set[int]) -> Incident:
    found: list[Incident] = []

    def resolved() -> bool:
        new = [x for x in session.store().list_incidents() if x.id not in before]
        done = [x for x in new if x.status == "resolved"]
        if new and len(done) == len(new):
            found[:] = sorted(done, key=lambda x: x.id)
            return True
        return False

    session.wait_for(resolved, RESOLVE_TIMEOUT_S, "the incident to be resolved", interval=0.1)
    return found[0]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    ordered = sorted(values)
    # Nearest-rank p95: with 20 samples, the 19th.
    rank = max(1, -(-95 * len(ordered) // 100))
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 3),
        "p95": round(ordered[rank - 1], 3),
        "max": round(ordered[-1], 3),
    }


def summarize(reps: list[Repetition]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for fault in dict.fromkeys(r.fault for r in reps):
        mine = [r for r in reps if r.fault == fault]
        kind = KINDS[fault]
        verdicts = [r.verdict_s for r in mine if r.verdict_s is not None and r.kind == kind]
        entry: dict[str, Any] = {
            "kind": kind,
            "repetitions": len(mine),
            "as_expected": sum(1 for r in mine if r.kind == kind and r.resolution == "recovered"),
            "errors": [r.error for r in mine if r.error],
            "other_kinds": sorted({r.kind for r in mine if r.kind and r.kind != kind}),
            "verdict_s": percentiles(verdicts),
            "first_action_s": percentiles([r.first_action_s for r in mine if r.first_action_s]),
            "recovered_s": percentiles([r.recovered_s for r in mine if r.recovered_s]),
        }
        goal = GOALS.get(kind)
        if goal is not None:
            p95 = entry["verdict_s"]["p95"]
            entry["goal_p95_s"] = goal
            entry["goal_met"] = p95 is not None and p95 <= goal and not entry["errors"]
        splits = [r.split for r in mine if r.split]
        if splits:
            entry["split_s"] = {part: percentiles([s[part] for s in splits]) for part in splits[0]}
            share = entry["split_s"]["watchdog_beyond_detection"]["p95"]
            entry["watchdog_share_goal_s"] = 5.0
            entry["watchdog_share_goal_met"] = share is not None and share <= 5.0
        summary[fault] = entry
    return summary


def print_tables(summary: dict[str, Any]) -> None:
    print("fault   verdict            n   p50     p95     max     first action p50/p95/max   goal")
    for fault, e in summary.items():
        v, a = e["verdict_s"], e["first_action_s"]
        goal = (
            f"p95 <= {e['goal_p95_s']:g}s: {'met' if e['goal_met'] else 'NOT met'}"
            if "goal_p95_s" in e
            else "-"
        )
        print(
            f"{fault:<7} {e['kind']:<18} {v['n']:<3} {v['p50']!s:<7} {v['p95']!s:<7} "
            f"{v['max']!s:<7} {a['p50']!s}/{a['p95']!s}/{a['max']!s}   {goal}"
        )
    for fault, e in summary.items():
        if "split_s" not in e:
            continue
        print(f"\n{fault}: time to recover, split (s)    p50     p95     max")
        for part, p in e["split_s"].items():
            print(f"  {part:<32} {p['p50']!s:<7} {p['p95']!s:<7} {p['max']!s}")


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": psutil.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", nargs="+", choices=sorted(KINDS), default=list(KINDS))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--off-seconds", type=float, default=2.0, help="off hold (prod. 60)")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="nodes in network namespaces with a fabric: agents pulse their peers, the head's "
        "engine needs every rank (root)",
    )
    parser.add_argument(
        "--cpu-hog",
        action="store_true",
        help="load every core with a busy process (the rank) and run the controller as its "
        "own process at its unit's Nice=",
    )
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    started = time.time()
    reps: list[Repetition] = []
    load = RankLoad() if args.cpu_hog else None
    with tempfile.TemporaryDirectory(prefix="sw-bench-detect-") as tmp:
        for fault in args.faults:
            reps += run_fault(fault, args.repeat, args.off_seconds, Path(tmp), args.peers, load)
    summary = summarize(reps)
    print_tables(summary)
    if load is not None:
        print(f"\n{load.describe()}")
    if args.json_out:
        document = {
            "benchmark": "detection_latency",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(),
            "command": " ".join(["python -m bench.detection_latency", *(argv or sys.argv[1:])]),
            "duration_s": round(time.time() - started, 1),
            "settings": {
                "peers": args.peers,
                **({} if load is None else {"cpu_hog": load.settings()}),
                "agent": asdict(PRODUCTION_TIMINGS),
                **production_overrides(args.off_seconds),
            },
            "summary": summary,
            "repetitions": [asdict(r) for r in reps],
        }
        args.json_out.write_text(json.dumps(document, indent=2) + "\n")
    failed = any(e["errors"] for e in summary.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
