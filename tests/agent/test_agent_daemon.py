"""The agent end to end, in-process: real HTTP, real notify socket, real children."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import io
import json
import re
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from spark_watchdog.agent.daemon import Agent
from spark_watchdog.agent.probe_runner import Observation, ProbeFailure
from spark_watchdog.config.agent import AgentConfig, parse_agent_config
from spark_watchdog.errors import ConfigError
from spark_watchdog.lab.hardware.journal_writer import Ending, Fault, boot_entries, write_boot
from spark_watchdog.lab.hardware.vllm_standin import VllmStandin
from spark_watchdog.lab.ports import free_port as _free_port
from spark_watchdog.sdnotify import SystemdNotifier

pytestmark = pytest.mark.integration

HANGING_WORKER = """
import sys, time
sys.stdin.readline()
time.sleep(3600)
"""


@pytest.fixture(scope="module")
def node_tree(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    root = tmp_path_factory.mktemp("node")
    boots = [uuid.uuid4().hex for _ in range(2)]
    start = datetime.now(timezone.utc) - timedelta(hours=5)
    journal = root / "journal"
    write_boot(
        journal,
        boot_entries(boots[0], start, faults=[Fault.XID_31], ending=Ending.POWER_LOSS),
    )
    write_boot(
        journal,
        boot_entries(
            boots[1], start + timedelta(hours=1), ending=Ending.POWER_LOSS, after_unclean=True
        ),
    )
    proc = root / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "sys/kernel/random/boot_id").write_text(str(uuid.UUID(boots[1])) + "\n")
    for name in ("meminfo", "uptime", "loadavg"):
        (proc / name).symlink_to(Path("/proc") / name)
    return journal, proc, boots


@pytest.fixture
def vllm() -> Iterator[VllmStandin]:
    with VllmStandin() as standin:
        yield standin


def _config(
    vllm_url: str,
    journal: Path,
    proc: Path,
    journal_interval: float,
    canary: bool,
    vllm_extra: dict[str, Any] | None = None,
) -> AgentConfig:
    vllm: dict[str, Any] = {"url": vllm_url, "interval": 0.3, "timeout": 1.0, "stall_after": 2.0}
    if canary:
        vllm["canary"] = {"enabled": True, "timeout": 1.0, "min_interval": 0.0}
    vllm.update(vllm_extra or {})
    return parse_agent_config(
        {
            "node": "spark-2",
            "listen": {"address": "127.0.0.1", "port": _free_port()},
            "loop_interval": 0.2,
            "probes": {
                "vllm": vllm,
                "gpu": {"interval": 0.5, "deadline": 1.0},
                "journal": {"directory": str(journal), "interval": journal_interval},
                "host": {"proc_root": str(proc)},
            },
        }
    )


class RunningAgent:
    """Runs an Agent on its own event loop in a thread."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.loop = asyncio.new_event_loop()
        self.stop = asyncio.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        async def go() -> None:
            await self.agent.run(self.stop)

        try:
            self.loop.run_until_complete(go())
        except BaseException as exc:
            self.error = exc

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.agent.config.listen.port}"

    def state(self) -> dict[str, Any]:
        body: dict[str, Any] = requests.get(f"{self.base}/v1/state", timeout=2).json()
        return body

    def wait(self, check: Callable[[], bool], timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if check():
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.1)
        return False

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        # Generous: the suite runs beside the simulation's pool on a loaded
        # 2-core machine, and a stop kills and reaps a hung NVML worker.
        self.thread.join(90)
        assert not self.thread.is_alive(), "agent did not stop:\n" + self._where()

    def _where(self) -> str:
        """Where every thread and every task of the agent's loop stands (a stop that hangs)."""
        with tempfile.TemporaryFile("w+") as threads:
            faulthandler.dump_traceback(threads)
            threads.seek(0)
            out = [threads.read()]
        for task in asyncio.all_tasks(self.loop):
            stack = io.StringIO()
            task.print_stack(file=stack)
            out.append(f"{task!r}\n{stack.getvalue()}")
        return "\n".join(out)
        assert self.error is None, self.error


