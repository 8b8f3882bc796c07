"""What the lab's nodes and its controller are configured with: short
timings in the production ratios, each node's agent config and the
controller's. lab/cluster.py writes and uses them."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from spark_watchdog.lab.hardware.lab_sshd import LabSshKeys
from spark_watchdog.lab.hardware.pdu_standin import PduStandinThread
from spark_watchdog.lab.hardware.real_vllm import RealHead
from spark_watchdog.lab.node import LOOPBACK, VLLM_STANDIN, LabNode
from spark_watchdog.lab.ports import free_port
from spark_watchdog.lab.rank_containers import RankContainers

# A real vLLM head takes 30-60 s to start here (model load, KV cache, warm-up);
# the limit leaves room for a loaded machine.
REAL_START_TIMEOUT_S = 420.0
# The lab's off hold. The PDU's own outlet reboot is shorter, so a lab cycle
# is a plain one (the PDU cannot time it: doctor and the record say so); a
# test lengthens the reboot to stage a self-timed cycle.
LAB_POWER_OFF_S = 2.0
LAB_PDU_REBOOT_S = 1.0
# Seconds without power that clear a GPU clock latch in the lab (on a GB10:
# minutes; docs/facts.md, "Clock latch").
LAB_LATCH_CLEAR_S = 6.0
LAB_LATCH_OFF_S = 8.0


@dataclass
class LabTimings:
    """Short, but in the production ratios (poll : freeze_after : off time)."""

    loop_interval: float = 0.5
    vllm_interval: float = 0.5
    stall_after: float = 4.0
    boot_seconds: float = 1.0
    gpu_interval: float = 1.0  # production 2 s, deadline 3 s
    gpu_deadline: float = 1.5
    # An idle head gets a canary soon: an idle hang shows in seconds
    # (production: a 5 s timeout after 10 s idle).
    canary_timeout: float = 2.0
    canary_idle_after: float = 2.0
    # Pulses to the peers over the fabric (production 1 s, 0.5 s; freeze_after
    # is 3 s here): each peer asked a few times within freeze_after.
    peering_interval: float = 0.5
    peering_timeout: float = 0.5


class LabWiring(Protocol):
    """What the configs are made from (lab/cluster.py's LabCluster has it all)."""

    timings: LabTimings
    nodes: list[LabNode]
    pdu: PduStandinThread | None
    token_file: Path | None
    community_file: Path | None
    real_head: RealHead | None
    containers: RankContainers | None
    ssh_keys: LabSshKeys | None


def rank_command(lab: LabWiring, node: LabNode) -> list[str]:
    """The stand-in rank's command line; in a container, this machine's Python bound in."""
    rank = ["--headless"] if not node.head else []
    python = lab.containers.python if lab.containers is not None else sys.executable
    return [
        python,
        "-m",
        *VLLM_STANDIN.split(),
        "--host",
        node.address,
        "--port",
        str(node.vllm_port),
        "--model",
        "lab-model",
        "--speculative-config",
        json.dumps({"method": "dspark", "enable_adaptive_verification": True}),
        "--compilation-config",
        json.dumps({"cudagraph_mode": "FULL_AND_PIECEWISE"}),
        *rank,
        *group_flags(lab, node),
    ]


def group_flags(lab: LabWiring, node: LabNode) -> list[str]:
    """The rank's part in the TP group over the fabric (lab/hardware/rank_group.py):
    a worker answers the head's all-reduce at its fabric address, the head asks
    every worker. Nothing without a fabric: the stand-in then steps alone."""
    if node.fabric_address is None:
        return []
    if not node.head:
        return ["--fabric-listen", f"{node.fabric_address}:{node.vllm_port}"]
    flags: list[str] = []
    for other in lab.nodes:
        if other is not node and other.fabric_address is not None:
            flags += ["--fabric-rank", f"{other.fabric_address}:{other.vllm_port}"]
    return flags


def peering(lab: LabWiring, node: LabNode) -> dict[str, Any]:
    """With a fabric: the agent listens on both links (every address of its
    namespace) and pulses each other node's agent on the fabric."""
    if node.fabric_address is None:
        return {"listen": {"address": node.address, "port": node.agent_port}}
    peers = [
        {"name": other.name, "url": other.fabric_agent_url}
        for other in lab.nodes
        if other is not node and other.fabric_agent_url is not None
    ]
    t = lab.timings
    return {
        "listen": {"address": "0.0.0.0", "port": node.agent_port},
        "peers": peers,
        "peering": {"interval": t.peering_interval, "timeout": t.peering_timeout},
    }


def step_group(lab: LabWiring) -> dict[str, Any]:
    """The workers whose ranks the stand-in head steps with, over the fabric: its
    steps are then their proof of life (docs/design.md, "Peers"). None without
    a fabric, or with a real head (it steps alone)."""
    head = lab.nodes[0]
    if head.fabric_address is None or lab.real_head is not None:
        return {}
    return {"step_group": [n.name for n in lab.nodes if n is not head]}


def agent_config(lab: LabWiring, node: LabNode) -> dict[str, Any]:
    """A node's agent config (agent.yaml): the lab's short timings."""
    t = lab.timings
    command = rank_command(lab, node)
    environment: dict[str, str] = {}
    stop_timeout = 5.0
    if node.real_vllm and lab.real_head is not None:
        command = lab.real_head.command(node.address, node.vllm_port)
        environment = lab.real_head.environment()
        stop_timeout = 15.0
    serving: dict[str, Any] = {
        "enabled": True,
        "command": command,
        "token_file": str(lab.token_file),
        "log_file": str(node.directory / "serving.log"),
        "stop_timeout": stop_timeout,
        "default_profile": "plain",
        "environment": environment,
    }
    if lab.containers is not None:
        lab.containers.agent_serving(node, serving)
    return {
        "node": node.name,
        **peering(lab, node),
        "loop_interval": t.loop_interval,
        "probes": {
            "vllm": {
                "url": node.vllm_url if node.head else None,
                "interval": t.vllm_interval,
                "timeout": 2.0 if node.real_vllm else 1.0,
                "stall_after": t.stall_after,
                # Without it a rank that exited 0 only looks "unreachable".
                "process_match": node.process_match,
                "canary": {"timeout": t.canary_timeout, "idle_after": t.canary_idle_after},
            },
            "gpu": {"interval": t.gpu_interval, "deadline": t.gpu_deadline},
            "journal": {"directory": str(node.directory / "journal"), "interval": 5.0},
            "host": {"proc_root": str(node.directory / "proc")},
        },
        "serving": serving,
    }


def _controller_node(lab: LabWiring, node: LabNode) -> dict[str, Any]:
    """One node as the controller's config names it: its agent, its SSH port and
    its power paths (its outlet on the lab's PDU, then SSH where the lab has sshd)."""
    assert lab.pdu is not None
    return {
        "name": node.name,
        "agent": node.agent_url,
        "ssh_host": node.address,
        "ssh_port": node.ssh_port,
        "power": [
            {
                "type": "snmp",
                "host": lab.pdu.standin.host,
                "port": lab.pdu.port,
                "outlet": node.outlet,
                "vendor": "auto",
                "community_file": str(lab.community_file),
                "timeout": 1.0,
            },
            *ssh_devices(lab, node),
        ],
    }


def controller_config(lab: LabWiring, history: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """The controller's config for the lab, ``overrides`` merged section by section."""
    config: dict[str, Any] = {
        "nodes": [_controller_node(lab, n) for n in lab.nodes],
        "policy": {
            "power_off_seconds": LAB_POWER_OFF_S,
            # Long enough to clear the lab's clock latch (LAB_LATCH_CLEAR_S).
            "clock_latch_off_seconds": LAB_LATCH_OFF_S,
            "power_timeout": 10.0,
            "power_poll_interval": 0.2,
            "min_command_interval": 0.5,
        },
        "detection": {
            "poll_interval": 0.5,
            "agent_timeout": 0.5,
            "freeze_after": 3.0,
            "banner_misses": 2,
            "banner_timeout": 0.5,
            "banner_interval": 5.0,
            "gpu_wedged_after": 6.0,
        },
        "guards": {"boot_timeout": 30.0},
        "serving": {
            "head": lab.nodes[0].name,
            "token_file": str(lab.token_file),
            "start_timeout": REAL_START_TIMEOUT_S if lab.real_head else 30.0,
            **step_group(lab),
            **(lab.containers.controller_serving() if lab.containers else {}),
        },
        "listen": {"address": LOOPBACK, "port": free_port()},
        "history": str(history),
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def ssh_devices(lab: LabWiring, node: LabNode) -> list[dict[str, Any]]:
    keys = lab.ssh_keys
    if keys is None or node.sshd_port is None:
        return []
    return [
        {
            "type": "ssh",
            "host": node.address,
            "port": node.sshd_port,
            "user": keys.user,
            "key_file": str(keys.client),
            "known_hosts_file": str(keys.known_hosts),
            "connect_timeout": 2.0,
        }
    ]
