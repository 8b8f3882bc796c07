"""One simulated Spark "host": the process tree that a power cut kills.

``python -m spark_watchdog.lab.sim_host --dir NODE_DIR`` runs, in its own
process group (the lab starts it with a new session):

- an SSH banner stand-in on the node's address and port: it sends
  ``SSH-2.0-...`` like sshd; frozen with the rest of the group (SIGSTOP), it
  still completes TCP handshakes in the kernel and sends nothing, the
  signature of a frozen GB10 (NVIDIA/dgx-spark-playbooks #97);
- the real agent (``spark-watchdog agent``) with the node's config;
- the real agent then launches the vLLM rank itself (its serving launcher).

The lab freezes a host with SIGSTOP to the group, cuts its power with
SIGKILL to the group, and "boots" it by writing a new boot id and running
this again.
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

from spark_watchdog.lab.journal_writer import Ending, boot_entries, write_boot


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

    Every lab boot after the first follows a power cut (SIGKILL of the whole
    tree), so journald's complaint about the previous boot's file is logged,
    as a real journald does after an unclean stop (FACTS "systemd").
    """
    boot_id = uuid.uuid4().hex
    random_dir = node_dir / "proc" / "sys" / "kernel" / "random"
    random_dir.mkdir(parents=True, exist_ok=True)
    tmp = random_dir / "boot_id.tmp"
    tmp.write_text(str(uuid.UUID(boot_id)) + "\n")
    os.replace(tmp, random_dir / "boot_id")
    journal = node_dir / "journal"
    previous = list(journal.glob("boot-*.journal")) if journal.exists() else []
    entries = boot_entries(
        boot_id,
        datetime.now(timezone.utc),
        hostname=hostname,
        ending=Ending.POWER_LOSS,  # a running boot has no ending yet
        after_unclean=bool(previous),
        step=timedelta(milliseconds=10),
    )
    write_boot(journal, entries)
    return boot_id


async def run(node_dir: Path) -> int:
    spec = json.loads((node_dir / "host.json").read_text())
    boot(node_dir, spec["name"])
    server = await _banner_server(spec["address"], int(spec["ssh_port"]))
    log = (node_dir / "agent.log").open("ab")
    agent = subprocess.Popen(
        [sys.executable, "-m", "spark_watchdog", "agent", "--config", str(node_dir / "agent.yaml")],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "SPARK_WATCHDOG_NODE_DIR": str(node_dir)},
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    while not stop.is_set() and agent.poll() is None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    if agent.poll() is None:
        agent.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(10)
    server.close()
    log.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one simulated Spark host")
    parser.add_argument("--dir", type=Path, required=True, help="the node's lab directory")
    args = parser.parse_args(argv)
    return asyncio.run(run(args.dir))


if __name__ == "__main__":
    sys.exit(main())
