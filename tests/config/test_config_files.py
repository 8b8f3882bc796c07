"""Config files that are not what they seem: a FIFO, /dev/zero, a huge file, an alias
bomb, a 10,000-deep list, a key given twice. Each is refused with the file, the line
and the key path, quickly and in bounded memory."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from spark_watchdog.config.agent import load_agent_config
from spark_watchdog.config.files import CONFIG_MAX_BYTES, read_yaml
from spark_watchdog.errors import ConfigError


def _limit_memory() -> None:
    # The old readers grew without end here; 2 GiB turns that into a failure.
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _agent_check(config: Path | str) -> subprocess.CompletedProcess[str]:
    """``spark-watchdog agent --config FILE --check`` as its own process, bounded in
    time and memory, so that a reader that hangs or grows fails the test only."""
    return subprocess.run(
        [sys.executable, "-m", "spark_watchdog", "agent", "--config", str(config), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=_limit_memory,
    )


def _problems(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        read_yaml(path)
    return caught.value.problems


@pytest.mark.integration
def test_a_fifo_as_config_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "agent.yaml"
    os.mkfifo(fifo)
    done = _agent_check(fifo)
    assert done.returncode == 2
    assert done.stderr == (
        f"spark-watchdog agent: {fifo}: 1 problem(s):\n"
        "  the config file is a FIFO (named pipe), not a regular file; "
        "pass a regular YAML file of at most 1 MiB\n"
    )


@pytest.mark.integration
def test_dev_zero_as_config_is_refused_before_reading() -> None:
    done = _agent_check("/dev/zero")
    assert done.returncode == 2
    assert (
        "the config file is a character device, not a regular file; "
        "pass a regular YAML file of at most 1 MiB"
    ) in done.stderr


def test_a_directory_as_config_is_refused(tmp_path: Path) -> None:
    assert _problems(tmp_path) == [
        "the config file is a directory, not a regular file; "
        "pass a regular YAML file of at most 1 MiB"
    ]


def test_a_config_over_the_size_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("node: spark-1\n" + "#" * CONFIG_MAX_BYTES + "\n")
    size = path.stat().st_size
    assert _problems(path) == [
        f"the config file is {size} bytes, more than the limit of 1 MiB; "
        "pass a regular YAML file of at most 1 MiB"
    ]


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("node: spark-1\nlisten:\n  port: 9720\n  port: 9721\n")
    assert _problems(path) == [
        "line 4, column 3: listen.port: duplicate key (first given on line 3); keep one of them"
    ]


def test_duplicates_deep_in_lists_and_equal_keys_in_other_spellings(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(
        "nodes:\n  - name: spark-1\n    power:\n      - {type: snmp, host: a, 'host': b}\n"
    )
    assert _problems(path) == [
        "line 4, column 31: nodes[0].power[0].host: duplicate key (first given on line 4); "
        "keep one of them"
    ]
    path.write_text("x:\n  1: a\n  0x1: b\n")
    assert _problems(path) == [
        "line 3, column 3: x.0x1: duplicate key (first given on line 2); keep one of them"
    ]


def test_merge_keys_may_still_be_overridden(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "base: &base {interval: 2.0, timeout: 2.0}\nvllm:\n  <<: *base\n  interval: 3.0\n"
    )
    assert read_yaml(path)["vllm"] == {"interval": 3.0, "timeout": 2.0}


def test_a_10000_deep_list_is_refused_not_a_recursion_error(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("node: spark-1\nx: " + "[" * 10000 + "]" * 10000 + "\n")
    (problem,) = _problems(path)
    assert problem.startswith("line 2, column 67: x[0][0]")
    assert problem.endswith(": values nest deeper than 64 levels; a config needs far fewer")


def _bomb(levels: int) -> str:
    lines = ['        a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    for i in range(1, levels):
        lines.append(f"        a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]")
    return (
        "node: spark-1\n"
        "serving:\n"
        "  profiles:\n"
        "    big:\n"
        "      speculative_config:\n" + "\n".join(lines) + "\n"
    )


@pytest.mark.integration
def test_an_alias_bomb_in_a_speculative_config_is_refused_quickly(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(_bomb(9))  # 10^9 values once expanded
    done = _agent_check(path)
    assert done.returncode == 2
    assert (
        "line 10, column 13: serving.profiles.big.speculative_config.a4: the document expands "
        "to more than 100000 values (an alias counts as every value it stands for); a config "
        "is far smaller: look for aliases that repeat large parts"
    ) in done.stderr


def test_an_alias_that_nests_past_the_depth_cap_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    deep = "[" * 40 + "1" + "]" * 40
    path.write_text(
        f"a: &a {deep}\nb: [[[[[[[[[[[[[[[[[[[[[[[[[[[[*a]]]]]]]]]]]]]]]]]]]]]]]]]]]]\n"
    )
    (problem,) = _problems(path)
    assert problem.startswith("line 2, column 32: b[0]")
    assert problem.endswith("alias *a nests values deeper than 64 levels")


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("node: spark-1\nx: &loop [1, *loop]\n")
    assert _problems(path) == [
        "line 2, column 14: x[1]: alias *loop refers to a collection it is inside "
        "(a structure without end); a config cannot hold one"
    ]


def test_aliases_within_the_budget_still_load(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "node: spark-1\n"
        "serving:\n"
        "  profiles:\n"
        "    a: {speculative_config: &spec {method: ngram, num_speculative_tokens: 3}}\n"
        "    b: {speculative_config: *spec}\n"
    )
    config = load_agent_config(path)
    assert config.serving.profiles["b"].speculative_config == {
        "method": "ngram",
        "num_speculative_tokens": 3,
    }


def test_a_control_character_in_the_file_is_a_config_error(tmp_path: Path) -> None:
    """Found by fuzzing: PyYAML's reader refuses it while the loader is built."""
    path = tmp_path / "agent.yaml"
    path.write_bytes(b"node: spark-1\x00\n")
    (problem,) = _problems(path)
    assert problem.startswith("not valid YAML (")
    assert "special characters are not allowed" in problem
    done = _agent_check(path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr


def test_a_mapping_where_a_device_type_belongs_is_a_config_error() -> None:
    """Found by fuzzing: the tag of a tagged union was looked up unhashed."""
    from spark_watchdog.config.controller import parse_controller_config

    data = {
        "nodes": [
            {
                "name": "spark-1",
                "agent": "http://10.0.0.11:9720",
                "power": [{"type": {"a": 1}, "host": "10.0.0.2", "outlet": 1}],
            }
        ]
    }
    with pytest.raises(ConfigError) as caught:
        parse_controller_config(data)
    assert any(
        p.startswith("nodes[0].power[0].type: expected one of ") and p.endswith("got a mapping")
        for p in caught.value.problems
    ), caught.value.problems