@pytest.fixture
def running(
    vllm: VllmStandin, node_tree: tuple[Path, Path, list[str]], tmp_path: Path
) -> Iterator[Callable[..., RunningAgent]]:
    started: list[RunningAgent] = []

    def start(
        notifier: SystemdNotifier | None = None,
        hang_gpu: bool = False,
        journal_interval: float = 5.0,
        canary: bool = False,
        vllm_extra: dict[str, Any] | None = None,
    ) -> RunningAgent:
        journal, proc, _ = node_tree
        argv = None
        if hang_gpu:
            script = tmp_path / "hanging_worker.py"
            script.write_text(HANGING_WORKER)
            argv = [sys.executable, str(script)]
        agent = Agent(
            _config(vllm.url, journal, proc, journal_interval, canary, vllm_extra),
            notifier=notifier or SystemdNotifier({}),
            gpu_worker_argv=argv,
        )
        handle = RunningAgent(agent)
        started.append(handle)
        assert handle.wait(lambda: handle.agent.ready.is_set(), 30), "agent never became ready"
        return handle

    yield start
    for handle in started:
        handle.close()


def test_state_snapshot_contract(
    running: Callable[..., RunningAgent], node_tree: tuple[Path, Path, list[str]]
) -> None:
    agent = running()
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] == "progressing")
    first = agent.state()
    assert first["node"] == "spark-2"
    assert first["boot_id"] == node_tree[2][1]
    assert first["version"]
    datetime.fromisoformat(first["started_at"])
    for probe in ("vllm", "gpu", "journal", "host"):
        body = first["probes"][probe]
        assert isinstance(body["state"], str)
        datetime.fromisoformat(body["observed_at"])
    assert first["probes"]["gpu"]["state"] in {"ok", "unavailable"}
    assert first["probes"]["journal"]["previous_boot_clean_shutdown"] is False
    assert first["probes"]["host"]["mem_available_bytes"] > 0
    time.sleep(0.6)
    assert agent.state()["seq"] > first["seq"], "seq must advance every loop"


def test_boots_endpoint_serves_the_journal_analysis(
    running: Callable[..., RunningAgent], node_tree: tuple[Path, Path, list[str]]
) -> None:
    agent = running()
    boots = requests.get(f"{agent.base}/v1/boots", timeout=2).json()["boots"]
    assert [b["boot_id"] for b in boots] == node_tree[2]
    assert boots[0]["clean_shutdown"] is False
    assert any(e["kind"] == "xid" for e in boots[0]["evidence"])
    assert boots[1]["current"] is True and boots[1]["clean_shutdown"] is None


def test_metrics_endpoint_is_valid_exposition(running: Callable[..., RunningAgent]) -> None:
    agent = running()
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] == "progressing")
    text = requests.get(f"{agent.base}/metrics", timeout=2).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    key = (
        "spark_watchdog_probe_state",
        (("node", "spark-2"), ("probe", "vllm"), ("state", "progressing")),
    )
    assert samples[key] == 1.0
    assert samples[("spark_watchdog_agent_loops_total", (("node", "spark-2"),))] >= 1
    assert samples[("spark_watchdog_journal_previous_boot_clean", (("node", "spark-2"),))] == 0
    assert ("spark_watchdog_host_mem_available_bytes", (("node", "spark-2"),)) in samples


def test_unknown_path_is_a_clear_404(running: Callable[..., RunningAgent]) -> None:
    agent = running()
    answer = requests.get(f"{agent.base}/v2/nothing", timeout=2)
    assert answer.status_code == 404
    assert "no such path /v2/nothing" in answer.json()["error"]


def test_a_wedged_gpu_never_delays_the_heartbeat_or_the_other_probes(
    running: Callable[..., RunningAgent], vllm: VllmStandin
) -> None:
    agent = running(hang_gpu=True)
    assert agent.state()["probes"]["gpu"]["state"] == "timeout"
    seq_before = agent.state()["seq"]
    vllm.set_mode("wedged")
    # stall_after is 2 s: the vllm probe must keep its own schedule.
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] == "stalled", 30)
    snap = agent.state()
    assert snap["probes"]["gpu"]["state"] == "timeout"
    assert "did not answer" in snap["probes"]["gpu"]["error"]
    # loop_interval is 0.2 s: over >2 s the heartbeat advanced about 10 times.
    assert snap["seq"] - seq_before >= 8


