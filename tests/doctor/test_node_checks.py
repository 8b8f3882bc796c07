"""NVML through the agent's own worker (this machine's real no-driver path, and the
lab's NVML stand-in answering or hanging), and vLLM through the agent's scraper."""

from __future__ import annotations

import asyncio
import ctypes.util
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from spark_watchdog.config.agent import AgentConfig, parse_agent_config
from spark_watchdog.doctor.node_checks import check_gpu, check_vllm
from spark_watchdog.lab.hardware import gpu_standin
from spark_watchdog.lab.hardware.vllm_standin import VllmStandin
from spark_watchdog.lab.ports import free_port

pytestmark = pytest.mark.integration

no_nvidia_driver = pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None,
    reason="this machine has an NVIDIA driver",
)


def _agent(**probes: object) -> AgentConfig:
    return parse_agent_config({"node": "spark-1", "probes": probes})


def _serving_agent(tmp_path: Path, **probes: object) -> AgentConfig:
    return parse_agent_config(
        {
            "node": "spark-1",
            "probes": probes,
            "serving": {
                "enabled": True,
                "command": ["vllm", "serve", "m"],
                "token_file": str(tmp_path / "token"),
                "log_file": str(tmp_path / "serving.log"),
            },
        }
    )


@pytest.fixture
def nvml_standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The lab's NVML stand-in installed as ``pynvml`` ahead of the real one, the way
    the lab installs it for its nodes; returns the node directory holding gpu.json."""
    modules = tmp_path / "nvml"
    modules.mkdir()
    shutil.copyfile(gpu_standin.__file__, modules / "pynvml.py")
    node = tmp_path / "node"
    node.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(modules))
    monkeypatch.setenv("SPARK_WATCHDOG_NODE_DIR", str(node))
    return node


@no_nvidia_driver
def test_no_driver_fails_on_a_serving_node(tmp_path: Path) -> None:
    found = asyncio.run(check_gpu(_serving_agent(tmp_path)))
    assert found.status == "fail"
    assert "no NVIDIA driver" in found.detail and "serving.enabled" in found.detail


@no_nvidia_driver
def test_no_driver_only_warns_where_nothing_is_served() -> None:
    assert asyncio.run(check_gpu(_agent())).status == "warn"


def test_nvml_answering_within_its_deadline(nvml_standin: Path) -> None:
    gpu_standin.write_mode(nvml_standin, "ok")
    found = asyncio.run(check_gpu(_agent(gpu={"deadline": 5.0})))
    assert found.status == "ok", found
    assert "NVIDIA GB10" in found.detail and "deadline: 5 s" in found.detail


def test_nvml_hanging_fails_at_the_agents_deadline(nvml_standin: Path) -> None:
    gpu_standin.write_mode(nvml_standin, "hang")
    started = time.monotonic()
    found = asyncio.run(check_gpu(_agent(gpu={"deadline": 1.0})))
    # A fresh NVML worker: 1 s to read plus GpuProbe.start_allowance_s to start.
    assert time.monotonic() - started < 15.0
    assert found.status == "fail"
    assert "did not answer within 6 s" in found.detail and "wedged" in found.detail


def test_a_disabled_gpu_probe_is_skipped() -> None:
    assert asyncio.run(check_gpu(_agent(gpu={"enabled": False}))).status == "skip"


# -- vLLM -----------------------------------------------------------------------------


@pytest.fixture
def vllm() -> Iterator[VllmStandin]:
    with VllmStandin() as standin:
        yield standin


def test_vllm_answers_with_the_metrics_the_stall_rule_needs(vllm: VllmStandin) -> None:
    found = check_vllm(_agent(vllm={"url": vllm.url}))
    assert found.status == "ok", found
    assert "standin-model" in found.detail and "vllm:iteration_tokens_total_count" in found.detail


def test_a_dead_engine_fails(vllm: VllmStandin) -> None:
    vllm.set_mode("dead")
    found = check_vllm(_agent(vllm={"url": vllm.url}))
    assert found.status == "fail" and "503" in found.detail


def test_nothing_listening_fails() -> None:
    port = free_port()
    found = check_vllm(_agent(vllm={"url": f"http://127.0.0.1:{port}"}))
    assert found.status == "fail" and "connection refused" in found.detail


class _OldVllm(BaseHTTPRequestHandler):
    """A vLLM without the engine-step histogram: only running and generated tokens."""

    body = (
        b'vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
        b'vllm:generation_tokens_total{engine="0",model_name="m"} 1234.0\n'
    )

    def do_GET(self) -> None:
        body = b"" if self.path == "/health" else self.body
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


def test_a_vllm_without_the_engine_step_heartbeat_warns() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OldVllm)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        found = check_vllm(_agent(vllm={"url": f"http://127.0.0.1:{server.server_address[1]}"}))
    finally:
        server.shutdown()
        server.server_close()
    assert found.status == "warn"
    assert "no vllm:iteration_tokens_total_count" in found.detail


def test_a_headless_rank_is_skipped() -> None:
    assert check_vllm(_agent(vllm={"url": None})).status == "skip"


def test_the_peers_check_asks_each_peer_s_pulse() -> None:
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from spark_watchdog.config.agent import parse_agent_config
    from spark_watchdog.doctor.node_checks import check_peer_pulses
    from spark_watchdog.lab.ports import free_port

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"node": "spark-2", "seq": 7, "boot_id": "a" * 32}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:

        def config(peers: list[dict[str, str]], listen: str = "10.0.0.1") -> AgentConfig:
            return parse_agent_config(
                {"node": "spark-1", "listen": {"address": listen}, "peers": peers}
            )

        assert check_peer_pulses(config([])).status == "skip"
        found = check_peer_pulses(config([{"name": "spark-2", "url": url}]))
        assert found.status == "ok", found
        wrong = check_peer_pulses(config([{"name": "spark-3", "url": url}]))
        assert wrong.status == "fail" and "spark-2" in wrong.detail, wrong
        silent = f"http://127.0.0.1:{free_port()}"
        assert check_peer_pulses(config([{"name": "spark-4", "url": silent}])).status == "warn"
        same = check_peer_pulses(config([{"name": "spark-2", "url": url}], listen="127.0.0.1"))
        assert same.status == "warn" and "management address" in same.detail, same
    finally:
        server.shutdown()
        server.server_close()
