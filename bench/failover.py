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
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from spark_watchdog.history.leadership import current
from spark_watchdog.history.postgres import PostgresHistoryStore
from spark_watchdog.lab.cluster import LabCluster
from spark_watchdog.lab.hardware.postgres_server import ROLE, PostgresServer

LEADERSHIP = {
    "lease": 7.0,
    "renew_every": 0.5,
    "give_up_after": 1.5,
    "send_deadline": 2.0,
    "settle": 0.5,
}


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}")


def _start(lab: LabCluster, server: PostgresServer, url: str, tmp: Path, name: str) -> Any:
    config: dict[str, Any] = lab.controller_config(Path("unused"), leadership=LEADERSHIP)
    config["history"] = url
    config["history_password_file"] = str(server.password_file)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    log = (tmp / f"{name}.log").open("wb")
    return subprocess.Popen(
        [sys.executable, "-m", "spark_watchdog", "controller", "--config", str(path)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def _leads(store: PostgresHistoryStore, pid: int, epoch: int) -> bool:
    leader = current(store)
    return (
        leader is not None
        and not leader.expired
        and leader.epoch == epoch
        and leader.holder.split(":")[1] == str(pid)
    )


def one_run(lab: LabCluster, server: PostgresServer, number: int, tmp: Path) -> float:
    name = f"failover_{number}"
    server.psql(f"CREATE DATABASE {name} OWNER {ROLE}")
    url = server.url.rsplit("/", 1)[0] + "/" + name
    store = PostgresHistoryStore(url, password_file=str(server.password_file))
    a = _start(lab, server, url, tmp, f"a{number}")
    b = None
    node = lab.nodes[number % len(lab.nodes)]
    try:
        _wait(lambda: _leads(store, a.pid, 1), 60, "a leading")
        b = _start(lab, server, url, tmp, f"b{number}")
        _wait(lambda: "standby:" in (tmp / f"b{number}.log").read_text(), 60, "b standing by")
        assert lab.pdu is not None
        before = len(lab.pdu.standin.sets_for(node.outlet))
        killed = time.monotonic()
        a.kill()
        lab.freeze(node)
        _wait(lambda: len(lab.pdu.standin.sets_for(node.outlet)) > before, 90, "b's first command")
        first = lab.pdu.standin.sets_for(node.outlet)[before].at - killed
        resolved = lambda: any(  # noqa: E731
            i.kind == "host_frozen" and i.status == "resolved" for i in store.list_incidents()
        )
        _wait(resolved, 90, "the node recovered")
        return first
    finally:
        for process in (a, b):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
        store.close()
        lab.thaw(node)
        _wait(lambda: all(lab.agent_state(n) for n in lab.nodes), 120, "agents back")


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
        lab = LabCluster(tmp / "lab", size=2).start()
        try:
            lab.wait_agents()
            lab.start_serving()
            with PostgresServer() as server:
                for number in range(1, args.runs + 1):
                    took = one_run(lab, server, number, tmp)
                    times.append(took)
                    print(f"run {number:2d}: first command {took:5.1f}s after the kill", flush=True)
        finally:
            lab.stop()
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
