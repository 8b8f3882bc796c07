"""What the cluster's launcher is handed, how a restart through the agents
orders its starts, and how the head's config is judged against the profile
itself: pure parts, and the order against agents on loopback."""

from __future__ import annotations

import asyncio
import json
import shlex
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import pytest

from spark_watchdog.config.controller import LauncherConfig, parse_controller_config
from spark_watchdog.controller.serving.cluster_launcher import (
    launcher_environment,
    launcher_values,
    profile_from,
    profile_requests,
    substitute,
)
from spark_watchdog.controller.serving.serving_restart import ServingNode, ServingRestart, _unsafe
from spark_watchdog.errors import ConfigError
from spark_watchdog.profiles import BUILTIN_PROFILES, SAFE, EffectiveConfig, Profile, flag_json


def test_the_launcher_gets_the_safe_profile_as_flags_json_and_environment() -> None:
    values = launcher_values(BUILTIN_PROFILES[SAFE])

    assert values["profile"] == "safe"
    assert values["vllm_args"] == ["--compilation-config", '{"cudagraph_mode":"FULL_DECODE_ONLY"}']
    assert json.loads(values["speculative_config"]) == {"enable_adaptive_verification": False}
    env = launcher_environment(values)
    assert env["SPARK_WATCHDOG_PROFILE"] == "safe"
    assert shlex.split(env["SPARK_WATCHDOG_VLLM_ARGS"]) == values["vllm_args"]
    assert json.loads(env["SPARK_WATCHDOG_COMPILATION_CONFIG"]) == {
        "cudagraph_mode": "FULL_DECODE_ONLY"
    }


def test_the_flags_merge_into_the_heads_running_command_and_replace_its_values_whole() -> None:
    running = [
        "vllm",
        "serve",
        "m",
        "--speculative-config",
        '{"method":"dspark","num_speculative_tokens":3,"enable_adaptive_verification":true}',
        '--compilation-config={"cudagraph_mode":"FULL_AND_PIECEWISE","level":3}',
        "--api-key",
        "***",
    ]

    flags = launcher_values(BUILTIN_PROFILES[SAFE], running)["vllm_args"]

    # Appended to the recipe's own command, the last of each flag is what vLLM takes:
    # each must carry the recipe's whole config with the profile's values merged in.
    assert flags[0::2] == ["--speculative-config", "--compilation-config"]
    assert json.loads(flags[1]) == {
        "method": "dspark",
        "num_speculative_tokens": 3,
        "enable_adaptive_verification": False,
    }
    assert json.loads(flags[3]) == {"cudagraph_mode": "FULL_DECODE_ONLY", "level": 3}
    assert "***" not in flags


RECIPE_SPEC = '{"method":"dspark","num_speculative_tokens":3,"enable_adaptive_verification":true}'


@pytest.mark.parametrize(
    "recipe",
    [
        ["vllm", "serve", "m", "--speculative-config", RECIPE_SPEC],
        ["vllm", "serve", "m", f"--speculative-config={RECIPE_SPEC}"],
        [
            "vllm",
            "serve",
            "m",
            "--speculative-config",
            RECIPE_SPEC,
            '--compilation-config={"cudagraph_mode":"FULL_AND_PIECEWISE","level":3}',
        ],
    ],
)
def test_restart_after_restart_through_a_launcher_gives_the_same_command(
    recipe: list[str],
) -> None:
    # The launcher appends {vllm_args} to its recipe: after one restart the
    # head's command carries each of the profile's flags twice, the recipe's
    # and ours. Each later restart merges into the last (the one vLLM reads).
    start = [*recipe, "{vllm_args}"]
    running = substitute(start, launcher_values(BUILTIN_PROFILES["plain"]))  # as first started
    assert running == recipe
    commands = []
    for _ in range(3):
        running = substitute(start, launcher_values(BUILTIN_PROFILES[SAFE], running))
        commands.append(running)

    assert commands[0] == commands[1] == commands[2]
    assert commands[0][: len(recipe)] == recipe  # the recipe's own, untouched
    assert flag_json(running, "--speculative-config") == {
        "method": "dspark",
        "num_speculative_tokens": 3,
        "enable_adaptive_verification": False,
    }
    assert flag_json(running, "--compilation-config") == (
        {"cudagraph_mode": "FULL_DECODE_ONLY", "level": 3}
        if len(recipe) == 6
        else {"cudagraph_mode": "FULL_DECODE_ONLY"}
    )
    assert (
        running.count("--speculative-config")
        + sum(a.startswith("--speculative-config=") for a in running)
        == 2
    )


