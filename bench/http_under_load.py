"""Time the agent's and the controller's poll beside 1,000 idle or slow connections.

Issue 37: while 1,000 connections are open to a server, silent, or sending a
byte a second, or reading their answer a byte a second, ``GET /v1/state``
(the agent) and ``GET /v1/status`` (the controller) must still answer in
under 100 ms, and the server's memory stay bounded.

The agent runs as a real subprocess (``spark-watchdog agent`` against the vLLM
stand-in, production defaults); the controller's side is the real status
endpoint (:class:`spark_watchdog.controller.page.status_api.StatusEndpoint`) in a
subprocess of its own, serving a published status of ``--nodes`` synthetic
nodes. For each server and each crowd (none, 1,000 of one kind, 1,000 of
each kind at once, which is past the 2,048 cap), this script opens the crowd
from an asyncio loop on a thread of its own, keeps it open (a connection the
server closes at its deadline is opened again, as an attacker would), then
times ``--polls`` polls, each on a fresh connection as the controller's, from
the main thread, and samples the server's RSS with psutil.

    .venv/bin/python -m bench.http_under_load --json-out docs/results/http_under_load.json

It raises its own open-file limit (the servers inherit it) to fit the crowd.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import platform
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import yaml

from spark_watchdog import __version__

GOAL_MS = 100.0
KINDS = ("idle", "slow-sender", "slow-reader")
# Crowds timed for each server: none, each kind alone, all three at once.
CROWDS: tuple[tuple[str, ...], ...] = ((), ("idle",), ("slow-sender",), ("slow-reader",), KINDS)
# The byte a slow client sends or reads, this often.
DRIP_S = 1.0
# A slow reader's receive buffer (the kernel doubles it): the answer waits in the server.
READER_RCVBUF = 4096


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _raise_open_files(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# -- the crowd -------------------------------------------------------------------------


@dataclass
class _Tally:
    open: int = 0
    opened: int = 0
    closed_by_server: int = 0
    errors: int = 0


async def _hold_one(kind: str, port: int, slow_path: str, tally: _Tally) -> None:
    """One connection of ``kind``, opened again whenever the server closes it."""
    loop = asyncio.get_running_loop()
    while True:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        if kind == "slow-reader":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, READER_RCVBUF)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
        except OSError:
            tally.errors += 1
            sock.close()
            await asyncio.sleep(0.5)
            continue
        tally.open += 1
        tally.opened += 1
        try:
            if kind == "idle":
                await loop.sock_recv(sock, 1)  # b"" once the server closes it
            elif kind == "slow-sender":
                await loop.sock_sendall(sock, b"GET /v1/state HTTP/1.1\r\nX-Slow: ")
                while True:
                    await asyncio.sleep(DRIP_S)
                    await loop.sock_sendall(sock, b"a")
            else:
                await loop.sock_sendall(
                    sock, f"GET {slow_path} HTTP/1.1\r\nHost: b\r\n\r\n".encode()
                )
                while await loop.sock_recv(sock, 1):
                    await asyncio.sleep(DRIP_S)
            tally.closed_by_server += 1
        except OSError:
            tally.closed_by_server += 1
        finally:
            tally.open -= 1
            sock.close()


class _Crowd:
    """The crowd's asyncio loop, on a thread of its own."""

    def __init__(self, port: int, kinds: tuple[str, ...], size: int, slow_path: str) -> None:
        self.tally = _Tally()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._port, self._kinds, self._size, self._slow_path = port, kinds, size, slow_path
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._thread.start()

        async def spawn() -> None:
            for kind in self._kinds:
                for n in range(self._size):
                    self._tasks.append(
                        asyncio.create_task(
                            _hold_one(kind, self._port, self._slow_path, self.tally)
                        )
                    )
                    if n % 100 == 99:
                        await asyncio.sleep(0.05)  # not all in one backlog

        asyncio.run_coroutine_threadsafe(spawn(), self._loop).result(60)

    def stop(self) -> None:
        async def cancel() -> None:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(cancel(), self._loop).result(60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


# -- the poll --------------------------------------------------------------------------


def _poll(port: int, path: str) -> tuple[float, int]:
    """(milliseconds, status) of one GET on a fresh connection."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        answer.read()
        return (time.perf_counter() - started) * 1000, answer.status
    finally:
        conn.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _measure(
    server: psutil.Process,
    port: int,
    poll_path: str,
    slow_path: str,
    kinds: tuple[str, ...],
    size: int,
    polls: int,
    interval: float,
) -> dict[str, Any]:
    rss_before = server.memory_info().rss / 1e6
    crowd = _Crowd(port, kinds, size, slow_path)
    crowd.start()
    wanted = size * len(kinds)
    deadline = time.monotonic() + 30
    while crowd.tally.open < min(wanted, 2048) * 0.95 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(2.0 if kinds else 0.0)
    times: list[float] = []
    statuses: dict[str, int] = {}
    failures = 0
    rss: list[float] = [server.memory_info().rss / 1e6]
    open_during: list[int] = []
    try:
        for _ in range(polls):
            open_during.append(crowd.tally.open)
            try:
                ms, status = _poll(port, poll_path)
                times.append(ms)
                statuses[str(status)] = statuses.get(str(status), 0) + 1
            except (OSError, http.client.HTTPException):
                failures += 1
            rss.append(server.memory_info().rss / 1e6)
            time.sleep(interval)
    finally:
        crowd.stop()
    ok = statuses.get("200", 0)
    return {
        "crowd": "+".join(kinds) or "none",
        "connections_wanted": wanted,
        "connections_open_during_polls": {
            "min": min(open_during),
            "mean": round(statistics.fmean(open_during)),
        },
        "opened": crowd.tally.opened,
        "closed_by_server": crowd.tally.closed_by_server,
        "connect_errors": crowd.tally.errors,
        "polls": polls,
        "answers": statuses,
        "failures": failures,
        "ms": {
            "p50": round(_percentile(times, 0.50), 2) if times else None,
            "p95": round(_percentile(times, 0.95), 2) if times else None,
            "max": round(max(times), 2) if times else None,
        },
        "rss_mb": {"before": round(rss_before, 1), "max": round(max(rss), 1)},
        "goal_met": bool(times) and ok == polls and _percentile(times, 0.95) < GOAL_MS,
    }


# -- the servers -----------------------------------------------------------------------


def _wait_ready(port: int, path: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bench: the server on {port} exited with {proc.returncode}")
        try:
            if _poll(port, path)[1] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"bench: nothing answered {path} on {port} within 60 s")


@contextmanager
def _agent(workdir: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    from spark_watchdog.lab.hardware.vllm_standin import VllmStandin

    port = _free_port()
    with VllmStandin(model="bench-model") as vllm:
        config = {
            "node": "bench-1",
            "listen": {"address": "127.0.0.1", "port": port},
            "probes": {"vllm": {"url": vllm.url}, "journal": {"enabled": False}},
        }
        path = workdir / "agent.yaml"
        path.write_text(yaml.safe_dump(config))
        env = dict(os.environ)
        env.pop("NOTIFY_SOCKET", None)
        with (workdir / "agent.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "spark_watchdog", "agent", "--config", str(path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
            try:
                _wait_ready(port, "/v1/state", proc)
                yield proc, port
            finally:
                _end(proc)


@contextmanager
def _status_server(workdir: Path, nodes: int) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = _free_port()
    argv = [sys.executable, "-m", "bench.http_under_load", "--serve-status", str(port)]
    with (workdir / "status.log").open("wb") as log:
        proc = subprocess.Popen(
            [*argv, "--nodes", str(nodes)], stdout=log, stderr=subprocess.STDOUT
        )
        try:
            _wait_ready(port, "/v1/status", proc)
            yield proc, port
        finally:
            _end(proc)


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(20)


def _synthetic_status(nodes: int) -> dict[str, Any]:
    """A published status shaped like the controller's (docs/api/controller.openapi.yaml)."""
    return {
        "ticks": 1,
        "poll_interval_s": 1.0,
        "freeze_after_s": 8.0,
        "last_sweep_s": 0.01,
        "witness": "ok",
        "history": "ok",
        "nodes": [
            {
                "name": f"spark-{n}",
                "verdict": "healthy",
                "state": "watching",
                "reasons": ["agent seq advancing", "vLLM progressing", "GPU heartbeat fresh"],
                "agent_silent_s": 0.4,
                "banner_misses": 0,
                "seq": 12345 + n,
                "boot_id": f"{n:08x}-1111-2222-3333-444455556666",
                "power": {"path": "pdu", "outlet": n, "last_action": None},
                "serving": {"profile": "plain", "asked": "plain", "effective": "plain"},
                "signals": {"agent": 0.4, "banner": 1.2, "gpu": 0.9, "vllm": 1.1},
            }
            for n in range(nodes)
        ],
    }


def serve_status(port: int, nodes: int) -> int:
    """The controller's status endpoint over a synthetic status, until SIGTERM."""
    from spark_watchdog.controller.page.status_api import StatusEndpoint
    from spark_watchdog.controller.record.tallies import Tallies

    class Source:
        published = _synthetic_status(nodes)
        tallies = Tallies()

    endpoint = StatusEndpoint("127.0.0.1", port, Source())
    endpoint.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    endpoint.stop()
    return 0


def run(size: int, polls: int, interval: float, nodes: int) -> dict[str, Any]:
    limit = _raise_open_files(4 * size * len(KINDS) + 1024)
    workdir = Path(tempfile.mkdtemp(prefix="spark-watchdog-http-bench-"))
    servers: list[dict[str, Any]] = []
    plans = (
        ("agent", _agent(workdir), "/v1/state", "/metrics"),
        ("controller", _status_server(workdir, nodes), "/v1/status", "/v1/status"),
    )
    for name, server, poll_path, slow_path in plans:
        with server as (proc, port):
            ps = psutil.Process(proc.pid)
            answer_bytes = len(_get(port, slow_path))
            runs = []
            for kinds in CROWDS:
                print(f"bench: {name}, crowd {'+'.join(kinds) or 'none'}", file=sys.stderr)
                runs.append(_measure(ps, port, poll_path, slow_path, kinds, size, polls, interval))
            servers.append(
                {
                    "server": name,
                    "poll": poll_path,
                    "slow_reader_path": slow_path,
                    "slow_reader_answer_bytes": answer_bytes,
                    "runs": runs,
                }
            )
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "version": __version__,
        "open_files_limit": limit,
        "connections_per_kind": size,
        "polls_per_crowd": polls,
        "poll_interval_s": interval,
        "status_nodes": nodes,
        "goal_ms": GOAL_MS,
        "servers": servers,
        "goal_met": all(r["goal_met"] for s in servers for r in s["runs"]),
    }


