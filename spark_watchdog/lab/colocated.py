"""The lab with its controllers on the nodes themselves (``lab up --colocated``;
docs/design.md, "Controllers on the Sparks"): no controller on the lab machine.

Each node of the order runs the real ``spark-watchdog controller --config FILE
--node NAME`` inside its own process tree and network namespace
(lab/hardware/sim_host.py), so a freeze stops it with the rest of the host, an
outlet off kills it, and the node's boot starts it again. Its history file is
in the node's directory (the config names it relative to the controller's
working directory, its node's directory): the node's own disk, kept across
its power cycles.

One config file serves every node, as on a real cluster: the lab's controller
config, listening on every address of the node (its management one and its
fabric one, ``0.0.0.0``), with the ``colocated:`` order, each controller
heard on both links. The nodes' management links meet at a switch
(lab/mgmt_switch.py) where the lab machine is the gateway: the PDU, the
witness (a TCP listener) and the alert receiver listen there. Network
namespaces are needed: on loopback every node has the same address, and a
controller listening on loopback is refused by the config's load.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spark_watchdog.lab import mgmt_switch
from spark_watchdog.lab.lab_configs import LabWiring, controller_config
from spark_watchdog.lab.lab_controller import AlertReceiver, write_config
from spark_watchdog.lab.node import LabNode
from spark_watchdog.lab.ports import free_port

# The least the config allows (freeze_after + fence_delay, the lab's 3 s + 10 s),
# and a little more: a loaded machine's controller loop may lag a poll or two.
LAB_TAKEOVER_AFTER_S = 15.0
LAB_FENCE_DELAY_S = 10.0
# Between two serving restarts (production 60 s): the scenarios share one lab, and
# a restart by one would hold back the next one's for a minute.
LAB_RESTART_COOLDOWN_S = 10.0
# Each controller's history, relative to its working directory: its node's directory.
HISTORY = "controller-history.db"
LOG = "controller.log"


# Who runs a controller unless told: both of two nodes; spark-1 and spark-2 of more.
DEFAULT_ORDER = ("spark-1", "spark-2")


@dataclass
class Colocation:
    """The controllers on the nodes, in order, and the network they need.

    The cluster (lab/cluster.py) calls :meth:`wire` before it lays out its nodes,
    :meth:`configure` once its PDU runs and :meth:`stop` when it stops."""

    controllers: tuple[str, ...]
    config_path: Path
    # Merged into the shared config, section by section.
    overrides: dict[str, Any] = field(default_factory=dict)
    takeover_after: float = LAB_TAKEOVER_AFTER_S
    fence_delay: float = LAB_FENCE_DELAY_S
    switch: str | None = None
    gateway: mgmt_switch.Gateway | None = None
    receiver: AlertReceiver | None = None
    config: dict[str, Any] = field(default_factory=dict)
    port: int = 0

    def wire(self, tag: str, netns: bool) -> str:
        """The management switch, and the gateway's witness and alert receiver on it."""
        if not netns:
            raise ValueError("controllers on the nodes need network namespaces (netns)")
        self.switch = mgmt_switch.wire_switch(tag)
        self.gateway = mgmt_switch.Gateway().start()
        self.receiver = AlertReceiver(mgmt_switch.GATEWAY)
        return self.switch

    def config_for(self, node: str) -> Path | None:
        """The shared config, where ``node`` runs a controller."""
        return self.config_path if node in self.controllers else None

    def configure(self, lab: LabWiring) -> dict[str, Any]:
        """The shared config, written where every controller reads it."""
        assert self.gateway is not None and self.receiver is not None
        self.port = free_port()
        config = controller_config(lab, Path(HISTORY), {})
        config["listen"] = {"address": "0.0.0.0", "port": self.port}
        config["serving"]["restart_cooldown"] = LAB_RESTART_COOLDOWN_S
        config["witness"] = [self.gateway.target]
        config["notify"] = {"webhooks": [{"url": self.receiver.url}], "attempts": 1}
        config["colocated"] = {
            "controllers": [
                {"node": name, "urls": self.urls(_node(lab, name))} for name in self.controllers
            ],
            "takeover_after": self.takeover_after,
            "fence_delay": self.fence_delay,
        }
        for key, value in self.overrides.items():
            if isinstance(value, dict) and isinstance(config.get(key), dict):
                config[key] = {**config[key], **value}
            else:
                config[key] = value
        self.config = config
        write_config(config, self.config_path)
        return config

    def urls(self, node: LabNode) -> list[str]:
        """Where the controller on ``node`` is heard: its management address and its fabric one."""
        urls = [f"http://{node.address}:{self.port}"]
        if node.fabric_address is not None:
            urls.append(f"http://{node.fabric_address}:{self.port}")
        return urls

    def stop(self) -> None:
        for step in (
            self.receiver.stop if self.receiver is not None else None,
            self.gateway.stop if self.gateway is not None else None,
        ):
            if step is not None:
                with contextlib.suppress(Exception):
                    step()
        if self.switch is not None:
            mgmt_switch.remove_switch(self.switch)
        self.receiver = self.gateway = None
        self.switch = None


def _node(lab: LabWiring, name: str) -> LabNode:
    for node in lab.nodes:
        if node.name == name:
            return node
    raise ValueError(f"no node {name}: the controllers' order names only the lab's nodes")
