"""Agent config: typed, frozen, every problem reported at once with its key path."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from spark_watchdog.config.agent import AgentConfig, load_agent_config, parse_agent_config
from spark_watchdog.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config" / "agent.example.yaml"


def test_example_config_loads_with_documented_defaults() -> None:
    config = load_agent_config(EXAMPLE)
    assert config == AgentConfig(node="spark-1"), "the example must show the real defaults"


def test_minimal_config_needs_only_the_node_name() -> None:
    config = parse_agent_config({"node": "spark-3"})
    assert config.node == "spark-3"
    assert config.probes.vllm.stall_after == 15.0
    assert config.probes.gpu.low_power_watts == 30.0


def test_config_is_frozen() -> None:
    config = parse_agent_config({"node": "spark-3"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.node = "other"  # type: ignore[misc]


def test_every_problem_is_reported_at_once_with_its_key_path() -> None:
    data = {
        "nodee": "typo",
        "listen": {"port": 70000},
        "probes": {
            "vllm": {"interval": "fast", "canary": {"enabled": "yes"}},
            "gpu": {"deadline": -1},
            "journal": {"tail_entries": 2.5},
        },
    }
    with pytest.raises(ConfigError) as caught:
        parse_agent_config(data, "agent.yaml")
    problems = caught.value.problems
    assert (
        "nodee: unknown key; expected one of gpu_clock_check, listen, loop_interval, memory_guard, "
        "node, peering, peers, probes, "
        "serving, "
        "shutdown_linger" in problems
    )
    assert "node: required key is missing" in problems
    assert "listen.port: expected an integer ≥ 1 and ≤ 65535, got 70000" in problems
    assert 'probes.vllm.interval: expected a number > 0 and ≤ 3600, got "fast"' in problems
    assert 'probes.vllm.canary.enabled: expected true or false, got "yes"' in problems
    assert "probes.gpu.deadline: expected a number > 0 and ≤ 600, got -1" in problems
    assert "probes.journal.tail_entries: expected an integer ≥ 0 and ≤ 1000, got 2.5" in problems
    assert len(problems) == 7
    assert str(caught.value).startswith("agent.yaml: 7 problem(s):")


def test_cross_field_checks_name_the_key() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_agent_config(
            {"node": "bad name!", "probes": {"vllm": {"url": "ftp://x", "timeout": 50}}}
        )
    problems = caught.value.problems
    url_problem = 'probes.vllm.url: expected an http(s)://host[:port] URL, got "ftp://x"'
    assert url_problem in problems
    # The node-name check runs only once its section is otherwise valid;
    # the nested problem above keeps the top-level object from being built.
    assert all("probes.vllm.timeout" not in p for p in problems)


def test_timeout_must_fit_the_interval() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_agent_config({"node": "n1", "probes": {"vllm": {"interval": 1, "timeout": 9}}})
    assert caught.value.problems == [
        "probes.vllm.timeout: expected at most 5 times interval (5), got 9"
    ]


def test_bad_node_name() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_agent_config({"node": "spark 1"})
    assert caught.value.problems[0].startswith("node: expected a host-like name")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("node: [unclosed\n", "not valid YAML"),
        ("- a\n- b\n", "top level: expected a mapping, got a list"),
        ("node: spark-1\nprobes: 3\n", "probes: expected a mapping, got 3"),
    ],
)
def test_malformed_files(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_agent_config(path)
    assert expected in str(caught.value)


def test_yaml_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("node: spark-1\nlisten:\n  port: [1\n")
    with pytest.raises(ConfigError) as caught:
        load_agent_config(path)
    assert "line " in caught.value.problems[0]


def test_missing_file() -> None:
    with pytest.raises(ConfigError) as caught:
        load_agent_config("/nonexistent/agent.yaml")
    assert caught.value.problems == ["file not found; pass an existing --config FILE"]


@pytest.mark.integration
def test_agent_exits_2_on_a_bad_config_and_lists_every_problem(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("node: spark-1\nloop_interval: 0\nlisten: {port: x}\n")
    result = subprocess.run(
        [sys.executable, "-m", "spark_watchdog", "agent", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "loop_interval: expected a number ≥ 0.1 and ≤ 60, got 0" in result.stderr
    assert 'listen.port: expected an integer ≥ 1 and ≤ 65535, got "x"' in result.stderr


@pytest.mark.integration
def test_agent_check_accepts_the_example() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "spark_watchdog", "agent", "--config", str(EXAMPLE), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "ok (node spark-1)" in result.stdout


def _docker_serving(**serving: object) -> dict[str, object]:
    base: dict[str, object] = {
        "enabled": True,
        "runtime": "docker",
        "token_file": "/etc/spark-watchdog/serving-token",
        "log_file": "/var/lib/spark-watchdog/serving.log",
    }
    base.update(serving)
    return {"node": "spark-1", "serving": base}


def test_the_launchers_container_needs_neither_command_nor_image() -> None:
    launchers = parse_agent_config(_docker_serving(docker={"adopt_labels": {"app": "vllm"}}))
    own = parse_agent_config(_docker_serving(command=["vllm", "serve"], docker={"image": "v:1"}))

    assert launchers.serving.recreates_found_container
    assert not own.serving.recreates_found_container


@pytest.mark.parametrize(
    ("serving", "expected"),
    [
        ({"command": ["vllm", "serve"]}, "serving.docker.image: required with serving.command"),
        ({"docker": {"image": "v:1"}}, "leave out both command and docker.image to re-create"),
        ({"docker": {"image": "v:1"}, "runtime": "process"}, "serving.command: required when"),
        (
            {"command": ["vllm"], "docker": {"image": "v:1", "restart_policy": "always"}},
            'serving.docker.restart_policy: "always" would let the Docker daemon restart',
        ),
    ],
)
def test_half_a_docker_rank_is_refused_with_the_fix(
    serving: dict[str, object], expected: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_agent_config(_docker_serving(**serving))
    assert expected in str(raised.value)


@pytest.mark.parametrize(
    "extra_args",
    [["--api-key", "s3cret-value"], ["--hf-token=hf_abcdef"], ["--my-secret", "v4lue-of-mine"]],
)
def test_a_profile_that_carries_a_secret_is_refused(extra_args: list[str]) -> None:
    serving = {
        "enabled": True,
        "command": ["vllm", "serve", "m"],
        "token_file": "/etc/spark-watchdog/serving-token",
        "secret_flags": ["--my-secret"],
        "profiles": {"keyed": {"extra_args": extra_args}},
    }

    with pytest.raises(ConfigError) as caught:
        parse_agent_config({"node": "spark-1", "serving": serving})
    message = str(caught.value)
    assert "serving.profiles.keyed.extra_args: carries a secret value" in message
    assert extra_args[-1].split("=")[-1] not in message  # the error does not repeat it
    serving["profiles"] = {"keyed": {"extra_args": ["--max-num-seqs", "8"]}}
    assert parse_agent_config({"node": "spark-1", "serving": serving}).serving.profiles
