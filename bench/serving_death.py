"""Serving death: from the kill of the head's rank to the verdict that starts its recovery.

A lab (the real agents and controller, production detection timings: agent
loop 1 s, vLLM scrape 2 s, ``dead_after`` 5 s, controller poll 1 s) whose
head rank is SIGKILLed, as the OOM killer or an operator's ``kill -9`` would:
its main process as this host numbers it, which for ``--serving docker``
ends the container (Docker's ``die`` event). Each repetition waits for the
incident the controller opens and its resolution, and reads from the
history:

- verdict: the incident's ``detected_at`` minus the kill (the goal: p95 ≤ 5 s);
- time to detect as recorded (``time_to_detect_s``), against the true one
  (the verdict above): the incident must count from the death, not from its
  own detection;
- which sign gave the verdict (the incident's first reason).

    .venv/bin/python -m bench.serving_death --serving process --repeat 20 \\
        --json-out docs/results/serving_death_process.json
    .venv/bin/python -m bench.serving_death --serving docker --repeat 20
    .venv/bin/python -m bench.serving_death --vllm real --repeat 10
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import requests

from bench.detection_latency import machine, percentiles, production_overrides
from bench.production import PRODUCTION_TIMINGS
from spark_watchdog.history.records import Incident
from spark_watchdog.lab.session import LabSession, LabTimeout

GOAL_P95_S = 5.0
RESOLVE_TIMEOUT_S = 300.0


@dataclass
class Death:
    pid: int | None = None
    kind: str | None = None
    resolution: str | None = None
    verdict_s: float | None = None  # kill -> detected_at
    recorded_ttd_s: float | None = None  # the incident's own time_to_detect_s
    reason: str | None = None
    error: str | None = None


def rank_pid(session: LabSession) -> int:
    """The head rank's main process, as its agent reports it (GET /v1/serving)."""
    head = session.lab.head
    answer = requests.get(f"{head.agent_url}/v1/serving", timeout=5).json()
    pid = answer.get("pid")
    if not isinstance(pid, int) or answer.get("state") != "running":
        raise LabTimeout(f"the head's rank is not running: {answer.get('state')}, pid {pid}")
    return pid


def kill_once(session: LabSession) -> Death:
    death = Death()
    store = session.store()
    before = {x.id for x in store.list_incidents()}
    try:
        death.pid = rank_pid(session)
        killed = time.time()
        os.kill(death.pid, signal.SIGKILL)
        incident = _await_resolution(session, before)
    except (LabTimeout, OSError, requests.RequestException, ValueError) as exc:
        death.error = str(exc)
        return death
    death.kind, death.resolution = incident.kind, incident.resolution
    death.verdict_s = round(incident.detected_at - killed, 3)
    ttd = incident.time_to_detect_s
    death.recorded_ttd_s = None if ttd is None else round(ttd, 3)
    reasons = incident.evidence.get("reasons")
    death.reason = str(reasons[0]) if isinstance(reasons, list) and reasons else None
    return death


def _await_resolution(session: LabSession, before: set[int]) -> Incident:
    found: list[Incident] = []

    def resolved() -> bool:
        new = [x for x in session.store().list_incidents() if x.id not in before]
        if new and all(x.status == "resolved" for x in new):
            found[:] = sorted(new, key=lambda x: x.id)
            return True
        return False

    session.wait_for(resolved, RESOLVE_TIMEOUT_S, "the incident to be resolved", interval=0.1)
    return found[0]


def overrides() -> dict[str, Any]:
    """Production, but for the serving restart budget (6 an hour): every kill restarts."""
    settings = production_overrides(2.0)
    settings["serving"]["restart_budget"] = 1000
    return settings


def run(args: argparse.Namespace, workdir: Path) -> list[Death]:
    session = LabSession(
        workdir,
        nodes=args.nodes,
        timings=PRODUCTION_TIMINGS,
        controller_overrides=overrides(),
        vllm=args.vllm,
        serving=args.serving,
    )
    deaths: list[Death] = []
    with session:
        for i in range(args.repeat):
            session.wait_healthy(timeout=600)
            time.sleep(3.0)  # settled: the probe has read the new rank since its start
            death = kill_once(session)
            deaths.append(death)
            _say(
                f"#{i + 1}: {death.kind} after {death.verdict_s}s (recorded time to detect "
                f"{death.recorded_ttd_s}s), {death.resolution}; {death.reason or death.error}"
            )
    return deaths


def summarize(deaths: list[Death]) -> dict[str, Any]:
    dead = [d for d in deaths if d.kind == "serving_dead" and d.verdict_s is not None]
    verdicts = percentiles([d.verdict_s for d in dead if d.verdict_s is not None])
    gaps = [
        abs(d.verdict_s - d.recorded_ttd_s)
        for d in dead
        if d.verdict_s is not None and d.recorded_ttd_s is not None
    ]
    p95 = verdicts["p95"]
    return {
        "repetitions": len(deaths),
        "serving_dead": len(dead),
        "recovered": sum(1 for d in dead if d.resolution == "recovered"),
        "other_kinds": sorted({d.kind for d in deaths if d.kind and d.kind != "serving_dead"}),
        "errors": [d.error for d in deaths if d.error],
        "verdict_s": verdicts,
        "recorded_time_to_detect_s": percentiles(
            [d.recorded_ttd_s for d in dead if d.recorded_ttd_s is not None]
        ),
        "time_to_detect_error_s": percentiles(gaps),
        "goal_p95_s": GOAL_P95_S,
        "goal_met": isinstance(p95, float) and p95 <= GOAL_P95_S and len(dead) == len(deaths),
        "signs": sorted({d.reason for d in dead if d.reason}),
    }


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serving", choices=("process", "docker"), default="process")
    parser.add_argument("--vllm", choices=("standin", "real"), default="standin")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.nodes < 1:
        parser.error("--repeat and --nodes must be at least 1")
    started = time.time()
    # A stop mid-run still takes the lab down (the with block's exit).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with tempfile.TemporaryDirectory(prefix="sw-bench-death-") as tmp:
        deaths = run(args, Path(tmp))
    summary = summarize(deaths)
    print(json.dumps(summary, indent=2))
    if args.json_out:
        document = {
            "benchmark": "serving_death",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(),
            "command": " ".join(["python -m bench.serving_death", *(argv or sys.argv[1:])]),
            "duration_s": round(time.time() - started, 1),
            "settings": {
                "serving": args.serving,
                "vllm": args.vllm,
                "nodes": args.nodes,
                "agent": asdict(PRODUCTION_TIMINGS),
                "dead_after": 5.0,
                **overrides(),
            },
            "summary": summary,
            "repetitions": [asdict(d) for d in deaths],
        }
        args.json_out.write_text(json.dumps(document, indent=2) + "\n")
    return 0 if summary["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