def test_watchdog_is_petted_only_while_the_loop_is_healthy(
    running: Callable[..., RunningAgent], tmp_path: Path
) -> None:
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.1)
    notifier = SystemdNotifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000"})

    def messages(seconds: float) -> list[str]:
        got: list[str] = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                got.append(sock.recv(4096).decode())
        return got

    try:
        # The journal probe reports once at start, then not for a minute.
        agent = running(notifier=notifier, journal_interval=60.0)
        healthy = messages(1.5)
        assert any(m.startswith("READY=1") for m in healthy)
        assert sum(m == "WATCHDOG=1" for m in healthy) >= 3  # every ~0.2 s
        # A probe that stopped reporting long ago means a stuck task.
        journal = agent.agent.runners["journal"]
        stale = Observation(ProbeFailure("timeout", "stuck"), time.time() - 10_000, 0.0)
        agent.loop.call_soon_threadsafe(setattr, journal, "latest", stale)
        time.sleep(0.3)
        messages(0.3)  # drop what was sent before the stale report took effect
        stuck = messages(1.5)
        assert not any(m == "WATCHDOG=1" for m in stuck), stuck
        assert agent.state()["healthy"] is False
    finally:
        sock.close()


def test_canary_is_sent_when_a_stall_is_suspected(
    running: Callable[..., RunningAgent], vllm: VllmStandin
) -> None:
    agent = running(canary=True)
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] == "progressing")
    assert agent.state()["probes"]["vllm"]["canary"] is None  # no suspicion, no canary
    vllm.set_mode("wedged")

    def canary_outcome() -> str | None:
        canary = agent.state()["probes"]["vllm"]["canary"]
        return None if canary is None else str(canary["outcome"])

    # A wedged engine never answers the 1-token request: the canary times out.
    assert agent.wait(lambda: canary_outcome() == "timeout", 10)
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] == "stalled", 30)


def test_a_head_that_served_and_now_refuses_is_dead(
    running: Callable[..., RunningAgent], vllm: VllmStandin
) -> None:
    # No launcher and no process_match: vLLM runs under docker or its own unit.
    agent = running(vllm_extra={"dead_after": 1.0})
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] == "progressing")
    port = vllm.url.rsplit(":", 1)[1]
    vllm.set_mode("exit")  # EngineDeadError, then the API server exits

    def refused_reason() -> bool:
        body = agent.state()["probes"]["vllm"]
        return body["state"] == "dead" and "refuses" in body["reason"]

    assert agent.wait(refused_reason, 15)
    vllm_state = agent.state()["probes"]["vllm"]
    assert re.fullmatch(
        r"vLLM answered until \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ and now refuses connections "
        rf"on port {port} \(for \d+\.\d s, dead_after 1 s\): its API server is gone",
        vllm_state["reason"],
    ), vllm_state["reason"]
    assert vllm_state["process_alive"] is None


def test_an_idle_head_gets_a_canary_and_an_idle_hang_is_a_stall(
    running: Callable[..., RunningAgent], vllm: VllmStandin
) -> None:
    vllm.set_mode("idle")
    agent = running(vllm_extra={"stall_after": 3.0, "canary": {"timeout": 1.0, "idle_after": 1.0}})

    def vllm_state() -> dict[str, Any]:
        body: dict[str, Any] = agent.state()["probes"]["vllm"]
        return body

    # Idle: canaries are sent by default, and answered.
    assert agent.wait(lambda: vllm.snapshot()["completions"] >= 1, 15)
    assert agent.wait(lambda: (vllm_state()["canary"] or {}).get("outcome") == "ok")
    assert vllm_state()["state"] == "idle"

    vllm.set_mode("hung")  # nothing runs, nothing steps, new requests queue as waiting
    assert agent.wait(lambda: vllm_state()["state"] == "stalled", 20)
    reason = vllm_state()["reason"]
    assert (
        "1 request(s) waiting and none running and no engine step" in reason
        or "the canary (a 1-token completion) got no answer within 1.0 s" in reason
    ), reason


def test_no_canary_while_traffic_flows(
    running: Callable[..., RunningAgent], vllm: VllmStandin
) -> None:
    agent = running(vllm_extra={"canary": {"timeout": 1.0, "idle_after": 0.5}})
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] == "progressing")
    time.sleep(3.0)
    assert vllm.snapshot()["completions"] == 0
    assert agent.state()["probes"]["vllm"]["canary"] is None


# --- serving control over HTTP ------------------------------------------------------

