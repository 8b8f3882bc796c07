"""Rules every config key gets from the schema, not from each section's own
checks: a new section cannot forget them (docs/bad-input.md, "Configs")."""

from __future__ import annotations

from typing import Any

import pytest

from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.errors import ConfigError

NODE = {"name": "spark-1", "agent": "http://127.0.0.1:9720"}
EXEC = {
    "type": "exec",
    "off_command": ["/bin/true"],
    "on_command": ["/bin/true"],
    "status_command": ["/bin/true"],
}


def _problems(parse: Any, data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse(data)
    problems: list[str] = caught.value.problems
    return problems


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"nodes": [{**NODE, "name": "spark\x001"}]}, "nodes[0].name"),
        (
            {"nodes": [{**NODE, "power": [{**EXEC, "off_command": ["/bin/true", "a\x00b"]}]}]},
            "nodes[0].power[0].off_command[1]",
        ),
    ],
)
def test_a_nul_anywhere_in_a_controller_config_is_refused_with_its_key(
    data: dict[str, Any], key: str
) -> None:
    problems = _problems(parse_controller_config, data)
    assert any(p.startswith(f"{key}:") and "NUL" in p for p in problems), problems


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"node": "spark-1", "listen": {"address": "127.0.0.1\x00"}}, "listen.address"),
        (
            {"node": "spark-1", "serving": {"command": ["vllm", "serve", "m\x00"]}},
            "serving.command[2]",
        ),
        (
            {"node": "spark-1", "serving": {"command": ["vllm"], "environment": {"X\x00": "1"}}},
            "serving.environment",
        ),
        (
            {"node": "spark-1", "serving": {"command": ["vllm"], "environment": {"X": "\x00"}}},
            "serving.environment.X",
        ),
        (
            {
                "node": "spark-1",
                "serving": {
                    "command": ["vllm"],
                    "profiles": {"safe": {"speculative_config": {"method": "a\x00"}}},
                },
            },
            "serving.profiles.safe.speculative_config.method",
        ),
    ],
)
def test_a_nul_anywhere_in_an_agent_config_is_refused_with_its_key(
    data: dict[str, Any], key: str
) -> None:
    problems = _problems(parse_agent_config, data)
    assert any(p.startswith(f"{key}:") and "NUL" in p for p in problems), problems
