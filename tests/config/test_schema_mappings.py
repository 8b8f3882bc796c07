"""The schema's ``dict[str, X]`` and free-form JSON (``Any``) support, and the
agent's ``serving`` section built on it: errors name the key path."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_watchdog.config.agent import load_agent_config, parse_agent_config
from spark_watchdog.config.schema import load, setting
from spark_watchdog.errors import ConfigError


@dataclass(frozen=True)
class Inner:
    size: int = setting(1, minimum=1)


@dataclass(frozen=True)
class Holder:
    names: dict[str, str] = setting(default_factory=dict)
    inners: dict[str, Inner] = setting(default_factory=dict)
    blob: dict[str, Any] = setting(default_factory=dict)


def _load(data: object) -> tuple[Holder | None, list[str]]:
    problems: list[str] = []
    return load(Holder, data, problems), problems


def test_mappings_load_with_their_value_types() -> None:
    holder, problems = _load(
        {
            "names": {"A": "x"},
            "inners": {"one": {"size": 3}, "two": {}},
            "blob": {"a": [1, {"b": None}], "c": True, "d": 1.5},
        }
    )
    assert problems == []
    assert holder == Holder(
        {"A": "x"},
        {"one": Inner(3), "two": Inner(1)},
        {"a": [1, {"b": None}], "c": True, "d": 1.5},
    )


def test_mapping_errors_name_the_full_key_path() -> None:
    _, problems = _load(
        {
            "names": {"A": 3, 7: "x"},
            "inners": {"one": {"size": 0}, "two": {"sise": 2}, "three": None},
            "blob": {"when": datetime.date(2024, 1, 2), "list": [{1: 2}]},
        }
    )
    assert "names.A: expected a non-empty string, got 3" in problems
    assert "names: expected non-empty string keys, got key 7" in problems
    assert "inners.one.size: expected an integer ≥ 1, got 0" in problems
    assert "inners.two.sise: unknown key; expected one of size" in problems
    assert "inners.three: expected a mapping, got nothing (null)" in problems
    assert any(p.startswith("blob.when: expected a JSON value") for p in problems), problems
    assert "blob.list[0]: expected string keys (JSON), got key 1" in problems


def test_a_list_or_text_where_a_mapping_belongs() -> None:
    _, problems = _load({"names": ["a"], "blob": "text"})
    assert problems == [
        "names: expected a mapping, got a list",
        'blob: expected a mapping, got "text"',
    ]


# --- the agent's serving section -------------------------------------------------

_COMMAND = ["vllm", "serve", "m", "--speculative-config", '{"method":"dspark"}']


def _serving(**overrides: object) -> dict[str, Any]:
    serving: dict[str, Any] = {
        "enabled": True,
        "command": _COMMAND,
        "token_file": "/run/token",
    }
    serving.update(overrides)
    return {"node": "n1", "serving": serving}


def test_serving_defaults_and_builtin_profiles() -> None:
    config = parse_agent_config({"node": "n1"})
    assert config.serving.enabled is False
    assert config.serving.default_profile == "safe"
    profiles = config.serving.all_profiles()
    assert profiles["safe"].speculative_config == {"enable_adaptive_verification": False}
    assert profiles["safe"].compilation_config == {"cudagraph_mode": "FULL_DECODE_ONLY"}


def test_a_configured_safe_replaces_the_builtin() -> None:
    config = parse_agent_config(
        _serving(profiles={"safe": {"compilation_config": {"cudagraph_mode": "NONE"}}})
    )
    safe = config.serving.all_profiles()["safe"]
    assert safe.compilation_config == {"cudagraph_mode": "NONE"}
    assert dict(safe.speculative_config) == {}


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"command": []}, "serving.command: required when serving is enabled"),
        ({"token_file": None}, "serving.token_file: required when serving is enabled"),
        (
            {"default_profile": "fast"},
            'serving.default_profile: expected one of plain, safe, got "fast"',
        ),
        (
            {"log_file": "serving.log"},
            'serving.log_file: expected an absolute path, got "serving.log"',
        ),
        ({"profiles": {"bad name": {}}}, "serving.profiles.bad name: expected a profile name"),
        (
            {"profiles": {"fast": {"extra_args": "--x"}}},
            'serving.profiles.fast.extra_args: expected a list, got "--x"',
        ),
        (
            {"environment": {"A-B": "1"}},
            "serving.environment.A-B: expected an environment variable",
        ),
        ({"environment": {"N": 1}}, "serving.environment.N: expected a non-empty string, got 1"),
        (
            {"command": ["vllm", "serve", "--compilation-config", "{bad"]},
            "serving.command: profile safe: --compilation-config: expected a JSON object, "
            "got '{bad'",
        ),
        ({"token": "hunter2"}, "serving.token: inline secrets are not accepted"),
        ({"stop_timeout": 0}, "serving.stop_timeout: expected a number > 0 and ≤ 3600, got 0"),
    ],
)
def test_serving_problems_name_their_key(overrides: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_agent_config(_serving(**overrides))
    assert any(p.startswith(problem) for p in caught.value.problems), caught.value.problems
    assert "hunter2" not in str(caught.value)


def test_the_token_file_must_be_readable_when_the_config_is_loaded(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    missing = tmp_path / "no-token"
    path.write_text(yaml.safe_dump(_serving(token_file=str(missing))))
    with pytest.raises(ConfigError) as caught:
        load_agent_config(path)
    assert f"serving.token_file: secret file {missing} does not exist" in str(caught.value)
    missing.write_text("s3cret\n")
    missing.chmod(0o600)
    assert load_agent_config(path).serving.token_file == str(missing)
