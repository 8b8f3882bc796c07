"""Failover time of a controller pair: the leader SIGKILLed, then the
standby's first power command for a node that froze at the same moment.

The lab's cluster of real processes (agents, SSH banners, the SNMP PDU
stand-in), a real PostgreSQL server, and two ``spark-watchdog controller``
processes with the lab's short timings (lease 7 s, renewal 0.5 s, settle
0.5 s, freeze_after 3 s). Each run: a fresh database, A leads, B stands by,
A is killed and a node frozen together; the time to the first SET the PDU
receives for that node's outlet is the failover time. Then the node is
recovered, B stopped, the node thawed. Prints p50 / p95 / max against the
bound lease + renew_every + settle + freeze_after, and writes JSON.

    .venv/bin/python -m bench.failover --runs 20 --json-out docs/results/failover.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from spark_watchdog.lab.cluster import LabCluster
from spark_watchdog.lab.controller_pair import LEADERSHIP, ControllerPair, wait_for
from spark_watchdog.lab.hardware.postgres_server import ROLE, PostgresServer


def one_run(lab: LabCluster, server: PostgresServer, number: int, tmp: Path) -> float:
    name = f"failover_{number}"
    server.psql(f"CREATE DATABASE {name} OWNER {ROLE}")
    url = server.url.rsplit("/", 1)[0] + "/" + name
    run_dir = tmp / name
    run_dir.mkdir()
    pair = ControllerPair(lab, server, url, run_dir)
    node = lab.nodes[number % len(lab.nodes)]
    assert lab.pdu is not None
    pdu = lab.pdu.standin
    try:
        a = pair.start("a")
        wait_for(lambda: pair.leads("a", 1), 60, "a leading")
        pair.start("b")
        wait_for(lambda: pair.standing_by("b"), 60, "b standing by")
        before = len(pdu.sets_for(node.outlet))
        killed = time.monotonic()
        a.kill()
        lab.freeze(node)
        wait_for(lambda: len(pdu.sets_for(node.outlet)) > before, 90, "b's first command")
        first = pdu.sets_for(node.outlet)[before].at - killed
        resolved = lambda: any(  # noqa: E731
            i.kind == "host_frozen" and i.status == "resolved" for i in pair.store.list_incidents()
        )
        wait_for(resolved, 90, "the node recovered")
        return first
    finally:
        pair.close()
        lab.thaw(node)
        wait_for(lambda: all(lab.agent_state(n) for n in lab.nodes), 120, "agents back")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    bound = (
        LEADERSHIP["lease"] + LEADERSHIP["renew_every"] + LEADERSHIP["settle"] + 3.0
    )  # + freeze_after (the lab's detection)
    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="failover-") as scratch:
        tmp = Path(scratch)
        with LabCluster(tmp / "lab", size=2) as cluster, PostgresServer() as server:
            lab = cluster.serving()
            for number in range(1, args.runs + 1):
                took = one_run(lab, server, number, tmp)
                times.append(took)
                print(f"run {number:2d}: first command {took:5.1f}s after the kill", flush=True)
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    result = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "runs": len(times),
        "leadership": LEADERSHIP,
        "bound_s": bound,
        "p50_s": round(statistics.median(times), 2),
        "p95_s": round(p95, 2),
        "max_s": round(max(times), 2),
        "times_s": [round(t, 2) for t in times],
    }
    print(
        f"failover over {len(times)} runs: p50 {result['p50_s']}s, p95 {result['p95_s']}s, "
        f"max {result['max_s']}s (bound: lease + renew_every + settle + freeze_after = "
        f"{bound:g}s, plus banner checks and the poll)"
    )
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
