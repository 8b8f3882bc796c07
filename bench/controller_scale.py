"""How many nodes one controller can watch: poll sweep time, CPU and RSS.

N simulated agents are served by one separate process (its own core where
the machine has two): every node answers ``GET /nodeN/v1/state`` with a
realistic snapshot whose ``seq`` advances, and an SSH banner listener answers
the periodic banner checks. The real controller (``Controller``, production
detection defaults, poll_interval 1 s) runs in this process, pinned to one
core, for ``--seconds`` per N. It prints a table and writes JSON.

    .venv/bin/python -m bench.controller_scale --nodes 100 1000 5000 --seconds 30 \\
        --json-out docs/results/controller_scale.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.history.store import HistoryStore


def _snapshot(node: str, seq: int) -> bytes:
    body = {
        "node": node,
        "boot_id": "6f1c4b0e9a574c1e8d0a3e2b7f9c1a44",
        "seq": seq,
        "started_at": "2026-11-30T00:00:00.000+00:00",
        "observed_at": "2026-11-30T00:00:01.000+00:00",
        "version": "0.1.0",
        "loop_lag_s": 0.001,
        "healthy": True,
        "probes": {
            "vllm": {"state": "headless", "observed_at": "x", "running": None},
            "gpu": {"state": "ok", "devices": [{"index": 0, "power_w": 45.0}], "error": None},
            "journal": {"state": "ok", "previous_boot_clean_shutdown": True},
            "host": {"state": "ok", "mem_available_bytes": 42 * 2**30, "load1": 1.0},
        },
    }
    return json.dumps(body).encode()


def _serve_agents(port: int, banner_port: int, ready: Any, cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    started = time.monotonic()

    async def agent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await reader.readuntil(b"\r\n\r\n")
            path = request.split(b" ", 2)[1].decode()
            node = path.split("/")[1]
            seq = int((time.monotonic() - started) * 2)
            body = _snapshot(node, seq)
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n"
                + body
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, IndexError):
            pass
        finally:
            writer.close()

    async def banner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"SSH-2.0-OpenSSH_9.6 bench\r\n")
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()

    async def main() -> None:
        await asyncio.start_server(agent, "127.0.0.1", port, backlog=4096)
        await asyncio.start_server(banner, "127.0.0.1", banner_port, backlog=4096)
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MeasuredController(Controller):
    sweeps: list[float]

    async def tick(self) -> None:
        await super().tick()
        self.sweeps.append(self.last_sweep_s)


async def _run(
    nodes: int, seconds: float, agent_port: int, banner_port: int, db: Path
) -> dict[str, Any]:
    config = parse_controller_config(
        {
            "nodes": [
                {
                    "name": f"n{i}",
                    "agent": f"http://127.0.0.1:{agent_port}/n{i}",
                    "ssh_host": "127.0.0.1",
                    "ssh_port": banner_port,
                }
                for i in range(nodes)
            ],
            "history": str(db),
            "listen": {"port": _free_port()},
        }
    )
    store = HistoryStore(db)
    controller = MeasuredController(config, store)
    controller.sweeps = []
    stop = asyncio.Event()
    process = psutil.Process()
    task = asyncio.create_task(controller.run(stop))
    await asyncio.sleep(3)  # warm-up: first sweeps, first banner checks
    controller.sweeps.clear()
    cpu0 = sum(process.cpu_times()[:2])
    wall0 = time.monotonic()
    ticks0 = controller.ticks
    await asyncio.sleep(seconds)
    wall = time.monotonic() - wall0
    cpu = (sum(process.cpu_times()[:2]) - cpu0) / wall * 100
    ticks = controller.ticks - ticks0
    rss = process.memory_info().rss / 1e6
    verdicts: dict[str, int] = {}
    for node in controller.status_json()["nodes"]:
        verdicts[node["verdict"]] = verdicts.get(node["verdict"], 0) + 1
    stop.set()
    await task
    store.close()
    sweeps = sorted(controller.sweeps)
    return {
        "nodes": nodes,
        "seconds": round(wall, 1),
        "sweeps": ticks,
        "sweep_p50_s": round(statistics.median(sweeps), 3) if sweeps else None,
        "sweep_p95_s": round(sweeps[int(len(sweeps) * 0.95) - 1], 3) if sweeps else None,
        "sweep_max_s": round(sweeps[-1], 3) if sweeps else None,
        "sweeps_per_s": round(ticks / wall, 2),
        "controller_cpu_pct": round(cpu, 1),
        "controller_rss_mb": round(rss, 1),
        "verdicts": verdicts,
        "within_poll_interval": bool(sweeps) and sweeps[int(len(sweeps) * 0.95) - 1] <= 1.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    controller_cpu = cpus[0]
    agents_cpu = cpus[1] if len(cpus) > 1 else None
    os.sched_setaffinity(0, {controller_cpu})
    agent_port, banner_port = _free_port(), _free_port()
    ready = multiprocessing.Event()
    server = multiprocessing.Process(
        target=_serve_agents, args=(agent_port, banner_port, ready, agents_cpu), daemon=True
    )
    server.start()
    ready.wait(10)
    results = []
    try:
        for n in args.nodes:
            with tempfile.TemporaryDirectory() as tmp:
                print(f"bench: {n} nodes for {args.seconds:g}s ...", file=sys.stderr, flush=True)
                results.append(
                    asyncio.run(_run(n, args.seconds, agent_port, banner_port, Path(tmp) / "h.db"))
                )
    finally:
        server.terminate()
        server.join(5)
    print(
        f"{'nodes':>6} {'sweep p50':>10} {'p95':>8} {'max':>8} {'sweeps/s':>9} "
        f"{'CPU %':>7} {'RSS MB':>7}"
    )
    for r in results:
        print(
            f"{r['nodes']:>6} {r['sweep_p50_s']:>9}s {r['sweep_p95_s']:>7}s {r['sweep_max_s']:>7}s "
            f"{r['sweeps_per_s']:>9} {r['controller_cpu_pct']:>7} {r['controller_rss_mb']:>7}"
        )
    if args.json_out:
        args.json_out.write_text(
            json.dumps(
                {
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
                    "controller_pinned_to_cpu": controller_cpu,
                    "agents_pinned_to_cpu": agents_cpu,
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
