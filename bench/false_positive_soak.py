"""False positives under stress: a lab soak with no injected fault.

Four simulated Sparks, each in a network namespace of its own behind a veth
link (root only), the real controller with every production setting
(detection, power timing, budgets, guards), and the agents at their
production intervals. While the soak runs:

- ``stress-ng`` loads every core, holds a share of the machine's memory and
  writes to disk (``--cpu 0 --vm 1 --vm-bytes 60% --hdd 2``);
- every node's link delays and drops packets: 5 % of the packets in each
  direction are dropped in the kernel (iptables ``statistic`` in the node's
  network namespace), and every chunk the controller and the node exchange
  (agent polls, SSH banner checks) waits 200 ms ± 100 ms in each direction
  in a relay (:mod:`bench.delay_relay`), so a round trip takes ~400 ms. The
  relay stands in for ``tc netem delay``, which needs the sch_netem kernel
  module; where ``tc ... netem`` works, ``--netem`` uses it instead.

With ``--memory-plateau-gib N`` the memory guard is judged on real memory:
the nodes' agents read this machine's own ``/proc/meminfo`` (and PSI), and
stress-ng's ``--vm`` worker instead takes, in a minute or two, all but N GiB of
what is available and keeps it (``--vm-keep --vm-populate``): the fast ramp
to a high, stable plateau of a model load. With N under the guard's
``watch_below_gib`` (6) the guard judges every reading of the soak.

No fault is injected, so every power command, serving restart, incident and
verdict other than ``healthy`` is a false positive or a near miss. The
benchmark counts them from the PDU (ground truth: SETs that reached it), the
history and ``/v1/status`` (sampled every second), with the closest calls:
the longest agent silence and the most banner misses seen per node.

    .venv/bin/python -m bench.false_positive_soak --minutes 30 \\
        --json-out docs/results/false_positive_soak.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

from bench.delay_relay import DelayRelay
from bench.detection_latency import machine
from bench.production import PRODUCTION_TIMINGS, production_settings
from spark_watchdog.config.agent import MemoryGuardConfig
from spark_watchdog.lab.cluster import LabCluster
from spark_watchdog.lab.netns import netns_unavailable
from spark_watchdog.lab.session import LabSession

NETEM = ["delay", "200ms", "100ms", "loss", "5%"]
LOSS = 0.05
STRESS = "--cpu 0 --vm 1 --vm-bytes 60% --hdd 2 --hdd-bytes 1g"
GIB = 1024**3
WATCH_BELOW_GIB = MemoryGuardConfig().watch_below_gib


def stress_args(plateau_gib: float | None) -> str:
    """stress-ng's load: STRESS, or with a memory plateau its vm worker sized
    to leave ``plateau_gib`` of what is available now, kept mapped."""
    if plateau_gib is None:
        return STRESS
    take = int(psutil.virtual_memory().available - plateau_gib * GIB) // 1024**2
    if take <= 0:
        raise SystemExit(f"less than {plateau_gib:g} GiB is available: nothing to hold")
    return f"--cpu 0 --vm 1 --vm-bytes {take}m --vm-keep --vm-populate --hdd 2 --hdd-bytes 1g"


def add_netem(lab: LabCluster) -> list[list[str]]:
    """netem on both ends of every node link; the commands, to undo."""
    undo = []
    for node in lab.nodes:
        assert node.veth is not None and node.netns is not None and node.link is not None
        for prefix, device in (([], node.veth), (["ip", "netns", "exec", node.netns], node.link)):
            subprocess.run(
                [*prefix, "tc", "qdisc", "add", "dev", device, "root", "netem", *NETEM],
                check=True,
                capture_output=True,
            )
            undo.append([*prefix, "tc", "qdisc", "del", "dev", device, "root"])
    return undo


def add_loss(lab: LabCluster) -> list[str]:
    """Drop LOSS of the packets in and out of every node's namespace."""
    for node in lab.nodes:
        assert node.netns is not None
        for chain in ("INPUT", "OUTPUT"):
            subprocess.run(
                ["ip", "netns", "exec", node.netns, "iptables", "-A", chain, "-m", "statistic",
                 "--mode", "random", "--probability", str(LOSS), "-j", "DROP"],
                check=True,
                capture_output=True,
            )  # fmt: skip
    return [n.netns for n in lab.nodes if n.netns is not None]