def test_placeholders_fill_in_and_vllm_args_expands_to_its_own_arguments() -> None:
    profile = Profile(
        "fast",
        compilation_config={"cudagraph_mode": "PIECEWISE"},
        extra_args=("--max-num-seqs", "8"),
    )
    argv = ["sparkrun", "run", "recipe-{profile}.yaml", "--", "{vllm_args}", "x{profile}x"]

    filled = substitute(argv, launcher_values(profile))

    assert filled == [
        "sparkrun",
        "run",
        "recipe-fast.yaml",
        "--",
        "--compilation-config",
        '{"cudagraph_mode":"PIECEWISE"}',
        "--max-num-seqs",
        "8",
        "xfastx",
    ]


def test_placeholders_fill_in_one_pass_and_json_arguments_are_the_operators() -> None:
    profile = Profile("odd{profile}", extra_args=("{profile}",))

    filled = substitute(["x", "{extra_args}", '{"a": 1}'], launcher_values(profile))

    assert filled == ["x", "'{profile}'", '{"a": 1}']


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"safe": BUILTIN_PROFILES[SAFE].to_json()}, BUILTIN_PROFILES[SAFE]),
        ({}, None),
        (None, None),
        ({"safe": {"compilation_config": "FULL"}}, None),
        ({"safe": {"extra_args": [1]}}, None),
    ],
)
def test_a_profile_is_read_from_the_head_only_in_its_own_shape(
    settings: object, expected: Profile | None
) -> None:
    assert profile_from(settings, "safe") == expected


def test_the_head_is_judged_against_the_profile_not_only_against_what_the_launcher_passed() -> None:
    asked = profile_requests(BUILTIN_PROFILES[SAFE])
    # The launcher dropped the flags: the agent's own view (requested from the
    # container's argv) sees nothing wrong, the profile does.
    dropped = {
        "requested": EffectiveConfig().to_json(),
        "effective": EffectiveConfig("FULL_AND_PIECEWISE").to_json(),
    }
    passed = {
        "requested": asked.to_json(),
        "effective": EffectiveConfig("FULL_DECODE_ONLY").to_json(),
    }

    assert asked == EffectiveConfig("FULL_DECODE_ONLY", False)
    assert not _unsafe(dropped)
    assert _unsafe(dropped, asked)
    assert not _unsafe(passed, asked)


def _controller(launcher: dict[str, Any], **node: Any) -> dict[str, Any]:
    return {
        "nodes": [{"name": "spark-1", "agent": "http://10.0.0.1:9720", **node}],
        "serving": {"head": "spark-1", "launcher": launcher},
    }


