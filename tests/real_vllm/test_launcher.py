"""The agent's serving launcher running the real server: plain, then safe, then
the memory guard's kill.

The profile's argv merge must be accepted by vLLM's real argument parser, the
effective config must be read from the real engine's startup line, and the
launcher must not call a profile confirmed when the build cannot honour it:
the CPU build runs no CUDA graphs (``cudagraph_mode`` NONE) whatever is asked.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import requests
from real_vllm_tier import wait_serving

from spark_watchdog.agent.memory_watch import MemoryWatch
from spark_watchdog.agent.serving import ServingLauncher
from spark_watchdog.config.agent import MemoryGuardConfig, parse_agent_config
from spark_watchdog.lab.hardware.real_vllm import RealHead, server_processes
from spark_watchdog.lab.ports import free_port
from spark_watchdog.probes.host import HostReading

GIB = 1024**3

START_TIMEOUT = 420.0


def _launcher(vllm_python: Path, tiny_model: Path, tmp_path: Path, port: int) -> ServingLauncher:
    head = RealHead(vllm_python, tiny_model)
    token = tmp_path / "serving-token"
    token.write_text("a-token\n")
    token.chmod(0o600)
    config = parse_agent_config(
        {
            "node": "spark-1",
            "serving": {
                "enabled": True,
                "command": head.command("127.0.0.1", port),
                "environment": head.environment(),
                "log_file": str(tmp_path / "serving.log"),
                "token_file": str(token),
                "stop_timeout": 15.0,
            },
        }
    )
    return ServingLauncher(config.serving, process_match=head.process_match("127.0.0.1", port))


def test_plain_then_safe_on_the_real_server(
    vllm_python: Path, tiny_model: Path, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    launcher = _launcher(vllm_python, tiny_model, tmp_path, port)
    try:
        plain = launcher.start("plain")
        assert plain["profile"] == "plain"
        plain = wait_serving(launcher, url, START_TIMEOUT)
        assert plain["requested"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
        # Read from the real "Initializing a V1 LLM engine ... with config:" line.
        assert plain["effective"]["cudagraph_mode"] == "NONE"
        assert plain["effective_matches_profile"] is False
        assert plain["effective_safe"] is True  # no CUDA graphs at all

        stopped = launcher.stop()
        assert stopped["state"] == "stopped" and not stopped["group_alive"], stopped
        # The stacks were taken before the stop: a stack, or why not, per process.
        taken = stopped["stacks"]["processes"]
        assert taken and all("stack" in t or "error" in t for t in taken), stopped["stacks"]

        safe = launcher.start("safe")
        argv = safe["argv"]
        # The merge: the operator's flag rewritten in place, once.
        assert argv.count("--compilation-config") == 1
        merged = json.loads(argv[argv.index("--compilation-config") + 1])
        assert merged == {"cudagraph_mode": "FULL_DECODE_ONLY"}
        safe = wait_serving(launcher, url, START_TIMEOUT)  # vLLM's parser took the merged argv
        assert safe["requested"]["cudagraph_mode"] == "FULL_DECODE_ONLY"
        assert safe["effective"]["cudagraph_mode"] == "NONE"
        # Never "confirmed" when the build runs something else than the profile asks.
        assert safe["effective_matches_profile"] is False
        assert safe["effective_safe"] is True
        answer = requests.post(
            f"{url}/v1/completions",
            json={"model": "tiny", "prompt": "The watchdog", "max_tokens": 4},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        _memory_guard_ends_the_rank(launcher, safe)
    finally:
        launcher.stop()
    log = (tmp_path / "serving.log").read_text(errors="replace")
    assert log.count("starting the rank with profile") == 2


def _memory_guard_ends_the_rank(launcher: ServingLauncher, serving: dict[str, Any]) -> None:
    """MemAvailable falling 1 GiB/s: the memory guard's kill ends the whole real
    rank (API server, engine core, workers) at once, without a stop."""
    tree = server_processes(serving["pid"])
    ranks = [p for p in (tree.api_server, tree.engine, *tree.workers) if p is not None]
    assert len(ranks) >= 3, tree
    watch = MemoryWatch(MemoryGuardConfig(), launcher=launcher, process_match=None)
    for t in range(30):
        reading = HostReading(
            state="ok",
            boot_id=None,
            uptime_s=None,
            mem_available_bytes=(12 - t) * GIB,
            mem_total_bytes=119 * GIB,
            mem_available_trend_bytes_per_s=None,
            load1=None,
            loop_lag_s=0.0,
        )
        if watch.observe(reading, float(t)).trip:
            break
    kill = watch.last_kill
    assert kill is not None and kill["result"] == "killed", kill
    assert kill["killed"][0]["pgid"] == serving["pgid"]
    deadline = time.monotonic() + 20.0
    # Every process of the group goes (the resource tracker too), not only these three.
    while launcher.status()["group_alive"]:
        assert time.monotonic() < deadline, [p.pid for p in ranks if p.is_running()]
        time.sleep(0.1)
    assert not any(p.is_running() and p.status() != "zombie" for p in ranks)
    assert launcher.status()["killed_by"] == "memory_guard"
