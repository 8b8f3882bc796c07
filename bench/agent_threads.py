"""Where the agent's CPU goes: per thread, over one minute, at production
defaults (the set-up of ``bench.agent_cost``: the vLLM stand-in, a journal
directory of 10 boots, /v1/state pulled every second, /metrics every 15 s).

    .venv/bin/python -m bench.agent_threads --seconds 60

The main thread runs the heartbeat and the probes (asyncio); the HTTP
server answers each request on a short-lived thread of its own, so the
process total is more than the threads alive at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests
import yaml

from bench.agent_cost import _free_port, _write_journal
from spark_watchdog.lab.hardware.vllm_standin import VllmStandin


def measure(seconds: float) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix="sw-bench-threads-"))
    journal = _write_journal(workdir / "journal", boots=10, lines_per_boot=500)
    port = _free_port()
    with VllmStandin(model="bench-model") as vllm:
        config = {
            "node": "bench-1",
            "listen": {"address": "127.0.0.1", "port": port},
            "probes": {"vllm": {"url": vllm.url}, "journal": {"directory": journal}},
        }
        (workdir / "agent.yaml").write_text(yaml.safe_dump(config))
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spark_watchdog",
                "agent",
                "--config",
                str(workdir / "agent.yaml"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(8)  # start-up and the first probe round
            process = psutil.Process(agent.pid)
            before = {t.id: t.user_time + t.system_time for t in process.threads()}
            cpu0, wall0 = sum(process.cpu_times()[:2]), time.monotonic()
            pulls = 0
            while time.monotonic() - wall0 < seconds:
                requests.get(f"http://127.0.0.1:{port}/v1/state", timeout=2)
                pulls += 1
                if pulls % 15 == 0:
                    requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2)
                time.sleep(1)
            cpu1, wall1 = sum(process.cpu_times()[:2]), time.monotonic()
            after = {t.id: t.user_time + t.system_time for t in process.threads()}
        finally:
            agent.terminate()
            agent.wait(20)
    main_s = after.get(agent.pid, 0.0) - before.get(agent.pid, 0.0)
    others = sum(v - before.get(k, 0.0) for k, v in after.items() if k != agent.pid)
    total = cpu1 - cpu0
    return {
        "seconds": round(wall1 - wall0, 1),
        "process_cpu_percent": round(100 * total / (wall1 - wall0), 3),
        "main_thread_cpu_s": round(main_s, 3),
        "other_live_threads_cpu_s": round(others, 3),
        "exited_threads_cpu_s": round(total - main_s - others, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    result = measure(args.seconds)
    for key, value in result.items():
        print(f"{key:<28} {value}")
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
