"""How each lab node's host goes down and comes back: power lost and given
back at its outlet, a forced reboot or a halt asked of its sshd, a planned
reboot, and an agent wedged while the host runs on (lab/cluster.py owns the
nodes; this plays what happens to one)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
import requests

from spark_watchdog.lab.hardware import lab_sshd
from spark_watchdog.lab.hardware.journal_writer import shutdown_lines
from spark_watchdog.lab.hardware.sim_host import CLEAN_SHUTDOWN_MARK
from spark_watchdog.lab.host_tree import halt_host, signal_processes
from spark_watchdog.lab.node import FrozenAgent, LabNode
from spark_watchdog.lab.node_hardware import reset_hardware
from spark_watchdog.lab.node_journal import append_journal
from spark_watchdog.power.base import PowerState

# How long a forced reboot keeps the host dark before its boot starts.
FORCED_REBOOT_DARK_S = 2.0


@dataclass
class HostLife:
    """The hosts of the lab's nodes, going down and coming back.

    ``tree`` is every process of a node's host (its rank's container's too),
    ``event`` tells each change to the timeline, and ``stopped`` says the lab
    is being torn down: nothing comes back then.
    """

    nodes: list[LabNode]
    tree: Callable[[LabNode], list[psutil.Process]]
    event: Callable[[str], None]
    stopped: Callable[[], bool]
    host_memory: bool

    def watch_reboots(self) -> None:
        """Act out each forced reboot or halt a node's sshd was asked for
        (lab_sshd), until the lab stops; in a thread of its own."""
        while not self.stopped():
            for node in self.nodes:
                command = lab_sshd.take_request(node.directory)
                if command is not None and not self.stopped():
                    if "halt" in command:
                        self.event(f"{node.name}: halt requested over ssh")
                        self.shut_down(node)  # and stays down: no boot_again
                        node.go_dark()  # halted: its ports time out, like a frozen machine
                    else:
                        self.forced_reboot(node)
            time.sleep(0.2)

    def forced_reboot(self, node: LabNode) -> None:
        """sysrq's restart: the host drops at once (its ports go dark, nothing
        says goodbye) and boots again with a new boot id, the outlet untouched."""
        assert node.host is not None
        if self.stopped():
            return
        self.event(f"{node.name}: forced reboot requested over ssh: the host drops now")
        self.stop_frozen_agent(node)
        signal_processes(self.tree(node), signal.SIGKILL)
        node.host.power(PowerState.OFF)
        node.go_dark()
        node.forced_reboots += 1
        node.rebooting_forced = True

        def come_back() -> None:
            if not self.stopped():
                node.light_up()  # before the boot, which binds the ports again
                assert node.host is not None
                node.host.power(PowerState.ON)

        timer = threading.Timer(FORCED_REBOOT_DARK_S, come_back)
        timer.daemon = True
        timer.start()

    def booted(self, node: LabNode, pid: int) -> None:
        """The node's host started a boot (its first, or one after a cut or a reboot)."""
        node.boots += 1
        if node.boots > 1:
            reset_hardware(node, self.host_memory)
            how = "restarting after its shutdown" if node.planned_reboot else "powered on"
            if node.rebooting_forced:
                how = "restarting after its forced reboot"
            node.planned_reboot = node.rebooting_forced = False
            self.event(f"{node.name} {how}: booting (boot {node.boots})")

    def outlet_changed(self, outlet: int, state: PowerState) -> None:
        """The PDU switched an outlet: its node loses power, or gets it back."""
        for node in self.nodes:
            if node.outlet == outlet and node.host is not None:
                if state is PowerState.OFF:
                    node.powered_off_at = time.monotonic()
                    self.stop_frozen_agent(node)  # a wedged agent dies with the rest
                    signal_processes(self.tree(node), signal.SIGKILL)
                    self.event(f"{node.name} lost power (outlet {outlet} off): tree killed")
                    node.host.power(state)
                    node.go_dark()
                else:
                    node.light_up()  # before the boot, which binds the ports again
                    node.host.power(state)

    def shut_down(self, node: LabNode) -> None:
        """The first half of a planned reboot, as it looks from outside; the
        outlet stays on and nothing goes through the PDU.

        sshd and the agent stop (SIGTERM: the agent exits; the SSH port then
        refuses connections), the journal records an orderly shutdown ending
        in journald's "Journal stopped", and the host halts: what is left of
        the boot (the vLLM rank, which the agent leaves running) is killed.
        Until :meth:`boot_again` nothing listens on the node's ports: on
        loopback they refuse, like a host between its sshd stopping and its
        reboot.
        """
        assert node.host is not None
        doomed = self.tree(node)  # the rank too, while the agent is still its parent
        node.set_services(agent=False, ssh=False)
        append_journal(node, shutdown_lines)
        halt_host(node.host, doomed)
        (node.directory / CLEAN_SHUTDOWN_MARK).write_text("")
        node.planned_reboot = True
        self.event(f"{node.name} shut down for a reboot (outlet {node.outlet} still on)")

    def boot_again(self, node: LabNode) -> None:
        """The second half of a planned reboot: the host starts again after
        ``boot_seconds`` with a new boot id, a new journal file (its previous
        boot ended cleanly) and its agent and SSH stand-in running."""
        assert node.host is not None
        node.host.power_on()

    def wedge_agent(self, node: LabNode) -> dict[str, Any]:
        """Replace the node's agent by a :class:`FrozenAgent` serving its
        current snapshot; the host and its SSH stand-in carry on. Returns the
        frozen snapshot."""
        if node.netns is not None:
            raise ValueError("wedge_agent needs nodes on loopback (not lab up --netns)")
        if node.frozen_agent is not None:
            raise ValueError(f"{node.name}'s agent is already wedged")
        answer = requests.get(f"{node.agent_url}/v1/state", timeout=5)
        answer.raise_for_status()
        snapshot = answer.json()
        node.set_services(agent=False, ssh=True)
        node.frozen_agent = FrozenAgent(node.address, node.agent_port, answer.content).start()
        return snapshot if isinstance(snapshot, dict) else {}

    def unwedge_agent(self, node: LabNode) -> None:
        """The frozen stand-in goes, the real agent starts again (same boot)."""
        self.stop_frozen_agent(node)
        node.set_services(agent=True, ssh=True)

    def stop_frozen_agent(self, node: LabNode) -> None:
        frozen, node.frozen_agent = node.frozen_agent, None
        if frozen is not None:
            frozen.stop()