def dropped(namespaces: list[str]) -> dict[str, int]:
    """Packets the loss rules dropped, per namespace (ground truth for the loss)."""
    counts = {}
    for netns in namespaces:
        out = subprocess.run(
            ["ip", "netns", "exec", netns, "iptables", "-L", "-v", "-n", "-x"],
            capture_output=True,
            text=True,
        ).stdout
        counts[netns] = sum(
            int(line.split()[0]) for line in out.splitlines() if "statistic" in line
        )
    return counts


def netem_works() -> bool:
    probe = subprocess.run(
        ["tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "0ms"],
        capture_output=True,
    )
    if probe.returncode == 0:
        subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], capture_output=True)
    return probe.returncode == 0


def relay_nodes(relays: list[DelayRelay]) -> Any:
    """A LabSession hook: the controller reaches each agent and SSH port
    through a delaying relay."""

    def adjust(lab: LabCluster, config: dict[str, Any]) -> None:
        for node, entry in zip(lab.nodes, config["nodes"], strict=True):
            agent = DelayRelay((node.address, node.agent_port)).start()
            ssh = DelayRelay((node.address, node.ssh_port)).start()
            relays.extend([agent, ssh])
            entry["agent"] = f"http://127.0.0.1:{agent.port}"
            entry["ssh_host"] = "127.0.0.1"
            entry["ssh_port"] = ssh.port

    return adjust


