"""The last look before cutting power: a host that answers its SSH banner
again after the verdict is a false alarm, and no command reaches the PDU."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.hardware.pdu_standin import PduStandin, PduStandinThread, StandinConfig
from spark_watchdog.lab.ports import free_port
from spark_watchdog.power.snmp_profiles import profile_by_name

pytestmark = pytest.mark.integration


class WakingSshd:
    """Silent (a frozen host) for the first ``silent_for`` connections, then a
    normal SSH banner: the host came back between the verdict and the cut."""

    def __init__(self, silent_for: int) -> None:
        self.silent_for = silent_for
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.held: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            if self.connections > self.silent_for:
                conn.sendall(b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13\r\n")
            self.held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def pdu() -> Iterator[PduStandinThread]:
    standin = PduStandin(
        StandinConfig(
            profile=profile_by_name("apc_rpdu2"),
            names={1: "spark-3"},
            write_community="lab-write",
        )
    )
    thread = PduStandinThread(standin).start()
    yield thread
    thread.stop()


def test_a_host_that_answers_before_the_cut_is_a_false_alarm(
    tmp_path: Path, pdu: PduStandinThread
) -> None:
    community = tmp_path / "community"
    community.write_text("lab-write\n")
    community.chmod(0o600)
    # Two silent checks make the verdict; the third connection is the preflight.
    sshd = WakingSshd(silent_for=2)
    config = parse_controller_config(
        {
            "nodes": [
                {
                    "name": "spark-3",
                    "agent": f"http://127.0.0.1:{free_port()}",  # never answers
                    "ssh_host": "127.0.0.1",
                    "ssh_port": sshd.port,
                    "power": [
                        {
                            "type": "snmp",
                            "host": "127.0.0.1",
                            "port": pdu.port,
                            "outlet": 1,
                            "vendor": "apc_rpdu2",
                            "community_file": str(community),
                        }
                    ],
                }
            ],
            "detection": {
                "poll_interval": 0.1,
                "agent_timeout": 0.2,
                "freeze_after": 2.0,
                "banner_timeout": 0.5,
                "banner_misses": 2,
            },
            "guards": {"max_unhealthy_fraction": 1.0},
            "listen": {"address": "127.0.0.1", "port": free_port()},
            "history": str(tmp_path / "history.db"),
        },
        "test",
    )
    store = HistoryStore(config.history)
    controller = Controller(config, store)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(controller.run(stop))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            incidents = store.list_incidents()
            if incidents and incidents[0].status == "resolved":
                break
            await asyncio.sleep(0.1)
        stop.set()
        await task

    try:
        asyncio.run(scenario())
        incidents = store.list_incidents()
        assert [(i.kind, i.resolution) for i in incidents] == [("host_frozen", "false_alarm")]
        steps = [s.step for s in store.steps(incidents[0].id)]
        assert "preflight_answered" in steps
        assert "off_requested" not in steps
        assert [a.result for a in store.actions()] in ([], ["failed"])
    finally:
        store.close()
        sshd.close()
    assert sshd.connections >= 3
    assert list(pdu.standin.set_requests) == []
