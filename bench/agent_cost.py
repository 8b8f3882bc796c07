"""Measure the agent's cost: RSS and CPU at default intervals over minutes.

The agent runs as a real subprocess with its production-default intervals
(loop 1 s, vllm 2 s, gpu 2 s, journal 60 s) against a vLLM stand-in with
synthetic load and a journal directory of real journal files, while this
script polls /v1/state every second as the controller would, and /metrics
every 15 s as Prometheus would. It samples the agent (and its NVML child)
with psutil and prints a table; ``--json-out`` writes the figures.

    .venv/bin/python -m bench.agent_cost --duration 300 --json-out docs/agent_cost.json

``--docker-socket SOCK --docker-image IMAGE`` measures the agent with
``serving.runtime: docker`` on that Docker Engine, watching a container it
adopted (``sleep`` in IMAGE, started here and removed at the end): its event
stream, its log follower and the launcher's arrivals stream.

``--peers N`` gives the agent N peers at the default pulse interval and
timeout (``peers:``): loopback stubs that pulse as real peers' agents do
(agent/peers.py): each answers ``/v1/pulse`` through the agent's own HTTP
server (as quickly as a real peer answers) with an advancing ``seq`` and
hears the agent's pulse carried in its requests, and each asks the agent's
pulse, carrying its own, unless it just heard the agent's. Of each pair one
side asks: ``--lead peers`` (the default) has the peers ask, so the agent
answers every pulse and asks none (its dearest case); ``--lead agent`` the
reverse. Run it beside a run without, on the same machine at the same time,
to read the peers' cost as the difference.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psutil
import requests
import yaml

from spark_watchdog import __version__
from spark_watchdog.agent.peers import HEARD_FRESH
from spark_watchdog.http.server import HttpEndpoint
from spark_watchdog.lab.hardware.vllm_standin import VllmStandin
from spark_watchdog.probes.pulse import PulseClient, pulse_bytes

GOAL_RSS_MB = 40.0
GOAL_CPU_PCT = 1.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _write_journal(directory: Path, boots: int, lines_per_boot: int) -> str | None:
    """Real journal files, or None when systemd-journal-remote is missing."""
    try:
        from spark_watchdog.lab.hardware.journal_writer import (
            Ending,
            Fault,
            JournalWriteError,
            boot_entries,
            write_boot,
        )
    except ImportError:
        return None
    start = datetime.now(timezone.utc) - timedelta(days=boots)
    try:
        for n in range(boots):
            faults = [Fault.NV_ERR_NO_MEMORY] * 50 + [Fault.XID_31] if n % 2 else []
            write_boot(
                directory,
                boot_entries(
                    uuid.uuid4().hex,
                    start + timedelta(days=n),
                    service_lines=lines_per_boot,
                    faults=faults,
                    ending=Ending.POWER_LOSS if n % 2 else Ending.CLEAN_SHUTDOWN,
                ),
            )
    except JournalWriteError as exc:
        print(f"bench: no journal files ({exc}); journal probe reads nothing", file=sys.stderr)
        return None
    return str(directory)


def _cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"


def _start_peer(port: int) -> subprocess.Popen[bytes] | None:
    """Debian's prometheus-node-exporter, the agent every such host already runs."""
    if not os.access(NODE_EXPORTER, os.X_OK):
        print("bench: prometheus-node-exporter not installed; no peer", file=sys.stderr)
        return None
    return subprocess.Popen(
        [NODE_EXPORTER, f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


# Where the peers' rounds fall after the agent's (``--lead``): both are
# steady states of the agent's own rule (agent/peers.py, HEARD_FRESH). "peers":
# they ask 0.2 s before the agent's round, so it hears them and never asks
# (it answers every pulse: its dearest case); "agent": they come 0.25 s after
# it, have just heard it, and never ask (it asks every pulse).
LEAD_PHASE_S = {"peers": 0.8, "agent": 0.25}


class _PulseStubs:
    """N peers on loopback that pulse as a peer's agent does: each answers
    ``/v1/pulse`` with its own advancing seq and hears the agent's pulse in
    its requests; each asks the agent's pulse once a second, carrying its own,
    unless it heard the agent's within the share of a second the agent's own
    rule allows (agent/peers.py). ``lead`` says which side asks."""

    def __init__(self, count: int, agent_port: int, node: str, lead: str = "peers") -> None:
        if lead not in LEAD_PHASE_S:
            raise ValueError(f"lead: expected one of {sorted(LEAD_PHASE_S)}, got {lead!r}")
        self.count = count
        self.lead = lead
        self.servers: list[HttpEndpoint] = []
        self.asked = self.failed = self.skipped = 0
        self.heard_at: list[float | None] = [None] * count  # the agent's pulse, per stub
        self.agent_round = 0.0  # monotonic: the agent's latest heartbeat seen (0: none yet)
        self.asked_by_agent = [0] * count
        self.seqs = [0] * count
        self._agent = f"http://127.0.0.1:{agent_port}"
        self.node = node
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        for n in range(count):
            server = _pulse_server(self, n)
            server.start()
            self.servers.append(server)

    def peers_config(self) -> list[dict[str, str]]:
        return [
            {"name": f"peer-{n}", "url": f"http://127.0.0.1:{server.port}"}
            for n, server in enumerate(self.servers)
        ]

    def start(self) -> None:
        if self.count:
            asker = threading.Thread(target=self._ask_agent, daemon=True)
            asker.start()
            self._threads.append(asker)

    def _ask_agent(self) -> None:
        # Each peer asks as a real peer's agent does: its own kept-alive connection.
        clients = [
            PulseClient(self.node, self._agent, 0.5, carry=self._carry(n))
            for n in range(self.count)
        ]
        # The agent's first round (it asks before it has heard anyone) sets the
        # phase; then each heartbeat the bench's poll sees (saw_state) keeps it:
        # the agent's rounds follow its heartbeat, a little over a second apart.
        while not self._stop.wait(0.05) and self.heard_at[0] is None:
            pass
        self.agent_round = self.agent_round or self.heard_at[0] or time.monotonic()
        due = float("-inf")
        while True:
            after, due = due, self.agent_round + LEAD_PHASE_S[self.lead]
            while due < after + 0.5:  # the next such moment after the last round
                due += 1.0
            if self._stop.wait(max(0.0, due - time.monotonic())):
                break
            for n, client in enumerate(clients):
                heard = self.heard_at[n]
                if heard is not None and time.monotonic() - heard < HEARD_FRESH:
                    self.skipped += 1
                    continue
                self.seqs[n] += 1
                if client.ask().state == "ok":
                    self.asked += 1
                else:
                    self.failed += 1
        for client in clients:
            client.close()

    def saw_state(self, snap: dict[str, Any]) -> None:
        """The agent's ``/v1/state``: its ``observed_at`` is its latest heartbeat."""
        try:
            at = datetime.fromisoformat(snap["observed_at"]).timestamp()
        except (KeyError, TypeError, ValueError):
            return
        self.agent_round = time.monotonic() - (time.time() - at)

    def _carry(self, n: int) -> Callable[[], bytes]:
        return lambda: pulse_bytes(f"peer-{n}", self.seqs[n], "0" * 32)

    def stop(self) -> None:
        self._stop.set()
        for server in self.servers:
            server.stop()


def _pulse_server(stubs: _PulseStubs, n: int) -> HttpEndpoint:
    """Peer ``n``'s agent server: the agent's own (http/server.py), so the
    agent's asks are answered as fast as a real peer answers them."""

    def pulse() -> tuple[int, str, bytes]:
        stubs.asked_by_agent[n] += 1
        stubs.seqs[n] += 1
        return 200, "application/json", pulse_bytes(f"peer-{n}", stubs.seqs[n], "0" * 32)

    def heard(carried: bytes, address: Any) -> None:
        stubs.heard_at[n] = time.monotonic()

    return HttpEndpoint("127.0.0.1", 0, {"/v1/pulse": pulse}, pulse_in=heard)


def _docker_serving(workdir: Path, socket_path: str, image: str) -> tuple[dict[str, Any], Any]:
    """The serving section for the Docker runtime, and the container it adopts."""
    import docker

    client = docker.DockerClient(base_url=f"unix://{socket_path}", version="auto")
    container = client.containers.run(
        image, ["sleep", "100000"], name="bench-rank", network_mode="host", detach=True
    )
    token = workdir / "serving-token"
    token.write_text("bench-token\n")
    token.chmod(0o600)
    serving = {
        "enabled": True,
        "runtime": "docker",
        "docker": {"socket": socket_path, "name": "bench-rank", "gpus": "none"},
        "token_file": str(token),
        "log_file": str(workdir / "serving.log"),
    }
    return serving, container


def _agent_config(
    port: int, vllm_url: str, journal_dir: str | None, stubs: _PulseStubs
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "node": "bench-1",
        "listen": {"address": "127.0.0.1", "port": port},
        "probes": {
            "vllm": {"url": vllm_url},
            "journal": {"directory": journal_dir, "enabled": journal_dir is not None},
        },
    }
    if stubs.count:
        config["peers"] = stubs.peers_config()
    return config


def run(
    duration: float,
    poll_interval: float,
    warmup: float,
    docker_socket: str | None = None,
    docker_image: str | None = None,
    peers: int = 0,
    lead: str = "peers",
) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="spark-watchdog-bench-"))
    journal_dir = _write_journal(workdir / "journal", boots=10, lines_per_boot=500)
    port = _free_port()
    container = None
    stubs = _PulseStubs(peers, port, "bench-1", lead=lead)
    with VllmStandin(model="bench-model") as vllm:
        config = _agent_config(port, vllm.url, journal_dir, stubs)
        if docker_socket is not None and docker_image is not None:
            config["serving"], container = _docker_serving(workdir, docker_socket, docker_image)
        config_path = workdir / "agent.yaml"
        config_path.write_text(yaml.safe_dump(config))
        env = dict(os.environ)
        env.pop("NOTIFY_SOCKET", None)
        log = (workdir / "agent.log").open("wb")
        agent = subprocess.Popen(
            [sys.executable, "-m", "spark_watchdog", "agent", "--config", str(config_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        peer_port = _free_port()
        peer = _start_peer(peer_port)
        stubs.start()
        try:
            result = _measure(
                agent,
                port,
                duration,
                poll_interval,
                warmup,
                journal_dir,
                peer,
                peer_port,
                stubs.saw_state,
            )
            result["serving_runtime"] = "docker" if container is not None else None
            result["peers"] = {
                "count": peers,
                "lead": lead,
                "pulses_asked_of_the_agent": stubs.asked,
                "pulses_failed": stubs.failed,
                "pulses_not_asked_of_the_agent": stubs.skipped,
                "pulses_the_agent_asked": sum(stubs.asked_by_agent),
            }
            return result
        finally:
            stubs.stop()
            agent.terminate()
            agent.wait(20)
            if container is not None:
                container.remove(force=True)
            if peer is not None:
                peer.terminate()
                peer.wait(20)
            log.close()


def _check_listening(proc: psutil.Process, port: int) -> None:
    """The answers come from this agent: benches run side by side may race for a
    free port, and another's agent would be measured as a dead one."""
    if proc.status() == psutil.STATUS_ZOMBIE or not proc.is_running():
        raise SystemExit(f"bench: the agent exited before answering on port {port}; see its log")
    # net_connections since psutil 6; connections before (Debian 12 ships 5.9).
    listing = getattr(proc, "net_connections", None) or proc.connections
    ports = {c.laddr.port for c in listing("tcp") if c.status == psutil.CONN_LISTEN}
    if port not in ports:
        raise SystemExit(
            f"bench: port {port} is not the agent's (it listens on {sorted(ports)}); run again"
        )


def _measure(
    agent: subprocess.Popen[bytes],
    port: int,
    duration: float,
    poll_interval: float,
    warmup: float,
    journal_dir: str | None,
    peer: subprocess.Popen[bytes] | None = None,
    peer_port: int = 0,
    on_state: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    base = f"http://127.0.0.1:{port}"
    session = requests.Session()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if session.get(f"{base}/v1/state", timeout=1).ok:
                break
        except requests.RequestException:
            time.sleep(0.2)
    proc = psutil.Process(agent.pid)
    _check_listening(proc, port)
    time.sleep(warmup)

    def children_cpu() -> float:
        return sum(_cpu_seconds(c) for c in proc.children(recursive=True) if c.is_running())

    peer_proc = psutil.Process(peer.pid) if peer is not None else None
    peer_rss: list[float] = []
    peer0 = _cpu_seconds(peer_proc) if peer_proc is not None else 0.0
    wall0 = time.monotonic()
    main0, kids0 = _cpu_seconds(proc), children_cpu()
    rss_main: list[float] = []
    rss_kids: list[float] = []
    uss_main: list[float] = []
    states: dict[str, int] = {}
    polls = failures = 0
    last_metrics = 0.0
    next_sample = wall0
    last_progress = wall0
    while time.monotonic() - wall0 < duration:
        try:
            snap = session.get(f"{base}/v1/state", timeout=1).json()
            polls += 1
            if on_state is not None:
                on_state(snap)
            key = "/".join(f"{k}={v['state']}" for k, v in sorted(snap["probes"].items()))
            for name, seen in sorted(snap.get("peers", {}).items()):
                key += f"/{name}={seen['state']}"
            states[key] = states.get(key, 0) + 1
        except (requests.RequestException, ValueError):
            failures += 1
        if time.monotonic() - last_metrics >= 15:
            # Prometheus scrapes both agents at the same 15 s interval.
            session.get(f"{base}/metrics", timeout=2)
            if peer_proc is not None:
                session.get(f"http://127.0.0.1:{peer_port}/metrics", timeout=5)
            last_metrics = time.monotonic()
        if time.monotonic() >= next_sample:
            mem = proc.memory_full_info()
            rss_main.append(mem.rss / 1e6)
            uss_main.append(mem.uss / 1e6)
            rss_kids.append(sum(c.memory_info().rss for c in proc.children(recursive=True)) / 1e6)
            if peer_proc is not None:
                peer_rss.append(peer_proc.memory_info().rss / 1e6)
            next_sample += 5
        if time.monotonic() - last_progress >= 30:
            done = time.monotonic() - wall0
            print(f"bench: {done:.0f}/{duration:.0f}s", file=sys.stderr, flush=True)
            last_progress = time.monotonic()
        time.sleep(poll_interval)
    wall = time.monotonic() - wall0
    main_cpu = (_cpu_seconds(proc) - main0) / wall * 100
    kids_cpu = (children_cpu() - kids0) / wall * 100
    peer_cpu = (_cpu_seconds(peer_proc) - peer0) / wall * 100 if peer_proc is not None else None
    peer_result = None
    if peer_proc is not None and peer_rss and peer_cpu is not None:
        peer_result = {
            "name": "prometheus-node-exporter (Debian)",
            "rss_mb": {"max": max(peer_rss), "mean": statistics.fmean(peer_rss)},
            "cpu_pct_of_one_core": round(peer_cpu, 3),
            "agent_to_peer_cpu_ratio": round((main_cpu + kids_cpu) / peer_cpu, 2)
            if peer_cpu > 0
            else None,
            "agent_to_peer_rss_ratio": round(max(rss_main) / max(peer_rss), 2),
        }
    return {
        "peer": peer_result,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "machine": platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "version": __version__,
        "duration_s": round(wall, 1),
        "journal_probe": journal_dir is not None,
        "agent_rss_mb": {"max": max(rss_main), "mean": statistics.fmean(rss_main)},
        "agent_uss_mb": {"max": max(uss_main), "mean": statistics.fmean(uss_main)},
        "gpu_worker_rss_mb": {"max": max(rss_kids), "mean": statistics.fmean(rss_kids)},
        "agent_cpu_pct_of_one_core": round(main_cpu, 3),
        "gpu_worker_cpu_pct_of_one_core": round(kids_cpu, 3),
        "total_cpu_pct_of_one_core": round(main_cpu + kids_cpu, 3),
        "state_polls": polls,
        "state_poll_failures": failures,
        "states_seen": states,
        "goals": {
            "rss_mb": GOAL_RSS_MB,
            "cpu_pct": GOAL_CPU_PCT,
            "rss_met": max(rss_main) <= GOAL_RSS_MB,
            "cpu_met": main_cpu + kids_cpu <= GOAL_CPU_PCT,
        },
    }


def render(result: dict[str, Any]) -> str:
    rows = [
        ("duration", f"{result['duration_s']} s"),
        ("agent RSS max / mean", "{max:.1f} / {mean:.1f} MB".format(**result["agent_rss_mb"])),
        ("agent USS max / mean", "{max:.1f} / {mean:.1f} MB".format(**result["agent_uss_mb"])),
        (
            "NVML child RSS max / mean",
            "{max:.1f} / {mean:.1f} MB".format(**result["gpu_worker_rss_mb"]),
        ),
        ("agent CPU", f"{result['agent_cpu_pct_of_one_core']:.3f} % of one core"),
        ("NVML child CPU", f"{result['gpu_worker_cpu_pct_of_one_core']:.3f} % of one core"),
        ("total CPU", f"{result['total_cpu_pct_of_one_core']:.3f} % of one core"),
        ("/v1/state polls (failed)", f"{result['state_polls']} ({result['state_poll_failures']})"),
    ]
    peers = result.get("peers") or {}
    if peers.get("count"):
        rows.append(
            (
                "peers, lead (pulses asked of the agent, failed; asked by it)",
                f"{peers['count']}, {peers['lead']} "
                f"({peers['pulses_asked_of_the_agent']}, {peers['pulses_failed']}; "
                f"{peers['pulses_the_agent_asked']})",
            )
        )
    peer = result.get("peer")
    if peer:
        rows.append(
            ("node_exporter RSS max / mean", "{max:.1f} / {mean:.1f} MB".format(**peer["rss_mb"]))
        )
        rows.append(("node_exporter CPU", f"{peer['cpu_pct_of_one_core']:.3f} % of one core"))
        rows.append(
            (
                "agent / node_exporter",
                f"CPU x{peer['agent_to_peer_cpu_ratio']}, RSS x{peer['agent_to_peer_rss_ratio']}",
            )
        )
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    goals = result["goals"]
    lines.append(
        f"goal RSS ≤ {goals['rss_mb']:g} MB: {'met' if goals['rss_met'] else 'NOT met'}; "
        f"goal CPU ≤ {goals['cpu_pct']:g} %: {'met' if goals['cpu_met'] else 'NOT met'}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds measured")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before measuring")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="/v1/state poll period")
    parser.add_argument("--json-out", type=Path, help="write the figures here as JSON")
    parser.add_argument("--docker-socket", help="measure serving.runtime docker on this Engine")
    parser.add_argument("--docker-image", help="the image of the container the agent adopts")
    parser.add_argument(
        "--peers", type=int, default=0, help="give the agent this many loopback peers"
    )
    parser.add_argument(
        "--lead",
        choices=sorted(LEAD_PHASE_S),
        default="peers",
        help="which side asks, each pair making one exchange a second: the peers "
        "(the agent answers every pulse, its dearest case; the default) or the agent",
    )
    args = parser.parse_args(argv)
    if (args.docker_socket is None) != (args.docker_image is None):
        parser.error("--docker-socket and --docker-image go together")
    result = run(
        args.duration,
        args.poll_interval,
        args.warmup,
        args.docker_socket,
        args.docker_image,
        peers=args.peers,
        lead=args.lead,
    )
    print(render(result))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
