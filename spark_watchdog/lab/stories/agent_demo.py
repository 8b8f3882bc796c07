"""``spark-watchdog lab agent-demo``: the real agent against a simulated rank.

The story, on loopback and in a temporary directory:

1. a vLLM stand-in serves real Prometheus metrics with synthetic load;
2. the node's journal holds real journal files: a clean boot, then a boot
   that froze after Xid 31 and NV_ERR_NO_MEMORY lines, then the current boot;
3. the real agent starts as a subprocess under a real notify socket, and must
   say READY, call serving ``progressing``, and call the previous boot unclean;
4. the engine wedges (counters stop, ``/health`` stays 200): the agent must
   say ``stalled`` about ``stall_after`` later;
5. the engine dies (``/health`` 503): ``dead``; it restarts (counters reset):
   ``progressing`` again, not a stall;
6. SIGTERM: the agent must say STOPPING and exit 0.

It exits 0 only when every step happened.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import requests
import yaml

from spark_watchdog.lab.hardware.journal_writer import Ending, Fault, boot_entries, write_boot
from spark_watchdog.lab.hardware.vllm_standin import VllmStandin
from spark_watchdog.lab.ports import free_port as _free_port


@dataclass
class DemoStep:
    name: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class Timeline:
    started: float = field(default_factory=time.monotonic)
    quiet: bool = False
    steps: list[DemoStep] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"t=+{self.now():5.1f}s {text}", flush=True)

    def record(self, name: str, ok: bool, seconds: float, detail: str = "") -> None:
        self.steps.append(DemoStep(name, ok, seconds, detail))
        mark = "ok " if ok else "FAILED"
        self.say(f"[{mark}] {name} ({seconds:.1f}s){': ' + detail if detail else ''}")


def _write_node(root: Path, node: str, boot_ids: list[str]) -> tuple[Path, Path]:
    """A node's journal (three boots) and a proc tree whose boot id is the last boot."""
    journal = root / "journal"
    start = datetime.now(timezone.utc) - timedelta(hours=30)
    clean, frozen, current = boot_ids
    write_boot(journal, boot_entries(clean, start, hostname=node))
    faults = [Fault.NV_ERR_NO_MEMORY] * 40 + [Fault.XID_31, Fault.NV_ERR_NO_MEMORY]
    write_boot(
        journal,
        boot_entries(
            frozen,
            start + timedelta(hours=6),
            hostname=node,
            faults=faults,
            ending=Ending.POWER_LOSS,
        ),
    )
    write_boot(
        journal,
        boot_entries(
            current,
            start + timedelta(hours=29),
            hostname=node,
            ending=Ending.POWER_LOSS,  # still running: no ending yet
            after_unclean=True,
        ),
    )
    proc = root / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text(str(uuid.UUID(current)) + "\n")
    for name in ("meminfo", "uptime", "loadavg"):
        (proc / name).symlink_to(Path("/proc") / name)
    return journal, proc


class AgentProcess:
    """The real agent as a subprocess, with a notify socket of our own."""

    def __init__(self, config_path: Path, workdir: Path) -> None:
        self.socket_path = workdir / "notify.sock"
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(self.socket_path))
        env = dict(os.environ, NOTIFY_SOCKET=str(self.socket_path), WATCHDOG_USEC="4000000")
        env.pop("JOURNAL_STREAM", None)
        self.log_path = workdir / "agent.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "spark_watchdog", "agent", "--config", str(config_path)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.messages: list[str] = []

    def drain(self) -> list[str]:
        new: list[str] = []
        self.notify.setblocking(False)
        while True:
            try:
                new.append(self.notify.recv(4096).decode())
            except BlockingIOError:
                break
        self.messages.extend(new)
        return new

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.notify.close()
        self._log.close()


def _state(base: str) -> dict[str, Any] | None:
    try:
        answer = requests.get(f"{base}/v1/state", timeout=1.0)
        answer.raise_for_status()
        body: dict[str, Any] = answer.json()
        return body
    except (requests.RequestException, ValueError):
        return None


def _wait_for(
    timeline: Timeline,
    what: str,
    check: Callable[[], bool],
    timeout: float,
) -> tuple[bool, float]:
    started = time.monotonic()
    last_note = started
    while time.monotonic() - started < timeout:
        if check():
            return True, time.monotonic() - started
        if time.monotonic() - last_note >= 5:
            timeline.say(f"… waiting for {what} ({time.monotonic() - started:.0f}s)")
            last_note = time.monotonic()
        time.sleep(0.25)
    return False, time.monotonic() - started


def run_demo(stall_after: float, workdir: Path, quiet: bool = False) -> Timeline:
    timeline = Timeline(quiet=quiet)
    node = "spark-1"
    boot_ids = [uuid.uuid4().hex for _ in range(3)]
    journal, proc = _write_node(workdir, node, boot_ids)
    timeline.say(f"{node}: journal with 3 boots in {journal} (boot 2 froze after Xid 31)")
    port = _free_port()
    with VllmStandin(model="deepseek-v4.1-flash") as vllm:
        timeline.say(f"vLLM stand-in at {vllm.url}: requests running, engine stepping")
        config = {
            "node": node,
            "listen": {"address": "127.0.0.1", "port": port},
            "loop_interval": 0.5,
            "probes": {
                "vllm": {
                    "url": vllm.url,
                    "interval": 0.5,
                    "timeout": 1.0,
                    "stall_after": stall_after,
                },
                "gpu": {"interval": 2.0, "deadline": 3.0},
                "journal": {"directory": str(journal), "interval": 30.0},
                "host": {"proc_root": str(proc)},
            },
        }
        config_path = workdir / "agent.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        base = f"http://127.0.0.1:{port}"
        agent = AgentProcess(config_path, workdir)
        try:
            _story(timeline, agent, vllm, base, stall_after, boot_ids)
        finally:
            agent.close()
    return timeline


