"""The lab's calls to its nodes' agents: their state, a serving request with
the lab's token, the wait until every agent answers and the wait until the
head's serving progresses (lab/cluster.py)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

import requests

from spark_watchdog.lab.node import LabNode


def agent_state(node: LabNode) -> dict[str, Any] | None:
    """The node's agent's /v1/state; None where it does not answer."""
    try:
        body = requests.get(f"{node.agent_url}/v1/state", timeout=1).json()
    except (requests.RequestException, ValueError):
        return None
    return body if isinstance(body, dict) else None


def post_to_agent(
    node: LabNode, token_file: Path, path: str, body: dict[str, Any] | None = None
) -> Any:
    """POST ``body`` to the node's agent with the serving token; its answer."""
    token = token_file.read_text().strip()
    answer = requests.post(
        f"{node.agent_url}{path}",
        json=body or {},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    answer.raise_for_status()
    return answer.json()


def wait_agents(nodes: list[LabNode], timeout: float) -> None:
    """Until every node's agent answers; at once an error where a node's
    agent exited, or its host is off (switch it on first)."""
    deadline = time.monotonic() + timeout
    pending = list(nodes)
    while pending and time.monotonic() < deadline:
        for node in list(pending):
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{node.agent_url}/v1/state", timeout=1).ok:
                    pending.remove(node)
        time.sleep(0.2)
        if any(_host_ended(n) for n in pending):
            break  # its agent exited (it says why in its log): no use waiting
    if pending:
        raise TimeoutError(
            f"agents not up: {', '.join(n.name for n in pending)}"
            + "".join(_agent_log_tail(n) for n in pending)
        )


def wait_progressing(head: LabNode, timeout: float) -> None:
    """Until the head's agent sees its vLLM progressing; TimeoutError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(requests.RequestException, ValueError, KeyError):
            state = requests.get(f"{head.agent_url}/v1/state", timeout=1).json()
            if state["probes"]["vllm"]["state"] == "progressing":
                return
        time.sleep(0.3)
    raise TimeoutError("serving did not start progressing")


def _host_ended(node: LabNode) -> bool:
    return node.host is not None and node.host.ended


def _agent_log_tail(node: LabNode, lines: int = 5) -> str:
    """The last lines an agent logged: why it did not come up, when it said."""
    try:
        with (node.directory / "agent.log").open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - 8192))
            text = log.read().decode(errors="replace")
    except OSError:
        return ""
    tail = text.strip().splitlines()[-lines:]
    return "".join(f"\n  {node.name}: {line}" for line in tail)
