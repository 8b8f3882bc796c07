"""One simulated Spark "host": the process tree that a power cut kills.

``python -m spark_watchdog.lab.hardware host --dir NODE_DIR`` runs, in its own
process group (the lab starts it with a new session):

- an SSH banner stand-in on the node's address and port: it sends
  ``SSH-2.0-...`` like sshd; frozen with the rest of the group (SIGSTOP), it
  still completes TCP handshakes in the kernel and sends nothing, the
  signature of a frozen GB10 (NVIDIA/dgx-spark-playbooks #97);
- a real sshd (:mod:`spark_watchdog.lab.hardware.lab_sshd`) on a port of its own,
  where this machine has one: the controller's forced reboot logs in there;
- the real agent (``spark-watchdog agent``) with the node's config;
- the real agent then launches the vLLM rank itself (its serving launcher);
- where the lab runs the controllers on the nodes (``host.json``'s
  ``controller``), the real controller, ``spark-watchdog controller --config
  FILE --node NAME``, in the node's directory (its history file there is the
  node's own disk): started again :data:`CONTROLLER_RESTART_S` after it exits,
  as its unit's ``Restart=always`` does.

The lab freezes a host with SIGSTOP to the group, cuts its power with
SIGKILL to the group, and "boots" it by writing a new boot id and running
this again.

Its services can also be stopped and started without touching the power,
as systemd would on a live host: the lab writes what it wants running to
``NODE_DIR/services.json`` (``{"generation": N, "agent": bool, "ssh": bool}``)
and sends SIGUSR1; the host stops the SSH stand-in (its port then refuses,
like a host whose sshd has stopped), stops the agent with SIGTERM (it exits),
or starts either again, and writes ``N`` to ``NODE_DIR/services.ack`` once it
is done. That is how the lab plays a planned reboot (services stop, the
host goes, a new boot comes) and replaces a node's agent for a while. An
agent that exits on its own, unasked, ends the host as before.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO, Any

from spark_watchdog.lab.hardware import lab_sshd
from spark_watchdog.lab.hardware.journal_writer import Ending, boot_entries, write_boot

SERVICES_FILE = "services.json"
SERVICES_ACK = "services.ack"
# Left by the lab when a boot ended in an orderly shutdown: the next boot's
# journald then has no unclean file to complain about.
CLEAN_SHUTDOWN_MARK = "clean-shutdown"
AGENT_STOP_TIMEOUT = 10.0
# The controller unit's RestartSec (systemd/spark-watchdog-controller.service).
CONTROLLER_RESTART_S = 5.0


async def _banner_server(host: str, port: int) -> asyncio.base_events.Server:
    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            writer.write(b"SSH-2.0-OpenSSH_9.6 spark-lab\r\n")
            await writer.drain()
            await asyncio.sleep(0.5)
        writer.close()

    return await asyncio.start_server(greet, host, port, reuse_address=True)


def boot(node_dir: Path, hostname: str) -> str:
    """A new boot: a fresh boot id, and the boot's first journal lines.

    A lab boot after the first follows a power cut (SIGKILL of the whole
    tree), so journald's complaint about the previous boot's file is logged,
    as a real journald does after an unclean stop
    (docs/facts.md, "How a boot ended"); unless the lab marked the previous
    boot's end as an orderly shutdown.
    """
    boot_id = uuid.uuid4().hex
    random_dir = node_dir / "proc" / "sys" / "kernel" / "random"
    random_dir.mkdir(parents=True, exist_ok=True)
    tmp = random_dir / "boot_id.tmp"
    tmp.write_text(str(uuid.UUID(boot_id)) + "\n")
    os.replace(tmp, random_dir / "boot_id")
    journal = node_dir / "journal"
    previous = list(journal.glob("boot-*.journal")) if journal.exists() else []
    clean_mark = node_dir / CLEAN_SHUTDOWN_MARK
    clean = clean_mark.exists()
    clean_mark.unlink(missing_ok=True)
    entries = boot_entries(
        boot_id,
        datetime.now(timezone.utc),
        hostname=hostname,
        ending=Ending.POWER_LOSS,  # a running boot has no ending yet
        after_unclean=bool(previous) and not clean,
        step=timedelta(milliseconds=10),
    )
    write_boot(journal, entries)
    return boot_id


class _Services:
    """The host's services: the SSH stand-in, the agent and, on a node that
    runs one, the controller."""

    def __init__(
        self, node_dir: Path, address: str, ssh_port: int, controller: _Controller | None = None
    ) -> None:
        self.node_dir = node_dir
        self.address = address
        self.ssh_port = ssh_port
        self.controller = controller
        self.server: asyncio.base_events.Server | None = None
        self.agent: subprocess.Popen[bytes] | None = None
        self.agent_wanted = True
        self._log: IO[bytes] = (node_dir / "agent.log").open("ab")
        self.sshd: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.server = await _banner_server(self.address, self.ssh_port)
        argv = lab_sshd.sshd_argv(self.node_dir)
        if argv is not None:
            # In the host's own process group: frozen and killed with the rest.
            with (self.node_dir / "sshd.log").open("ab") as log:
                self.sshd = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self._start_agent()
        if self.controller is not None:
            self.controller.start()

    def _start_agent(self) -> None:
        config = str(self.node_dir / "agent.yaml")
        self.agent = subprocess.Popen(
            [sys.executable, "-m", "spark_watchdog", "agent", "--config", config],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "SPARK_WATCHDOG_NODE_DIR": str(self.node_dir)},
        )

    @property
    def agent_running(self) -> bool:
        return self.agent is not None and self.agent.poll() is None

    @property
    def agent_quit_unasked(self) -> bool:
        return self.agent_wanted and self.agent is not None and self.agent.poll() is not None

    async def stop_agent(self) -> None:
        agent = self.agent
        if agent is None or agent.poll() is not None:
            return
        agent.terminate()  # SIGTERM, as systemd stops a unit
        try:
            await asyncio.to_thread(agent.wait, AGENT_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            agent.kill()
            await asyncio.to_thread(agent.wait, AGENT_STOP_TIMEOUT)

    async def converge(self) -> None:
        """Do what ``services.json`` asks, then acknowledge its generation."""
        try:
            wanted: Any = json.loads((self.node_dir / SERVICES_FILE).read_text())
        except (OSError, ValueError):
            return
        if not isinstance(wanted, dict):
            return
        ssh, agent = wanted.get("ssh") is not False, wanted.get("agent") is not False
        # Stops first, SSH before the agent: sshd's socket goes at once, the
        # agent takes a moment to exit.
        if not ssh and self.server is not None:
            self.server.close()
            self.server = None
        self.agent_wanted = agent
        if not agent:
            await self.stop_agent()
        if ssh and self.server is None:
            self.server = await _banner_server(self.address, self.ssh_port)
        if agent and not self.agent_running:
            self._start_agent()
        ack = self.node_dir / SERVICES_ACK
        tmp = ack.with_name(SERVICES_ACK + ".tmp")
        tmp.write_text(str(wanted.get("generation", 0)))
        os.replace(tmp, ack)

    async def shut_down(self) -> None:
        self.agent_wanted = False
        if self.controller is not None:
            await self.controller.stop()
        await self.stop_agent()
        if self.sshd is not None:
            self.sshd.terminate()
            try:
                await asyncio.to_thread(self.sshd.wait, AGENT_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.sshd.kill()
        if self.server is not None:
            self.server.close()
            self.server = None
        self._log.close()


class _Controller:
    """The controller this node runs (lab/colocated.py writes its place in host.json)."""

    def __init__(self, node_dir: Path, node: str, config: str) -> None:
        self.node_dir = node_dir
        self.argv = [sys.executable, "-m", "spark_watchdog", "controller"]
        self.argv += ["--config", config, "--node", node]
        self.process: subprocess.Popen[bytes] | None = None
        self.exited_at: float | None = None

    def start(self) -> None:
        with (self.node_dir / "controller.log").open("ab") as log:
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.node_dir
            )
        self.exited_at = None

    def keep_running(self, now: float) -> None:
        """Started again CONTROLLER_RESTART_S after it exited, as systemd would."""
        if self.process is None or self.process.poll() is None:
            return
        if self.exited_at is None:
            self.exited_at = now
            with (self.node_dir / "controller.log").open("a") as log:
                log.write(f"--- the controller exited with {self.process.returncode} ---\n")
        elif now - self.exited_at >= CONTROLLER_RESTART_S:
            self.start()

    async def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            await asyncio.to_thread(process.wait, AGENT_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()


async def run(node_dir: Path) -> int:
    spec = json.loads((node_dir / "host.json").read_text())
    boot(node_dir, spec["name"])
    placed = spec.get("controller")
    controller = None
    if isinstance(placed, dict):
        controller = _Controller(node_dir, spec["name"], str(placed["config"]))
    services = _Services(node_dir, spec["address"], int(spec["ssh_port"]), controller)
    attention = asyncio.Event()
    stopping = False

    def stop() -> None:
        nonlocal stopping
        stopping = True
        attention.set()

    # The handlers before anything starts: SIGUSR1's default action is to exit.
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    loop.add_signal_handler(signal.SIGUSR1, attention.set)
    await services.start()
    while True:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(attention.wait(), 0.5)
        if stopping:
            break
        if attention.is_set():
            attention.clear()
            await services.converge()
        if services.agent_quit_unasked:
            break  # the agent's end is the host's, as it always was here
        if controller is not None:
            controller.keep_running(loop.time())
    await services.shut_down()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one simulated Spark host")
    parser.add_argument("--dir", type=Path, required=True, help="the node's lab directory")
    args = parser.parse_args(argv)
    return asyncio.run(run(args.dir))