def start_stress(seconds: int, scratch: Path, load: str) -> subprocess.Popen[bytes]:
    binary = shutil.which("stress-ng")
    if binary is None:
        raise SystemExit("stress-ng is not installed: apt-get install stress-ng")
    return subprocess.Popen(
        [
            binary,
            *load.split(),
            *("--temp-path", str(scratch), "--timeout", f"{seconds}s", "--metrics-brief"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


class GuardWatch:
    """The memory guard's side of the soak: this machine's MemAvailable and
    PSI each second, and each agent's guard state and kills."""

    def __init__(self) -> None:
        self.available_min = float("inf")
        self.judged_readings = 0  # samples with MemAvailable under watch_below_gib
        self.psi_full_max = 0.0
        self.states: Counter[str] = Counter()
        self.kills: dict[str, int] = {}
        self.available_gib: list[float] = []  # one per sample, for the ramp

    def sample(self, lab: LabCluster, watch_below_gib: float) -> None:
        available = psutil.virtual_memory().available / GIB
        self.available_gib.append(round(available, 2))
        self.available_min = min(self.available_min, available)
        if available <= watch_below_gib:
            self.judged_readings += 1
        self.psi_full_max = max(self.psi_full_max, psi_full_avg10())
        for node in lab.nodes:
            state = lab.agent_state(node)
            if state is None:
                self.states["unanswered"] += 1
                continue
            guard = state.get("memory_guard") or {}
            self.states[str(guard.get("state"))] += 1
            self.kills[node.name] = max(self.kills.get(node.name, 0), int(guard.get("kills") or 0))

    def to_json(self) -> dict[str, Any]:
        return {
            "mem_available_min_gib": round(self.available_min, 2),
            "samples_in_judged_zone": self.judged_readings,
            "psi_full_avg10_max": self.psi_full_max,
            "guard_states_seen": dict(self.states),
            "guard_kills_per_node": self.kills,
            "mem_available_gib_per_sample": self.available_gib,
        }


def psi_full_avg10() -> float:
    try:
        text = Path("/proc/pressure/memory").read_text()
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith("full "):
            fields = dict(f.split("=", 1) for f in line.split()[1:])
            return float(fields.get("avg10", 0.0))
    return 0.0


def soak(
    minutes: float, workdir: Path, use_netem: bool, plateau_gib: float | None = None
) -> dict[str, Any]:
    seconds = int(minutes * 60)
    relays: list[DelayRelay] = []
    guard = GuardWatch() if plateau_gib is not None else None
    load_args = stress_args(plateau_gib)
    session = LabSession(
        workdir / "lab",
        nodes=4,
        netns=True,
        host_memory=plateau_gib is not None,
        timings=PRODUCTION_TIMINGS,
        controller_overrides=production_settings(),
        adjust_config=None if use_netem else relay_nodes(relays),
    )
    changes: list[dict[str, Any]] = []
    silent_max: dict[str, float] = {}
    misses_max: dict[str, int] = {}
    samples = 0
    unanswered = 0
    load: list[float] = []
    with session:
        lab = session.lab
        sets_before = len(lab.outlet_commands())
        undo = add_netem(lab) if use_netem else []
        namespaces = [] if use_netem else add_loss(lab)
        stress = start_stress(seconds, workdir, load_args)
        verdicts: dict[str, str] = {}
        started = time.monotonic()
        last_line = 0.0
        try:
            while (elapsed := time.monotonic() - started) < seconds:
                status = session.status()
                samples += 1
                if status is None:
                    unanswered += 1
                for node in (status or {}).get("nodes", []):
                    name, verdict = str(node.get("name")), str(node.get("verdict"))
                    if verdicts.get(name, "healthy") != verdict:
                        changes.append(
                            {
                                "at_s": round(elapsed, 1),
                                "node": name,
                                "from": verdicts.get(name, "healthy"),
                                "to": verdict,
                            }
                        )
                    verdicts[name] = verdict
                    silent = float(node.get("agent_silent_s") or 0.0)
                    silent_max[name] = max(silent_max.get(name, 0.0), silent)
                    misses = int(node.get("banner_misses") or 0)
                    misses_max[name] = max(misses_max.get(name, 0), misses)
                if guard is not None:
                    guard.sample(lab, WATCH_BELOW_GIB)
                if elapsed - last_line >= 60:
                    last_line = elapsed
                    load.append(psutil.getloadavg()[0])
                    memory = (
                        ""
                        if guard is None
                        else f", MemAvailable min {guard.available_min:.1f} GiB, "
                        f"guard kills {sum(guard.kills.values())}"
                    )
                    print(
                        f"soak {elapsed / 60:4.1f}/{minutes:g} min: load1 {load[-1]:.1f}, "
                        f"verdict changes {len(changes)}, power SETs "
                        f"{len(lab.outlet_commands(sets_before))}{memory}",
                        file=sys.stderr,
                        flush=True,
                    )
                time.sleep(1.0)
        finally:
            if stress.poll() is None:
                stress.send_signal(signal.SIGINT)
            stress_out = (stress.communicate(timeout=60)[0] or b"").decode(errors="replace")
            for command in undo:
                subprocess.run(command, capture_output=True)
            drops = dropped(namespaces)
            for relay in relays:
                relay.stop()
        store = session.store()
        incidents = store.list_incidents()
        result = {
            "duration_s": seconds,
            "power_commands": [f"outlet {o} {c}" for o, c in lab.outlet_commands(sets_before)],
            "power_actions_in_history": len(store.actions()),
            "serving_restarts": len(store.serving_restarts(limit=1000)),
            "incidents": [
                {"id": i.id, "kind": i.kind, "nodes": list(i.nodes), "resolution": i.resolution}
                for i in incidents
            ],
            "verdict_changes": changes,
            "verdict_change_counts": dict(Counter(c["to"] for c in changes)),
            "agent_silent_max_s": silent_max,
            "banner_misses_max": misses_max,
            "network": (
                f"netem {' '.join(NETEM)} on both ends of every link"
                if use_netem
                else f"iptables statistic drop {LOSS:.0%} in and out of every node namespace; "
                "relay delay 200 ms +- 100 ms per chunk in each direction"
            ),
            "packets_dropped_per_node": drops,
            "relayed_connections": sum(r.connections for r in relays),
            "status_samples": samples,
            "status_unanswered": unanswered,
            "load1_per_minute": load,
            "stress_ng_args": load_args,
            "stress_ng": stress_out.strip().splitlines()[-12:],
        }
        if guard is not None:
            result["memory_guard"] = guard.to_json()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--json-out", type=Path)
    parser.add_argument(
        "--netem", action="store_true", help="use tc netem (needs the sch_netem module)"
    )
    parser.add_argument(
        "--memory-plateau-gib",
        type=float,
        help="judge the memory guard on this machine's memory: stress-ng holds all but "
        "this many GiB of what is available (below the guard's 6 GiB watch level)",
    )
    args = parser.parse_args(argv)
    why = netns_unavailable()
    if why is not None:
        print(f"false_positive_soak needs network namespaces: {why}", file=sys.stderr)
        return 3
    for tool in ("tc", "stress-ng", "iptables"):
        if shutil.which(tool) is None:
            print(f"false_positive_soak needs {tool}: apt-get install iproute2 stress-ng iptables")
            return 3
    if args.netem and not netem_works():
        print("tc netem is not available here (no sch_netem module): run without --netem")
        return 3
    with tempfile.TemporaryDirectory(prefix="sw-bench-soak-") as tmp:
        result = soak(args.minutes, Path(tmp), args.netem, args.memory_plateau_gib)
    power = len(result["power_commands"]) + result["power_actions_in_history"]
    kills = sum((result.get("memory_guard") or {}).get("guard_kills_per_node", {}).values())
    print(f"soak of {args.minutes:g} min, no fault injected; stress-ng {result['stress_ng_args']}")
    print(f"  network: {result['network']}")
    print(f"  packets dropped per node: {result['packets_dropped_per_node']}")
    print(f"  power commands at the PDU     {len(result['power_commands'])}   (goal 0)")
    print(f"  power actions in the history  {result['power_actions_in_history']}   (goal 0)")
    print(f"  serving restarts              {result['serving_restarts']}   (goal 0)")
    print(f"  incidents                     {len(result['incidents'])}")
    print(f"  verdict changes               {result['verdict_change_counts'] or 0}")
    if "memory_guard" in result:
        memory = result["memory_guard"]
        print(f"  memory guard kills            {kills}   (goal 0)")
        print(
            f"  MemAvailable min {memory['mem_available_min_gib']} GiB, "
            f"{memory['samples_in_judged_zone']} samples under {WATCH_BELOW_GIB:g} GiB, "
            f"PSI full avg10 max {memory['psi_full_avg10_max']}, "
            f"guard states {memory['guard_states_seen']}"
        )
    for node in sorted(result["agent_silent_max_s"]):
        print(
            f"  {node}: longest agent silence {result['agent_silent_max_s'][node]:.1f}s "
            f"(freeze_after 8s), most banner misses {result['banner_misses_max'].get(node, 0)}"
        )
    if args.json_out:
        document = {
            "benchmark": "false_positive_soak",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": machine(),
            "command": " ".join(["python -m bench.false_positive_soak", *(argv or sys.argv[1:])]),
            "settings": {
                "agent": asdict(PRODUCTION_TIMINGS),
                "network": result["network"],
                "stress_ng": result["stress_ng_args"],
                **production_settings(),
            },
            "goals_met": power == 0 and result["serving_restarts"] == 0 and kills == 0,
            **result,
        }
        args.json_out.write_text(json.dumps(document, indent=2) + "\n")
    return 0 if power == 0 and result["serving_restarts"] == 0 and kills == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
