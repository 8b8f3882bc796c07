"""The controller with a real vLLM head: ``lab run --scenario wedge --vllm real``.

The head's engine process is stopped while the lab's traffic runs; the agent's
probe calls it stalled, the controller restarts serving on every node with the
safe profile (the real server stops and starts again), and the incident ends
recovered without a single power command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from spark_watchdog.lab.hardware.real_vllm import PYTHON_VARIABLE


def test_a_wedged_real_engine_is_recovered_by_a_serving_restart_without_power(
    vllm_python: Path, tmp_path: Path
) -> None:
    command = [
        sys.executable,
        "-m",
        "spark_watchdog",
        "lab",
        "run",
        "--scenario",
        "wedge",
        "--vllm",
        "real",
        "--nodes",
        "2",
        "--dir",
        str(tmp_path / "lab"),
        "--json",
    ]
    lab = subprocess.Popen(
        command,
        env={**os.environ, PYTHON_VARIABLE: str(vllm_python)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = lab.communicate(timeout=1500)
    except subprocess.TimeoutExpired:
        # SIGTERM: the lab stops every process it started (its ranks included).
        os.killpg(lab.pid, signal.SIGTERM)
        stdout, stderr = lab.communicate(timeout=120)
        pytest.fail(f"the lab run did not end within 1500 s:\n{stderr[-4000:]}")
    done = subprocess.CompletedProcess(command, lab.returncode, stdout, stderr)
    story = done.stderr[-4000:]
    assert done.returncode == 0, story
    result = json.loads(done.stdout)
    assert result["outcome"] == "recovered", story
    assert result["power_actions"] == 0 and result["pdu_commands"] == [], story
    assert result["serving_restarts"] == 1, story
    assert "the real vLLM server" in done.stderr
    # The real engine runs no CUDA graphs: the restart says so rather than "confirmed".
    assert "differs from profile safe but is as safe (cudagraph_mode NONE)" in done.stderr, story
    serving_log = (tmp_path / "lab" / "nodes" / "spark-1" / "serving.log").read_text()
    assert serving_log.count("starting the rank with profile") == 2
    assert "vllm.entrypoints.openai.api_server" in serving_log
