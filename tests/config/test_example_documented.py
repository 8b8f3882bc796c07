"""Every key the agent accepts is in config/agent.example.yaml, with a comment."""

from __future__ import annotations

from pathlib import Path

import yaml

from spark_watchdog.config.agent import AgentConfig
from spark_watchdog.config.schema import key_paths

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "agent.example.yaml"


def _documented_keys(text: str) -> dict[str, bool]:
    """Map each key path in the file to whether a comment explains it.

    A key counts as documented when the line right above it is a comment at
    the same indentation, or the key's own line carries a trailing comment.
    """
    found: dict[str, bool] = {}
    stack: list[tuple[int, str]] = []
    lines = text.splitlines()
    for number, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        key = stripped.split(":", 1)[0].strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key])
        above = lines[number - 1].strip() if number else ""
        above_indent = len(lines[number - 1]) - len(lines[number - 1].lstrip()) if number else -1
        commented = (above.startswith("#") and above_indent == indent) or " #" in line
        found[path] = commented
        stack.append((indent, key))
    return found


def test_every_key_is_documented() -> None:
    documented = _documented_keys(EXAMPLE.read_text())
    missing = [p for p in key_paths(AgentConfig) if p not in documented]
    uncommented = [p for p in key_paths(AgentConfig) if documented.get(p) is False]
    assert not missing, f"keys missing from {EXAMPLE.name}: {missing}"
    assert not uncommented, f"keys without a comment in {EXAMPLE.name}: {uncommented}"


def test_example_has_no_unknown_keys() -> None:
    known = set(key_paths(AgentConfig))
    documented = _documented_keys(EXAMPLE.read_text())
    assert set(documented) <= known, sorted(set(documented) - known)


def test_the_documentation_check_can_fail() -> None:
    text = "node: a\n# Listen.\nlisten:\n  address: x\n"
    assert _documented_keys(text) == {"node": False, "listen": True, "listen.address": False}
    assert yaml.safe_load(text)["listen"]["address"] == "x"
