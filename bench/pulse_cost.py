"""Measure one peer pulse's CPU: answered by the agent's HTTP server, and asked by its pulse thread.

bench/agent_cost.py gives a whole agent's cost with and without peers, as
the difference of two runs side by side; on a busy 2-core VM two no-peers
runs differ by up to 0.03 % of a core, about the size of the peers' budget
(docs/benchmarks.md). This measures the two halves of a pulse exchange on
their own, each in a process that does nothing else, at ``--rate`` pulses
a second (spaced, so each one wakes an idle thread, as a pulse a second
does), and gives the CPU of one:

- answered: the agent's own HTTP server (``HttpEndpoint``) with its
  ``/v1/pulse`` answer (``OwnPulse``) and its peer watch hearing the pulse
  each request carries (``PeerWatch.heard``, taken by a ``/v1/state``-like
  read a second), asked by this process over kept-alive connections from 3
  peers;
- asked: the agent's ``PeerWatch`` asking 3 peers a round, carrying its own
  pulse, against minimal responders in this process.

With 3 peers an agent makes 3 exchanges a second (agent/peers.py): it
answers them all, asks them all, or a mix (1.5 and 1.5 on average over a
4-node cluster). The figures for each are printed as % of one core.

    .venv/bin/python -m bench.pulse_cost --duration 60 --json-out docs/results/pulse_cost.json
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

from spark_watchdog.agent.peers import PeerWatch
from spark_watchdog.config.agent import PeerConfig, PeeringConfig
from spark_watchdog.lab.ports import free_port
from spark_watchdog.probes.pulse import OwnPulse, PulseClient, pulse_bytes

PEERS = 3
BOOT = "0" * 32
GOAL_PCT = 0.1  # of one core, for 3 peers (docs/benchmarks.md)


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _paced(rate: float, duration: float, step: Any) -> int:
    """Call ``step`` ``rate`` times a second for ``duration`` s; how many times."""
    started = due = time.monotonic()
    done = 0
    while time.monotonic() - started < duration:
        step()
        done += 1
        due += 1.0 / rate
        time.sleep(max(0.0, due - time.monotonic()))
    return done


# -- the answering side: the agent's server, in a process of its own -----------------


def serve(port: int, asker_port: int) -> None:
    """The agent's pulse answer and peer watch behind its HTTP server, until killed."""
    from spark_watchdog.http.server import HttpEndpoint

    own = OwnPulse("spark-1", lambda: (int(time.monotonic()), BOOT))
    # The asker is a configured peer at 127.0.0.1: each carried pulse is taken.
    watch = PeerWatch(
        (PeerConfig("spark-2", f"http://127.0.0.1:{asker_port}"),),
        PeeringConfig(1.0, 0.5),
        carry=own.encoded,
    )

    def pulse() -> tuple[int, str, bytes]:
        return 200, "application/json", own.line()

    endpoint = HttpEndpoint("127.0.0.1", port, {"/v1/pulse": pulse}, pulse_in=watch.heard)
    endpoint.start()
    print("ready", flush=True)
    # The server keeps each carried pulse for the pulse thread's next round or
    # the next /v1/state read to take: here a read a second, as the
    # controller's poll makes, so their taking is counted too.
    while True:
        time.sleep(1.0)
        watch.to_json()


def answered(rate: float, duration: float) -> dict[str, Any]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.pulse_cost", "--serve", str(port)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        if server.stdout.readline().strip() != "ready":
            raise RuntimeError("the answering server did not start")
        process = psutil.Process(server.pid)
        url = f"http://127.0.0.1:{port}"
        clients = [
            PulseClient("spark-1", url, 0.5, carry=lambda: pulse_bytes("spark-2", 1, BOOT))
            for _ in range(PEERS)
        ]
        for client in clients:  # connected before measuring, as kept-alive ones are
            client.ask()
        before = process.cpu_times()
        turn = iter(range(1 << 62))
        states: dict[str, int] = {}

        def ask() -> None:
            answer = clients[next(turn) % PEERS].ask()
            states[answer.state] = states.get(answer.state, 0) + 1

        count = _paced(rate, duration, ask)
        after = process.cpu_times()
        for client in clients:
            client.close()
    finally:
        server.kill()
        server.wait(30)
    cpu = (after.user + after.system) - (before.user + before.system)
    return _figures(count, cpu, states)


# -- the asking side: the agent's pulse thread, in a process of its own ---------------