def _get(port: int, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        return conn.getresponse().read()
    finally:
        conn.close()


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{'server':<10} {'crowd':<32} {'open':>9} {'p50 ms':>7} {'p95 ms':>7} "
        f"{'max ms':>7} {'200s':>5} {'RSS MB before/max':>18}"
    ]
    for server in result["servers"]:
        for run in server["runs"]:
            ms, rss = run["ms"], run["rss_mb"]
            opened = run["connections_open_during_polls"]
            lines.append(
                f"{server['server']:<10} {run['crowd']:<32} "
                f"{opened['min']:>4}-{opened['mean']:<4} "
                f"{ms['p50']:>7} {ms['p95']:>7} {ms['max']:>7} "
                f"{run['answers'].get('200', 0):>5} {rss['before']:>8} / {rss['max']:<7}"
            )
    met = "met" if result["goal_met"] else "NOT met"
    lines.append(f"goal: every poll a 200, p95 < {result['goal_ms']:g} ms: {met}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=1000, help="connections of each kind")
    parser.add_argument("--polls", type=int, default=100, help="polls timed beside each crowd")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between polls")
    parser.add_argument("--nodes", type=int, default=32, help="nodes in the controller's status")
    parser.add_argument("--json-out", type=Path, help="write the figures here as JSON")
    parser.add_argument("--serve-status", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_status is not None:
        return serve_status(args.serve_status, args.nodes)
    result = run(args.connections, args.polls, args.interval, args.nodes)
    print(render(result))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