@pytest.mark.parametrize(
    ("launcher", "node", "expected"),
    [
        ({"type": "command", "start": ["go"]}, {}, "serving.launcher.stop: required with type"),
        ({"stop": ["x"]}, {}, 'only a launcher of type "command" runs commands'),
        (
            {"run_on": "spark-1"},
            {},
            'serving.launcher.run_on: only for a launcher of type "command"',
        ),
        ({"environment": {"A": "1"}}, {}, "serving.launcher.environment: only for a launcher"),
        (
            {"type": "command", "stop": ["x"], "start": ["go", "{model}"]},
            {},
            'serving.launcher.start[1]: unknown placeholder "{model}"',
        ),
        (
            {"type": "command", "stop": ["x"], "start": ["go", "--{vllm_args}"]},
            {},
            "expands to several arguments",
        ),
        (
            {"type": "command", "stop": ["x"], "start": ["go"], "run_on": "spark-9"},
            {},
            "serving.launcher.ssh: required to run the launcher on spark-9",
        ),
        (
            {
                "type": "command",
                "stop": ["x"],
                "start": ["go"],
                "run_on": "spark-1",
                "ssh": {"user": "u", "key_file": "k", "known_hosts_file": "h"},
            },
            {},
            "node spark-1 has no ssh_host",
        ),
        ({"order": "slurm"}, {}, "serving.launcher.order: expected one of native, ray"),
        (
            {
                "type": "command",
                "stop": ["x"],
                "start": ["go"],
                "run_on": "spark-1",
                "ssh": {"user": "-oProxyCommand=x", "key_file": "k", "known_hosts_file": "h"},
            },
            {"ssh_host": "10.0.0.1"},
            "serving.launcher.ssh.user: expected a user name without whitespace",
        ),
    ],
)
def test_a_launcher_config_that_cannot_work_is_refused_at_load(
    launcher: dict[str, Any], node: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_controller_config(_controller(launcher, **node))
    assert expected in str(raised.value)


def test_a_launcher_on_a_node_over_ssh_loads() -> None:
    launcher = {
        "type": "command",
        "stop": ["./launch-cluster.sh", "stop"],
        "start": ["./run-recipe.sh", "qwen", "-d", "{vllm_args}"],
        "run_on": "spark-1",
        "ssh": {"user": "ops", "key_file": "launcher-key", "known_hosts_file": "/etc/kh"},
        "working_directory": "/opt/spark-vllm-docker",
    }
    config = parse_controller_config(_controller(launcher, ssh_host="10.0.0.1"))

    assert config.serving.launcher == LauncherConfig(
        type="command",
        stop=("./launch-cluster.sh", "stop"),
        start=("./run-recipe.sh", "qwen", "-d", "{vllm_args}"),
        run_on="spark-1",
        ssh=config.serving.launcher.ssh,
        working_directory="/opt/spark-vllm-docker",
    )


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="milliseconds")


class Agents:
    """Agents on loopback that take every stop and start and record their order."""

    def __init__(self, names: list[str]) -> None:
        self.calls: list[tuple[str, str]] = []
        self.servers: dict[str, ThreadingHTTPServer] = {}
        for name in names:
            self.servers[name] = self._serve(name)

    def _serve(self, name: str) -> ThreadingHTTPServer:
        calls = self.calls
        started = {"at": _iso(time.time() - 3600.0)}  # its rank, by the agent's clock

        class Handler(BaseHTTPRequestHandler):
            def _send(self, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/serving":
                    body = {"enabled": True, "profiles": ["plain", "safe"]}
                    self._send({**body, "started_at": started["at"]})
                    return
                vllm = {"state": "progressing", "observed_at": _iso(time.time())}
                self._send({"probes": {"vllm": vllm}, "serving": {"started_at": started["at"]}})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                calls.append((name, self.path.rsplit("/", 1)[-1]))
                if self.path.endswith("/start"):
                    started["at"] = _iso(time.time())
                self._send({})

            def log_message(self, *args: Any) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def node(self, name: str) -> ServingNode:
        return ServingNode(name, f"http://127.0.0.1:{self.servers[name].server_address[1]}")

    def close(self) -> None:
        for server in self.servers.values():
            server.shutdown()
            server.server_close()


@pytest.fixture
def agents() -> Iterator[Agents]:
    made = Agents(["spark-1", "spark-2", "spark-3"])
    yield made
    made.close()


@pytest.mark.integration
@pytest.mark.parametrize(
    ("order", "starts"),
    [
        ("native", ["spark-2", "spark-3", "spark-1"]),
        ("ray", ["spark-1", "spark-2", "spark-3"]),
    ],
)
def test_the_agents_start_in_the_configured_order_after_the_head_stops_first(
    agents: Agents, order: Literal["native", "ray"], starts: list[str]
) -> None:
    restart = ServingRestart(
        agents.node("spark-1"),
        [agents.node("spark-2"), agents.node("spark-3")],
        "token",
        timeout=10.0,
        order=order,
    )

    report = asyncio.run(restart.run("safe"))

    assert report.result == "succeeded", report.error
    assert [n for n, what in agents.calls if what == "stop"] == ["spark-1", "spark-2", "spark-3"]
    assert [n for n, what in agents.calls if what == "start"] == starts