class _Responders:
    """Minimal pulse answers on loopback (one selectors loop in a thread), in
    the bytes an agent answers."""

    def __init__(self, count: int) -> None:
        self.sockets = [socket.create_server(("127.0.0.1", 0)) for _ in range(count)]
        self.ports = [int(s.getsockname()[1]) for s in self.sockets]
        self._selector = selectors.DefaultSelector()
        for index, listener in enumerate(self.sockets):
            listener.setblocking(False)
            self._selector.register(listener, selectors.EVENT_READ, ("listen", index))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _answer(self, index: int) -> bytes:
        """The bytes an agent's server answers (http/lean.py), as the asker reads them."""
        body = pulse_bytes(f"spark-{index + 2}", int(time.monotonic() * 10), BOOT) + b"\n"
        return (
            b"HTTP/1.1 200 OK\r\nServer: BaseHTTP/0.6 Python/3\r\n"
            + b"Date: Sun, 06 Dec 2026 03:00:00 GMT\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\nCache-Control: no-store\r\n\r\n" % len(body)
            + body
        )

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(0.2):
                kind, index = key.data
                if kind == "listen":
                    conn, _ = key.fileobj.accept()  # type: ignore[union-attr]
                    conn.setblocking(False)
                    self._selector.register(conn, selectors.EVENT_READ, ("conn", index))
                    continue
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if not data:
                    self._selector.unregister(sock)
                    sock.close()
                    continue
                sock.send(self._answer(index))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for listener in self.sockets:
            listener.close()


def ask_peers(ports: list[int], rate: float, duration: float) -> None:
    """The agent's pulse thread's rounds against ``ports``; prints the figures as JSON."""
    watch = PeerWatch(
        tuple(PeerConfig(f"spark-{i + 2}", f"http://127.0.0.1:{p}") for i, p in enumerate(ports)),
        PeeringConfig(1.0, 0.5),
        carry=OwnPulse("spark-1", lambda: (int(time.monotonic()), BOOT)).encoded,  # as the agent's
    )
    watch.pulse_all()  # connected before measuring
    before = _cpu_self()
    rounds = _paced(rate / len(ports), duration, watch.pulse_all)
    cpu = _cpu_self() - before
    states: dict[str, int] = {}
    for seen in watch.to_json().values():
        states[seen["state"]] = states.get(seen["state"], 0) + 1
    print(json.dumps({"count": rounds * len(ports), "cpu_s": cpu, "states": states}))


def asked(rate: float, duration: float) -> dict[str, Any]:
    responders = _Responders(PEERS)
    try:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.pulse_cost",
                "--ask",
                ",".join(map(str, responders.ports)),
                "--rate",
                str(rate),
                "--duration",
                str(duration),
            ],
            capture_output=True,
            text=True,
            timeout=duration + 120,
            check=True,
        )
    finally:
        responders.close()
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return _figures(figures["count"], figures["cpu_s"], figures["states"])


# -- figures ---------------------------------------------------------------------------


def _figures(count: int, cpu_s: float, states: dict[str, int]) -> dict[str, Any]:
    per_us = cpu_s / count * 1e6 if count else 0.0
    return {
        "pulses": count,
        "cpu_s": round(cpu_s, 3),
        "us_per_pulse": round(per_us, 1),
        "pct_of_a_core_for_3_a_second": round(per_us * PEERS / 1e6 * 100, 4),
        "states": states,
    }


def run(rate: float, duration: float) -> dict[str, Any]:
    answer, ask = answered(rate, duration), asked(rate, duration)
    mixed = (answer["pct_of_a_core_for_3_a_second"] + ask["pct_of_a_core_for_3_a_second"]) / 2
    return {
        "benchmark": "pulse_cost",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {psutil.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "rate_per_s": rate,
        "duration_s": duration,
        "answered": answer,
        "asked": ask,
        "mixed_pct_of_a_core": round(mixed, 4),
        "goal_pct": GOAL_PCT,
    }


def render(result: dict[str, Any]) -> str:
    answer, ask = result["answered"], result["asked"]
    return "\n".join(
        [
            f"answered: {answer['us_per_pulse']:.0f} µs a pulse ({answer['pulses']} pulses, "
            f"{answer['states']}); 3 a second: {answer['pct_of_a_core_for_3_a_second']:.3f} %",
            f"asked:    {ask['us_per_pulse']:.0f} µs a pulse ({ask['pulses']} pulses, "
            f"{ask['states']}); 3 a second: {ask['pct_of_a_core_for_3_a_second']:.3f} %",
            f"3 peers, half asked and half answered: {result['mixed_pct_of_a_core']:.3f} % "
            f"of a core (goal ≤ {result['goal_pct']:g} %)",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=20.0, help="pulses a second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds measured, each side")
    parser.add_argument("--json-out", type=Path, help="write the figures here as JSON")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ask", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rate <= 0 or args.duration <= 0:
        parser.error("--rate and --duration must be above 0")
    if args.serve is not None:
        serve(args.serve, free_port())
        return 0
    if args.ask is not None:
        ask_peers([int(p) for p in args.ask.split(",")], args.rate, args.duration)
        return 0
    result = run(args.rate, args.duration)
    print(render(result))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
