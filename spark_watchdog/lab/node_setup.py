"""How the lab lays a node out before it first boots: its directory (the
``proc`` files it reads, ``host.json``, its SSH keys, a fresh ``meminfo``,
its agent's config), the files every node shares (the NVML stand-in, the
secrets), and the command line of its host process. The cluster
(lab/cluster.py) makes its nodes with them."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from spark_watchdog.lab import fabric, mgmt_switch, netns
from spark_watchdog.lab.colocated import Colocation
from spark_watchdog.lab.hardware import gpu_standin, lab_sshd
from spark_watchdog.lab.hardware.lab_sshd import LabSshKeys
from spark_watchdog.lab.hardware.sim_host import CLEAN_SHUTDOWN_MARK, SERVICES_ACK, SERVICES_FILE
from spark_watchdog.lab.node import LabNode
from spark_watchdog.lab.ports import free_port
from spark_watchdog.lab.sweep import LAB_ENV


def lab_environment(root: Path, lab_id: str) -> dict[str, str]:
    """The environment of every process the lab starts: the lab tag, and the
    NVML stand-in (``root``/nvml) ahead of the real pynvml on the module path."""
    nvml = str(root / "nvml")
    path = os.pathsep.join(p for p in (nvml, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, LAB_ENV: lab_id, "PYTHONPATH": path}


def install_nvml_standin(root: Path) -> None:
    """A copy of the NVML stand-in named pynvml: the agent's real NVML
    worker imports it as NVML."""
    target = root / "nvml"
    target.mkdir(exist_ok=True)
    shutil.copyfile(gpu_standin.__file__, target / "pynvml.py")


def write_secret(root: Path, name: str, value: str) -> Path:
    """A secret file only its owner reads."""
    path = root / name
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def host_argv(node: LabNode, env: dict[str, str]) -> list[str]:
    """The node's host process (``sim_host``), run in its namespace if it has one.

    HostProcess starts its argv with the lab's own environment; `env` adds
    the lab tag and the NVML path (and execs: the pid stays the host's, as it
    does through `ip netns exec`)."""
    settings = [f"{key}={env[key]}" for key in (LAB_ENV, "PYTHONPATH")]
    inside = [netns.IP, "netns", "exec", node.netns] if node.netns else []
    return [
        *inside,
        shutil.which("env") or "/usr/bin/env",
        *settings,
        sys.executable,
        "-m",
        "spark_watchdog.lab.hardware",
        "host",
        "--dir",
        str(node.directory),
    ]


def link_host_proc(directory: Path) -> None:
    """The lab machine's own uptime, load and memory pressure (PSI, where its
    kernel has it); meminfo is the node's own (lay_out_node writes it)."""
    (directory / "proc").mkdir(parents=True, exist_ok=True)
    for entry in ("uptime", "loadavg", "pressure"):
        link = directory / "proc" / entry
        if not link.exists() and not link.is_symlink() and (Path("/proc") / entry).exists():
            link.symlink_to(Path("/proc") / entry)


def lay_out_node(
    root: Path,
    index: int,
    *,
    lab_id: str,
    in_netns: bool,
    real_head: bool,
    ssh_keys: LabSshKeys | None,
    host_memory: bool,
    agent_config: Callable[[LabNode], dict[str, Any]],
    colocation: Colocation | None = None,
) -> LabNode:
    """The ``index``-th node (``spark-<index + 1>``, on outlet ``index + 1``) ready
    for a first boot, no host yet (``colocation``: lab/colocated.py)."""
    name = f"spark-{index + 1}"
    directory = root / name
    link_host_proc(directory)
    node = LabNode(
        name=name,
        outlet=index + 1,
        directory=directory,
        agent_port=free_port(),
        ssh_port=free_port(),
        vllm_port=free_port(),
        head=index == 0,
        real_vllm=index == 0 and real_head,
    )
    if in_netns:
        _join_management(node, index, lab_id[:6], colocation)
    write_host(node, None if colocation is None else colocation.config_for(name))
    (directory / lab_sshd.CONFIG).unlink(missing_ok=True)
    (directory / lab_sshd.REQUEST).unlink(missing_ok=True)
    if ssh_keys is not None:
        node.sshd_port = free_port()
        ssh_keys.add_node(directory, node.address, node.sshd_port)
    write_agent_config(node, agent_config)
    # A file, not a link to /proc/meminfo: mem-collapse rewrites it
    # (unless the lab runs on the machine's own memory).
    meminfo = directory / "proc" / "meminfo"
    meminfo.unlink(missing_ok=True)
    if host_memory:
        meminfo.symlink_to("/proc/meminfo")
    # A lab directory used before: no stale service requests or marks.
    for stale in (SERVICES_FILE, SERVICES_ACK, CLEAN_SHUTDOWN_MARK):
        (directory / stale).unlink(missing_ok=True)
    return node


def _join_management(node: LabNode, index: int, tag: str, colocation: Colocation | None) -> None:
    """The node in a namespace of its own, its management link to the lab machine
    (lab/netns.py) or, where the controllers run on the nodes, to their switch
    (lab/mgmt_switch.py)."""
    if colocation is None or colocation.switch is None:
        netns.make_namespace(node, index, tag)
    else:
        mgmt_switch.plug_in(node, index, tag, colocation.switch)


def write_host(node: LabNode, controller_config: Path | None) -> None:
    """The node's ``host.json``, which its host reads at each boot
    (lab/hardware/sim_host.py): with ``controller_config``, the host runs a
    controller with that config (lab/colocated.py)."""
    spec: dict[str, Any] = {"name": node.name, "address": node.address, "ssh_port": node.ssh_port}
    if controller_config is not None:
        spec["controller"] = {"config": str(controller_config)}
    (node.directory / "host.json").write_text(json.dumps(spec))


def write_agent_config(node: LabNode, agent_config: Callable[[LabNode], dict[str, Any]]) -> None:
    """The node's agent.yaml, read by its agent at each start."""
    (node.directory / "agent.yaml").write_text(yaml.safe_dump(agent_config(node)))


def join_fabric(
    nodes: list[LabNode], tag: str, agent_config: Callable[[LabNode], dict[str, Any]]
) -> None:
    """Every node (in its namespace) on the fabric (lab/fabric.py), before the
    first boot; then each agent's config again, now that it can name its
    peers on the fabric and its rank the group it steps with."""
    fabric.wire_fabric(nodes, tag)
    for node in nodes:
        write_agent_config(node, agent_config)