TOKEN = "t0ken-" + uuid.uuid4().hex
ADAPTIVE_ON = '{"method":"dspark","num_speculative_tokens":5,"enable_adaptive_verification":true}'


def _serving_config(tmp_path: Path, vllm_port: int) -> AgentConfig:
    token_file = tmp_path / "serving-token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    return parse_agent_config(
        {
            "node": "spark-1",
            "listen": {"address": "127.0.0.1", "port": _free_port()},
            "loop_interval": 0.2,
            "probes": {
                "vllm": {
                    "url": f"http://127.0.0.1:{vllm_port}",
                    "interval": 0.3,
                    "timeout": 1.0,
                    "stall_after": 2.0,
                    "dead_after": 0.5,
                },
                "gpu": {"enabled": False},
                "journal": {"enabled": False},
            },
            "serving": {
                "enabled": True,
                "command": [
                    sys.executable,
                    "-m",
                    "spark_watchdog.lab.hardware",
                    "vllm",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(vllm_port),
                    "--speculative-config",
                    ADAPTIVE_ON,
                ],
                "token_file": str(token_file),
                "log_file": str(tmp_path / "serving.log"),
                "stop_timeout": 5.0,
            },
        }
    )


@pytest.fixture
def serving_agent(tmp_path: Path) -> Iterator[RunningAgent]:
    agent = Agent(_serving_config(tmp_path, _free_port()), notifier=SystemdNotifier({}))
    handle = RunningAgent(agent)
    assert handle.wait(lambda: handle.agent.ready.is_set(), 30), "agent never became ready"
    yield handle
    assert agent.serving is not None
    agent.serving.stop()
    handle.close()


def _post(
    agent: RunningAgent, path: str, body: Any = None, token: str | None = TOKEN, **kw: Any
) -> requests.Response:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    return requests.post(f"{agent.base}{path}", json=body, headers=headers, timeout=15, **kw)


def test_serving_posts_need_the_bearer_token(serving_agent: RunningAgent) -> None:
    agent = serving_agent
    for path in ("/v1/serving/start", "/v1/serving/stop", "/v1/serving/canary"):
        missing = _post(agent, path, {}, token=None)
        wrong = _post(agent, path, {}, token=TOKEN + "x")
        for answer in (missing, wrong):
            assert answer.status_code == 401, (path, answer.text)
            assert answer.headers["WWW-Authenticate"].startswith("Bearer")
            assert TOKEN not in answer.text
            assert answer.json()["error"]
        basic = requests.post(f"{agent.base}{path}", auth=("u", TOKEN), timeout=5)
        assert basic.status_code == 401
    # Nothing was started by any of them.
    assert requests.get(f"{agent.base}/v1/serving", timeout=5).json()["state"] == "not_started"
    # Stop is idempotent: with the token and nothing running, it is a 200.
    ok = _post(agent, "/v1/serving/stop")
    assert ok.status_code == 200 and ok.json()["state"] == "not_started"


def test_serving_start_stop_over_http_with_the_vllm_probe_watching(
    serving_agent: RunningAgent,
) -> None:
    agent = serving_agent
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] == "unreachable")
    assert agent.state()["serving"]["state"] == "not_started"

    started = _post(agent, "/v1/serving/start", {"profile": "safe"})
    assert started.status_code == 200, started.text
    body = started.json()
    assert body["state"] == "running" and body["profile"] == "safe"
    assert '"enable_adaptive_verification":false' in " ".join(body["argv"])

    # The probe sees the rank it started, and /v1/state carries the serving status.
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] == "progressing", 15)
    assert agent.wait(lambda: agent.state()["serving"]["effective_matches_profile"] is True)
    serving = agent.state()["serving"]
    assert serving["effective"] == {
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "enable_adaptive_verification": False,
    }
    assert requests.get(f"{agent.base}/v1/serving", timeout=5).json()["pid"] == serving["pid"]

    # Proof of life on request.
    canary = _post(agent, "/v1/serving/canary")
    assert canary.status_code == 200 and canary.json()["outcome"] == "ok", canary.text

    # A second start while it runs is a conflict, not a second rank.
    again = _post(agent, "/v1/serving/start", {"profile": "plain"})
    assert again.status_code == 409 and "still has live processes" in again.json()["error"]

    stopped = _post(agent, "/v1/serving/stop", {})
    assert stopped.status_code == 200 and stopped.json()["state"] == "stopped"
    assert not psutil.pid_exists(serving["pid"]) or (
        psutil.Process(serving["pid"]).status() == psutil.STATUS_ZOMBIE
    )
    assert agent.wait(lambda: agent.state()["probes"]["vllm"]["state"] != "progressing", 10)
    # A stop we were asked for is no death, however long the port refuses.
    time.sleep(2.0)
    assert agent.state()["probes"]["vllm"]["state"] == "unreachable"
    canary = _post(agent, "/v1/serving/canary")
    assert canary.status_code == 200 and canary.json()["outcome"] == "error"


