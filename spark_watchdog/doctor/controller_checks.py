"""Controller: can it reach each agent, each SSH banner, and its witness targets?

The same client, timeouts and rules as the controller's own loop, so a pass
here means the controller sees the same.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from spark_watchdog.config.controller import DetectionConfig, NodeConfig
from spark_watchdog.controller.look.http_client import HttpError, request
from spark_watchdog.controller.look.witness import check_witness
from spark_watchdog.doctor.result import Finding, fail, ok, warn
from spark_watchdog.power.ssh_banner import check_ssh_banner

# Doctor waits longer than the controller does, to tell "slow" from "silent".
AGENT_PATIENCE_S = 5.0
# The controller's own witness timeout (controller/daemon.py).
WITNESS_TIMEOUT_S = 1.0


def state_url(node: NodeConfig) -> str:
    return f"{node.agent.rstrip('/')}/v1/state"


async def check_agent(node: NodeConfig, detection: DetectionConfig) -> Finding:
    url = state_url(node)
    started = time.monotonic()
    try:
        answer = await request(url, timeout=max(AGENT_PATIENCE_S, detection.agent_timeout))
        elapsed = time.monotonic() - started
        snapshot = answer.json()
    except HttpError as exc:
        return fail(
            f"no answer from the agent of {node.name}: {exc}",
            f"on {node.name}: `systemctl status spark-watchdog-agent`; check listen.address "
            f"and listen.port in its agent.yaml against {node.agent}, and any firewall between",
        )
    if answer.status != 200 or not isinstance(snapshot, dict):
        return fail(
            f"{url} answered HTTP {answer.status} without a state document",
            f"nodes[].agent must be the agent's base URL (http://HOST:9720), not {node.agent}",
        )
    reported = snapshot.get("node")
    if reported != node.name:
        return fail(
            f"the agent at {node.agent} says it is {reported!r}, but the config calls it "
            f"{node.name!r}: the controller would fence the wrong machine",
            f"correct nodes[].agent of {node.name} (or `node:` in that agent's agent.yaml)",
        )
    seq, boot_id = snapshot.get("seq"), snapshot.get("boot_id")
    detail = (
        f"{url}: node {reported}, seq {seq}, boot {str(boot_id)[:8]}, answered in "
        f"{elapsed * 1000:.0f} ms"
    )
    if elapsed > detection.agent_timeout:
        return warn(
            f"{detail}, slower than detection.agent_timeout ({detection.agent_timeout:g} s): "
            "the controller would count it silent",
            "find what slows the agent or the network, or raise detection.agent_timeout "
            "(keep it well below freeze_after)",
        )
    if snapshot.get("healthy") is False:
        return warn(
            f"{detail}; but the agent reports its own loop unhealthy (a probe task stuck "
            "or dead), so systemd's watchdog will restart it",
            f"on {node.name}: `journalctl -u spark-watchdog-agent -n 50`",
        )
    return ok(f"{detail} (limit {detection.agent_timeout:g} s)")


async def check_banner(node: NodeConfig, detection: DetectionConfig) -> Finding:
    """The freeze rule needs the banner: silence counts toward host_frozen, a refusal never."""
    host, port = node.banner_host, node.ssh_port
    result = await check_ssh_banner(host, port, timeout=detection.banner_timeout)
    where = f"{host}:{port}"
    if result.ok:
        return ok(f"SSH banner of {node.name} at {where}: {result.banner}")
    if result.outcome in ("refused", "closed", "garbage"):
        return fail(
            f"no SSH banner from {node.name} at {where} ({result.outcome}: {result.error}). "
            "A refusal comes from a live kernel, so a frozen host would never count as "
            "frozen",
            f"run sshd on {node.name}, or set ssh_host / ssh_port of the node to where it listens",
        )
    return fail(
        f"no SSH banner from {node.name} at {where} ({result.outcome}: {result.error}). The "
        "controller counts that silence as a freeze sign: one agent hiccup and it would "
        "fence a live host",
        f"open TCP {port} from the controller to {host} (firewall), or correct ssh_host",
    )


async def check_witness_targets(targets: Sequence[str]) -> Finding:
    if not targets:
        return warn(
            "no witness targets: the controller cannot tell its own network outage from "
            "frozen nodes, and would fence every node it cannot reach",
            "add `witness: [tcp://GATEWAY:PORT]`: something on the nodes' network that "
            "answers TCP, not one of the nodes",
        )
    report = await check_witness(targets, timeout=WITNESS_TIMEOUT_S)
    if not report.reached:
        return fail(
            f"no witness target answers within {WITNESS_TIMEOUT_S:g} s: "
            f"{', '.join(report.missed)}; the controller would refuse to fence anything",
            "correct witness (tcp://host:port of something that accepts TCP), or fix the "
            "controller's network",
        )
    if report.missed:
        return warn(
            f"reached {', '.join(report.reached)}; no answer from {', '.join(report.missed)}",
            "correct or remove the targets that do not answer",
        )
    return ok(f"every witness target answers: {', '.join(report.reached)}")
