"""``POST /v1/serving/*`` bodies that carry a NUL, a control character or the
wrong type: a 400 that says what was wrong, shown escaped, and nothing started."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.agent.serving import ServingLauncher
from spark_watchdog.agent.serving_routes import serving_post_routes
from spark_watchdog.config.agent import parse_agent_config


@pytest.fixture
def routes(tmp_path: Path) -> Any:
    section = {
        "enabled": True,
        "command": [sys.executable, "-c", "import time; time.sleep(60)"],
        "token_file": str(tmp_path / "token"),
        "log_file": str(tmp_path / "serving.log"),
    }
    launcher = ServingLauncher(parse_agent_config({"node": "n1", "serving": section}).serving)
    yield launcher, serving_post_routes(launcher, None, lambda: None)
    launcher.stop()


@pytest.mark.parametrize(
    ("path", "body", "expected"),
    [
        ("/v1/serving/start", {"profile": "safe\x00"}, 'got "safe\\x00"'),
        ("/v1/serving/start", {"profile": "safe\x1b]0;pwned\x07"}, 'got "safe\\x1b]0;pwned\\x07"'),
        (
            "/v1/serving/start",
            {"profile": ["safe"]},
            "expected a profile name (a string), got list",
        ),
        ("/v1/serving/start", {"profile": ""}, "expected a profile name (letters"),
        ("/v1/serving/start", {"pro\x00file": "safe"}, "unknown key(s) in body: pro\\x00file"),
        ("/v1/serving/stop", {"\x1b[2J": 1}, "unknown key(s) in body: \\x1b[2J"),
    ],
)
def test_a_body_with_a_nul_or_control_characters_is_a_clear_400(
    routes: Any, path: str, body: dict[str, Any], expected: str
) -> None:
    launcher, posts = routes
    status, _, payload = posts[path](body)[:3]
    error = json.loads(payload)["error"]
    assert status == 400 and expected in error, error
    assert not any(ord(c) < 32 for c in error), error
    assert launcher.status()["state"] == "not_started"


def test_many_unknown_keys_are_named_within_bounds(routes: Any) -> None:
    _, posts = routes
    body = {f"k{i:03d}" + "x" * 500: i for i in range(200)}
    status, _, payload = posts["/v1/serving/canary"](body)[:3]
    error = json.loads(payload)["error"]
    assert status == 400 and "and 190 more" in error and len(error) < 1200, len(error)