def test_serving_requests_that_are_wrong_get_a_400_that_says_why(
    serving_agent: RunningAgent,
) -> None:
    agent = serving_agent
    unknown = _post(agent, "/v1/serving/start", {"profile": "fastest"})
    assert unknown.status_code == 400
    assert unknown.json()["known_profiles"] == ["plain", "safe"]
    assert 'unknown profile "fastest"' in unknown.json()["error"]

    def raw(path: str, data: bytes) -> requests.Response:
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        return requests.post(f"{agent.base}{path}", data=data, headers=headers, timeout=5)

    broken = raw("/v1/serving/start", b'{"profile": ')
    assert broken.status_code == 400 and "body is not JSON" in broken.json()["error"]
    listed = raw("/v1/serving/start", b'["safe"]')
    assert (
        listed.status_code == 400 and "expected a JSON object, got list" in listed.json()["error"]
    )
    typo = _post(agent, "/v1/serving/start", {"profil": "safe"})
    assert typo.status_code == 400 and "unknown key(s) in body: profil" in typo.json()["error"]
    number = _post(agent, "/v1/serving/start", {"profile": 3})
    assert (
        number.status_code == 400 and "profile: expected a profile name" in number.json()["error"]
    )
    huge = raw("/v1/serving/stop", b"{" + b" " * 70_000 + b"}")
    assert huge.status_code == 413
    wrong_method = requests.get(f"{agent.base}/v1/serving/start", timeout=5)
    assert wrong_method.status_code == 405 and wrong_method.headers["Allow"] == "POST"
    assert _post(agent, "/v1/state").status_code == 405
    assert _post(agent, "/v1/serving/nothing").status_code == 404
    # None of it started anything, and the agent still answers.
    assert agent.state()["serving"]["state"] == "not_started"


def test_serving_is_off_by_default_and_says_so(running: Callable[..., RunningAgent]) -> None:
    agent = running()
    assert agent.state()["serving"] == {"enabled": False, "state": "not_started"}
    answer = requests.post(f"{agent.base}/v1/serving/start", json={}, timeout=5)
    assert answer.status_code == 404
    assert "serving.enabled: false" in answer.json()["error"]


def test_an_unreadable_token_file_stops_the_agent_at_start(tmp_path: Path) -> None:
    config = _serving_config(tmp_path, _free_port())
    (tmp_path / "serving-token").unlink()
    with pytest.raises(ConfigError) as caught:
        Agent(config, notifier=SystemdNotifier({}))
    assert "serving.token_file" in str(caught.value)


def test_the_canary_carries_the_servers_api_key_from_its_file(
    node_tree: tuple[Path, Path, list[str]], tmp_path: Path
) -> None:
    key_file = tmp_path / "vllm-api-key"
    key_file.write_text("k3y-of-the-server\n")
    key_file.chmod(0o600)
    journal, proc, _ = node_tree
    canary = {"timeout": 10.0, "idle_after": 0.5, "api_key_file": str(key_file)}
    with VllmStandin(mode="idle", api_key="k3y-of-the-server") as keyed:
        config = _config(keyed.url, journal, proc, 5.0, False, {"canary": canary})
        agent = RunningAgent(Agent(config, notifier=SystemdNotifier({})))
        try:
            assert agent.wait(lambda: agent.agent.ready.is_set(), 30)

            def outcome() -> str | None:
                found = agent.state()["probes"]["vllm"]["canary"]
                return None if found is None else str(found["outcome"])

            assert agent.wait(lambda: outcome() is not None, 15)
            assert outcome() == "ok", agent.state()["probes"]["vllm"]["canary"]
            assert keyed.snapshot()["completions"] >= 1
            assert "k3y-of-the-server" not in json.dumps(agent.state())
        finally:
            agent.close()