def _story(
    timeline: Timeline,
    agent: AgentProcess,
    vllm: VllmStandin,
    base: str,
    stall_after: float,
    boot_ids: list[str],
) -> None:
    ok, took = _wait_for(
        timeline, "READY=1 from the agent", lambda: _notified(agent, "READY=1"), 60
    )
    status = next((m for m in agent.messages if "READY=1" in m), "").replace("\n", " ")
    timeline.record("agent sent READY=1 after its first probe round", ok, took, status)
    if not ok:
        return
    ok, took = _wait_for(
        timeline, "progressing", lambda: _vllm_state(agent, base) == "progressing", 15
    )
    timeline.record("serving is progressing", ok, took)
    _check_first_look(timeline, base, boot_ids)
    _engine_faults(timeline, agent, vllm, base, stall_after)
    _check_heartbeat(timeline, agent, base)
    _check_sigterm(timeline, agent)


def _notified(agent: AgentProcess, word: str) -> bool:
    agent.drain()
    return any(word in m for m in agent.messages)


def _vllm_state(agent: AgentProcess, base: str) -> str | None:
    agent.drain()  # keep the notify queue empty, as systemd would
    snap = _state(base)
    return None if snap is None else str(snap["probes"]["vllm"]["state"])


def _check_first_look(timeline: Timeline, base: str, boot_ids: list[str]) -> None:
    """What the agent saw on its own: the GPU, and the previous boot's unclean end."""
    snap = _state(base) or {}
    probes = snap.get("probes", {})
    gpu = probes.get("gpu", {})
    timeline.say(f"gpu: {gpu.get('state')} ({gpu.get('error') or 'NVML answered'})")
    boots = requests.get(f"{base}/v1/boots", timeout=2).json()
    previous = next((b for b in boots.get("boots", []) if b["boot_id"] == boot_ids[1]), None)
    evidence = {} if previous is None else previous.get("evidence_counts", {})
    unclean = previous is not None and previous.get("clean_shutdown") is False
    timeline.record(
        "journal: the previous boot ended uncleanly",
        unclean,
        0.0,
        f"evidence {json.dumps(evidence, sort_keys=True)}",
    )


def _engine_faults(
    timeline: Timeline, agent: AgentProcess, vllm: VllmStandin, base: str, stall_after: float
) -> None:
    """The engine wedges, dies and restarts; the agent must call each."""

    def vllm_state() -> str | None:
        return _vllm_state(agent, base)

    timeline.say("fault: the engine wedges (counters frozen, requests running, /health 200)")
    vllm.set_mode("wedged")
    ok, took = _wait_for(timeline, "stalled", lambda: vllm_state() == "stalled", stall_after + 15)
    timeline.record(f"agent says stalled (stall_after {stall_after:g}s)", ok, took)

    timeline.say("fault: the engine dies (/health 503)")
    vllm.set_mode("dead")
    ok, took = _wait_for(timeline, "dead", lambda: vllm_state() == "dead", 10)
    timeline.record("agent says dead", ok, took)

    timeline.say("serving restarts (counters back at zero)")
    vllm.set_mode("restart")
    ok, took = _wait_for(timeline, "progressing", lambda: vllm_state() == "progressing", 15)
    timeline.record("agent says progressing again; the counter reset is no stall", ok, took)


def _check_heartbeat(timeline: Timeline, agent: AgentProcess, base: str) -> None:
    """The main loop advances and pets the systemd watchdog."""
    seq_before = (_state(base) or {}).get("seq", 0)
    time.sleep(1.2)
    seq_after = (_state(base) or {}).get("seq", 0)
    timeline.record("seq advances", seq_after > seq_before, 1.2, f"{seq_before} → {seq_after}")
    agent.drain()
    watchdog_pets = sum("WATCHDOG=1" in m for m in agent.messages)
    timeline.record(
        "agent pets the systemd watchdog", watchdog_pets > 0, 0.0, f"{watchdog_pets} times"
    )


def _check_sigterm(timeline: Timeline, agent: AgentProcess) -> None:
    """SIGTERM: the agent says STOPPING=1 and exits 0."""
    agent.process.send_signal(signal.SIGTERM)
    try:
        code = agent.process.wait(15)
    except subprocess.TimeoutExpired:
        code = None
    stopping = _notified(agent, "STOPPING=1")
    timeline.record(
        "SIGTERM: STOPPING=1 and exit 0", code == 0 and stopping, 0.0, f"exit code {code}"
    )


def run(args: argparse.Namespace) -> int:
    if not 1.0 <= args.stall_after <= 120.0:
        print("--stall-after: expected seconds between 1 and 120", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="spark-watchdog-demo-"))
    timeline = run_demo(args.stall_after, workdir, quiet=args.json)
    passed = bool(timeline.steps) and all(step.ok for step in timeline.steps)
    if args.json:
        print(
            json.dumps(
                {
                    "passed": passed,
                    "workdir": str(workdir),
                    "steps": [vars(step) for step in timeline.steps],
                },
                indent=2,
            )
        )
    else:
        failed = [s.name for s in timeline.steps if not s.ok]
        verdict = "all steps passed" if passed else f"FAILED: {', '.join(failed)}"
        print(f"demo: {verdict}; agent log and journal in {workdir}")
    if not args.keep and passed:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if passed else 1
