"""``spark-watchdog lab demo``: the whole story on one machine, told as it happens.

Four simulated DGX Sparks serve with the configuration that freezes GB10
hosts (adaptive verification on, cudagraph_mode FULL_AND_PIECEWISE). One of
them hits an illegal memory access: Xid 31 reaches its journal, then the
whole host freezes. The real controller notices, cuts power through the
PDU outlet and restores it, waits for a new boot, restarts serving on every
node with the safe profile, and records all of it. Every line of the
timeline is read from the controller's history and status as it happens
(:mod:`spark_watchdog.lab.timeline`); lines marked ``[lab]`` are what the
simulated hardware did.

The history database stays behind, at a path the demo prints, for
``spark-watchdog history --db PATH`` and ``show 1 --db PATH``. Exit 0 only
when the story ended in ``recovered`` with nothing done to a healthy node.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from spark_watchdog.lab.stories.scenario_kit import ScenarioResult
from spark_watchdog.lab.stories.scenarios import run_scenario
from spark_watchdog.lab.timeline import Narrator

FROZEN_NODE = "spark-3"


def _intro(nodes: int, workdir: Path) -> list[str]:
    return [
        "spark-watchdog lab demo: a simulated DGX Spark cluster on this machine",
        f"  {nodes} nodes, each its own process tree: the real agent, an SSH banner, a vLLM rank",
        "  launched by the agent, NVML and a journal; an SNMP PDU (APC rPDU2) powers them and",
        "  the real controller watches. Timings are short (freeze_after 3s, power off 2s)",
        "  but keep production's ratios. Lines marked [lab] are the simulated hardware.",
        f"  lab directory: {workdir}",
        "",
    ]


def _outro(result: ScenarioResult, history: Path, node: str) -> list[str]:
    lines = [""]
    if result.outcome == "recovered":
        lines.append(
            f"the story ended in recovered: detected {result.detected_after_s:.1f}s after "
            f"the freeze, recovered {result.recovered_after_s or 0:.1f}s after it"
        )
    else:
        lines.append(f"the story did NOT end in recovered: {result.outcome}")
    healthy = [n for n in result.pdu_commands if node not in n]
    lines.append(
        f"  the PDU received: {', '.join(result.pdu_commands) or 'nothing'}"
        + ("" if healthy else " (nothing for the healthy nodes)")
    )
    for problem in result.problems:
        lines.append(f"  PROBLEM: {problem}")
    lines += [
        "",
        f"history database: {history}",
        f"  spark-watchdog history --db {history}",
        f"  spark-watchdog show 1 --db {history}",
        f"  spark-watchdog boots {node} --db {history}",
    ]
    return lines


def run_demo(
    workdir: Path,
    *,
    nodes: int = 4,
    as_json: bool = False,
    vllm: str = "standin",
    serving: str = "process",
) -> int:
    # With --json, stdout carries the JSON only; the story goes to stderr.
    stream = sys.stderr if as_json else sys.stdout

    def echo(line: str) -> None:
        print(line, file=stream, flush=True)

    for line in _intro(nodes, workdir):
        echo(line)
    narrator = Narrator(echo=echo)
    node = FROZEN_NODE if nodes >= 3 else f"spark-{nodes}"
    result = run_scenario(
        "freeze",
        workdir=workdir,
        nodes=nodes,
        narrator=narrator,
        node=node,
        vllm=vllm,
        serving=serving,
    )
    history = workdir / "history.db"
    for line in _outro(result, history, node):
        echo(line)
    if as_json:
        print(json.dumps(summary(result, history, workdir, narrator.lines), indent=2))
    return 0 if result.outcome == "recovered" and result.ok else 1


def summary(
    result: ScenarioResult, history: Path, workdir: Path, timeline: list[str]
) -> dict[str, Any]:
    return {
        "outcome": result.outcome,
        "ok": result.ok and result.outcome == "recovered",
        "history": str(history),
        "lab_directory": str(workdir),
        "scenario": result.to_json(),
        "timeline": timeline,
    }
