"""The benchmarks' own tools: the delaying relay (real TCP), the percentile
rule, and the recovery split read from recorded steps."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from bench import flight_recorder, memory_guard, power_paths
from bench.delay_relay import DelayRelay
from bench.detection_latency import percentiles, production_overrides, recovery_split
from bench.production import production_settings
from spark_watchdog.config.controller import (
    DetectionConfig,
    GuardsConfig,
    PolicyConfig,
    ServingConfig,
    parse_controller_config,
)
from spark_watchdog.history.records import Incident, IncidentStep


@pytest.fixture
def echo() -> Iterator[int]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(4096):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    yield int(server.getsockname()[1])
    server.close()


def test_relay_delays_each_direction_and_keeps_order(echo: int) -> None:
    relay = DelayRelay(("127.0.0.1", echo), delay=0.2, jitter=0.1).start()
    try:
        with socket.create_connection(("127.0.0.1", relay.port), timeout=5) as sock:
            started = time.monotonic()
            sock.sendall(b"ping")
            assert sock.recv(16) == b"ping"
            round_trip = time.monotonic() - started
            # Two hops, each 100-300 ms.
            assert 0.2 <= round_trip < 1.0, round_trip
            for i in range(20):  # chunks sent back to back come back in order
                sock.sendall(f"<{i}>".encode())
            expected = "".join(f"<{i}>" for i in range(20)).encode()
            got = b""
            while len(got) < len(expected):
                got += sock.recv(4096)
            assert got == expected
        assert relay.connections == 1
    finally:
        relay.stop()


def test_percentiles_use_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]
    assert percentiles(values) == {"n": 20, "p50": 10.5, "p95": 19.0, "max": 20.0}
    assert percentiles([]) == {"n": 0, "p50": None, "p95": None, "max": None}


def _incident(detected: float, resolved: float | None) -> Incident:
    return Incident(
        id=1,
        kind="host_frozen",
        nodes=("spark-3",),
        opened_at=detected,
        detected_at=detected,
        fault_onset=None,
        evidence={},
        dry_run=False,
        status="resolved" if resolved else "open",
        resolution="recovered" if resolved else None,
        resolved_at=resolved,
        time_to_detect_s=None,
        time_to_recover_s=None,
    )


def test_recovery_split_adds_up_to_the_total() -> None:
    at = {
        "off_requested": 110.0,
        "off_verified": 111.0,
        "on_requested": 171.0,
        "on_verified": 172.0,
        "new_boot_seen": 232.0,
        "serving_restart_started": 232.5,
        "serving_restart_done": 400.0,
    }
    steps = [
        IncidentStep(incident_id=1, seq=i, at=t, node="spark-3", step=name, detail={})
        for i, (name, t) in enumerate(at.items(), 1)
    ]
    split = recovery_split(_incident(108.0, 400.5), steps, onset=100.0)
    assert split["detection"] == 8.0
    assert split["off_hold"] == 60.0
    assert split["boot"] == 60.0
    assert split["serving_start"] == 167.5
    assert split["of_which_decision"] == 2.0
    assert split["of_which_pdu_switching"] == 2.0
    parts = ("detection", "off_hold", "boot", "serving_start", "watchdog_beyond_detection")
    assert sum(split[p] for p in parts) == pytest.approx(split["total"])
    assert split["watchdog_beyond_detection"] == pytest.approx(5.0)
    # An incident without every step (e.g. given up) has no split.
    assert recovery_split(_incident(108.0, None), steps, onset=100.0) == {}


def test_production_settings_are_the_config_defaults_and_parse() -> None:
    settings = production_settings()
    assert settings["detection"]["freeze_after"] == DetectionConfig().freeze_after
    assert settings["policy"]["power_off_seconds"] == PolicyConfig().power_off_seconds
    assert settings["serving"]["restart_cooldown"] == ServingConfig().restart_cooldown
    config = parse_controller_config(
        {
            "nodes": [{"name": "spark-1", "agent": "http://127.0.0.1:9720", "power": []}],
            **settings,
        },
        "test",
    )
    assert config.guards.node_budget == GuardsConfig().node_budget
    # The detection benchmark changes only what it says it changes.
    overrides = production_overrides(2.0)
    assert overrides["detection"] == settings["detection"]
    assert overrides["policy"]["power_off_seconds"] == 2.0
    assert overrides["serving"]["restart_cooldown"] < settings["serving"]["restart_cooldown"]


def test_the_memory_guard_bench_measures_margins_and_false_kills(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "memory_guard.json"
    assert (
        memory_guard.main(
            ["--runs", "50", "--healthy-runs", "3", "--live-seconds", "0", "--json-out", str(out)]
        )
        == 0
    )
    result = json.loads(out.read_text())
    rows = {r["rate_gib_per_s"]: r for r in result["collapses"]}
    assert rows[1.0]["killed_before_floor"] == 50 and rows[1.0]["margin_gib_min"] >= 2.0
    assert rows[3.0]["killed_before_floor"] < 50  # past the documented bound some are late
    assert result["healthy"]["kills"] == 0 and result["healthy"]["serving_hours"] == 3.0
    assert "collapse 1.0 GiB/s" in capsys.readouterr().out


def test_the_flight_recorder_bench_measures_what_it_holds(tmp_path: Path) -> None:
    out = tmp_path / "flight_recorder.json"
    assert flight_recorder.main(["--nodes", "20", "--seconds", "30", "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["samples_per_node"] == 31
    assert result["bytes_per_node"] > 31 * 8 and result["evidence_bytes_per_incident"] > 31 * 10


@pytest.mark.integration
def test_the_power_path_benchmark_measures_verified_cycles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "power_paths.json"
    argv = ["--cycles", "2", "--paths", "shelly_gen1", "exec", "--json-out", str(out)]
    assert power_paths.main(argv) == 0
    results = json.loads(out.read_text())
    assert set(results) == {"shelly_gen1", "exec"}
    for result in results.values():
        assert result["cycles"] == 2 and len(result["samples"]) == 2
        for sample in result["samples"]:
            assert (
                0 < sample["off_s"] < sample["cycle_s"] and 0 < sample["on_s"] < sample["cycle_s"]
            )
    assert "exec (relay board script)" in capsys.readouterr().out


def test_the_http_bench_times_polls_beside_a_crowd_of_each_kind() -> None:
    import psutil

    from bench import http_under_load
    from spark_watchdog.http.server import HttpEndpoint, json_response

    server = HttpEndpoint(
        "127.0.0.1",
        0,
        {
            "/v1/state": lambda: json_response({"seq": 1}),
            "/metrics": lambda: (200, "text/plain", b"m" * 50_000),
        },
    )
    server.start()
    try:
        run = http_under_load._measure(
            psutil.Process(),
            server.port,
            "/v1/state",
            "/metrics",
            http_under_load.KINDS,
            20,
            5,
            0.0,
        )
    finally:
        server.stop()
    assert run["crowd"] == "idle+slow-sender+slow-reader"
    assert run["answers"] == {"200": 5} and run["failures"] == 0
    assert run["connections_open_during_polls"]["min"] >= 57  # 95 % of 60
    assert run["ms"]["p50"] is not None and run["rss_mb"]["max"] > 0
    assert run["goal_met"] is True


def test_the_cost_bench_s_peers_answer_pulses_that_advance() -> None:
    from bench.agent_cost import _PulseStubs
    from spark_watchdog.probes.pulse import ask_once

    stubs = _PulseStubs(3, agent_port=1, node="bench-1")
    stubs.start()
    try:
        peers = stubs.peers_config()
        assert [p["name"] for p in peers] == ["peer-0", "peer-1", "peer-2"]
        first = ask_once("peer-1", peers[1]["url"], 5.0)
        second = ask_once("peer-1", peers[1]["url"], 5.0)
        assert first.state == second.state == "ok"
        assert first.pulse is not None and second.pulse is not None
        assert second.pulse.seq > first.pulse.seq
        assert stubs.heard_at[1] is None  # doctor's pulse carries none of its own
    finally:
        stubs.stop()


@pytest.mark.integration
@pytest.mark.parametrize("lead", ["peers", "agent"])
def test_the_cost_bench_s_peers_and_a_real_agent_make_one_exchange_a_second_per_pair(
    lead: str,
) -> None:
    """The stubs pulse by the agent's own rule: with a real agent, each pair
    settles on one side asking, the one ``lead`` names."""
    from bench.agent_cost import _PulseStubs
    from spark_watchdog.agent.daemon import Agent
    from spark_watchdog.config.agent import parse_agent_config
    from spark_watchdog.lab.ports import free_port
    from spark_watchdog.sdnotify import SystemdNotifier

    port = free_port()
    stubs = _PulseStubs(2, agent_port=port, node="bench-1", lead=lead)
    config = parse_agent_config(
        {
            "node": "bench-1",
            "listen": {"address": "127.0.0.1", "port": port},
            "probes": {name: {"enabled": False} for name in ("vllm", "gpu", "journal")},
            "peers": stubs.peers_config(),
        }
    )
    agent = Agent(config, notifier=SystemdNotifier({}))
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(agent.run(stop)), daemon=True)
    thread.start()
    stubs.start()
    try:
        time.sleep(3.5)  # the first round sets the phase; then two or three settled rounds
        by_agent, of_agent = sum(stubs.asked_by_agent), stubs.asked
        time.sleep(5.0)
        by_agent, of_agent = sum(stubs.asked_by_agent) - by_agent, stubs.asked - of_agent
        # Five seconds, two peers: about ten exchanges, not twenty (both asking).
        # Which side asks is the lead's on an idle machine; a round a loaded
        # machine delays past the other's may hand it over, and that is no fault.
        assert 5 <= by_agent + of_agent <= 14, (lead, by_agent, of_agent)
        assert stubs.failed == 0
    finally:
        stubs.stop()
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


@pytest.mark.integration
def test_the_pulse_cost_bench_measures_both_halves_of_an_exchange() -> None:
    from bench.pulse_cost import render, run

    result = run(rate=10.0, duration=1.0)
    for side in ("answered", "asked"):
        figures = result[side]
        assert figures["pulses"] >= 5, figures
        # CPU time comes in 10 ms ticks: a second of pulses may read as none.
        assert figures["us_per_pulse"] >= 0 and figures["cpu_s"] >= 0, figures
        # Every pulse answered was a well-formed pulse of the peer asked.
        assert set(figures["states"]) == {"ok"}, figures
    assert result["mixed_pct_of_a_core"] >= 0
    assert "half asked and half answered" in render(result)


def test_the_cost_bench_measures_only_an_agent_listening_on_its_port() -> None:
    """Benches side by side may race for a free port: the one whose agent lost
    it must stop, not measure another's agent as its own."""
    from bench.agent_cost import _check_listening

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        _check_listening(psutil.Process(), port)  # this process listens on it
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            with pytest.raises(SystemExit, match=f"port {port} is not the agent's"):
                _check_listening(psutil.Process(other.pid), port)
        finally:
            other.kill()
            other.wait()
