"""What one power cycle costs on each path: command to verified read-back.

Each path runs against its stand-in or real server on loopback (the ones the
tests use): the SNMP PDU stand-in (APC rPDU2 profile), the Shelly Gen2+,
Shelly Gen1 and Tasmota plug stand-ins, the Home Assistant stand-in, a relay
board script for ``exec`` (real subprocesses), a real NUT ``upsd`` with
the outlet driver stand-in, and the Kasa stand-in in each of its three
protocols (through python-kasa, the ``kasa`` extra; left out without it).
Every device switches at once, so the figure is the path's own cost: the
command's round trip plus the reads until the new state is read back (the
first read after the command, unless a path must wait for its server to hear
from the device).

For each path, ``--cycles`` verified cycles with no hold
(``VerifiedPower.cycle(0)``, the on sent by the controller on every path
alike), and per cycle: the off (``off_requested`` to ``off_verified``), the on
(``on_requested`` to ``on_verified``) and the whole cycle. Prints a table
(median and p95, milliseconds); ``--json-out`` writes every sample.

    .venv/bin/python -m bench.power_paths --cycles 20

IPMI (OpenIPMI's ipmi_sim) and Redfish (sushy-tools) are not measured: their
simulators set up in tests/power only, and sushy's fake driver applies a
reset 1-11 s after it is asked (its own random delay, not the path's cost).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from spark_watchdog.config.controller import (
    ExecDevice,
    HomeAssistantDevice,
    KasaDevice,
    NutDevice,
    PowerDevice,
    ShellyDevice,
    ShellyGen1Device,
    SnmpDevice,
    TasmotaDevice,
)
from spark_watchdog.config.secrets import Secret
from spark_watchdog.lab.hardware.home_assistant_standin import HomeAssistantStandin
from spark_watchdog.lab.hardware.kasa_standin import KasaStandin
from spark_watchdog.lab.hardware.nut_server import NutServer
from spark_watchdog.lab.hardware.pdu_standin import PduStandin, PduStandinThread, StandinConfig
from spark_watchdog.lab.hardware.plug_standin import PlugStandin
from spark_watchdog.lab.hardware.relay_board import RelayBoard
from spark_watchdog.power.base import (
    CommandSpacing,
    PowerResult,
    PowerTiming,
    VerifiedPower,
    close_quietly,
)
from spark_watchdog.power.paths import PowerPath, build_backend
from spark_watchdog.power.snmp_profiles import APC_RPDU2
from spark_watchdog.steps import StepName

# Reads every 50 ms: the figure is the path's, not the poll interval's.
TIMING = PowerTiming(
    poll_interval=0.05,
    power_timeout=30.0,
    min_command_interval=0.0,
    read_timeout=30.0,
    command_timeout=30.0,
)
PASSWORD = "bench-secret"


@dataclass(frozen=True)
class Target:
    """One path: its device config and the secrets its ``*_file`` keys would hold."""

    label: str
    device: PowerDevice
    secrets: dict[str, Secret]


@contextlib.contextmanager
def _snmp() -> Iterator[Target]:
    with PduStandinThread(PduStandin(StandinConfig(profile=APC_RPDU2, outlets=2))) as pdu:
        device = SnmpDevice(
            type="snmp",
            host="127.0.0.1",
            port=pdu.port,
            outlet=1,
            vendor="apc_rpdu2",
            community_file="community",
        )
        yield Target("snmp (APC rPDU2 stand-in)", device, {"community_file": _secret("private")})


@contextlib.contextmanager
def _plug(kind: str) -> Iterator[Target]:
    with PlugStandin(kind, password=PASSWORD) as plug:
        secrets = {"password_file": _secret(PASSWORD)}
        device: PowerDevice
        if kind == "shelly":
            device = ShellyDevice(type="shelly", url=plug.url, password_file="pw")
            yield Target("shelly (Gen2+ stand-in)", device, secrets)
        elif kind == "shelly_gen1":
            device = ShellyGen1Device(type="shelly_gen1", url=plug.url, password_file="pw")
            yield Target("shelly_gen1 (stand-in)", device, secrets)
        else:
            device = TasmotaDevice(type="tasmota", url=plug.url, password_file="pw")
            yield Target("tasmota (stand-in)", device, secrets)


@contextlib.contextmanager
def _home_assistant() -> Iterator[Target]:
    with HomeAssistantStandin(PASSWORD) as home:
        device = HomeAssistantDevice(
            type="home_assistant", url=home.url, entity_id="switch.spark_1", token_file="t"
        )
        yield Target("home_assistant (stand-in)", device, {"token_file": _secret(PASSWORD)})


@contextlib.contextmanager
def _exec() -> Iterator[Target]:
    with tempfile.TemporaryDirectory(prefix="bench-exec-") as directory:
        board = RelayBoard(Path(directory))
        device = ExecDevice(
            type="exec",
            off_command=tuple(board.argv("off")),
            on_command=tuple(board.argv("on")),
            status_command=tuple(board.argv("status")),
        )
        yield Target("exec (relay board script)", device, {})


@contextlib.contextmanager
def _nut() -> Iterator[Target]:
    with (
        tempfile.TemporaryDirectory(prefix="nut-") as directory,
        NutServer(Path(directory), PASSWORD) as nut,
    ):
        device = NutDevice(
            type="nut",
            host=nut.host,
            port=nut.port,
            ups="rack",
            outlet=1,
            user="watchdog",
            password_file="pw",
        )
        yield Target("nut (real upsd)", device, {"password_file": _secret(PASSWORD)})


@contextlib.contextmanager
def _kasa(protocol: Literal["legacy", "klap", "smart"]) -> Iterator[Target]:
    """Outlet 2 of a strip of 3, through python-kasa; a new connection (and, but for
    legacy, a new KLAP handshake) for every read and command, as the path does."""
    login = protocol != "legacy"
    with KasaStandin(protocol, outlets=3, username="bench@example.com", password=PASSWORD) as kp:
        device = KasaDevice(
            type="kasa",
            host=kp.host,
            port=kp.port,
            protocol=protocol,
            outlet=2,
            username_file="u" if login else None,
            password_file="p" if login else None,
        )
        secrets = (
            {"username_file": _secret("bench@example.com"), "password_file": _secret(PASSWORD)}
            if login
            else {}
        )
        yield Target(f"kasa {protocol} (stand-in)", device, secrets)


def _secret(value: str) -> Secret:
    return Secret(value, "bench")


PATHS: dict[str, Callable[[], AbstractContextManager[Target]]] = {
    "snmp": _snmp,
    "shelly": lambda: _plug("shelly"),
    "shelly_gen1": lambda: _plug("shelly_gen1"),
    "tasmota": lambda: _plug("tasmota"),
    "home_assistant": _home_assistant,
    "exec": _exec,
    "nut": _nut,
    "kasa_legacy": lambda: _kasa("legacy"),
    "kasa_klap": lambda: _kasa("klap"),
    "kasa_smart": lambda: _kasa("smart"),
}


def _between(result: PowerResult, start: StepName, end: StepName) -> float:
    times = {step.name: step.at_s for step in result.steps}
    return times[end] - times[start]


async def _cycles(target: Target, cycles: int, timed: bool) -> list[dict[str, float]]:
    path = PowerPath("bench", 0, "nodes[0].power[0]", target.device)
    samples: list[dict[str, float]] = []
    for _ in range(cycles):
        backend = build_backend(path, target.secrets)
        try:
            power = VerifiedPower(backend, TIMING, spacing=CommandSpacing())
            result = await power.cycle(0.0, timed=timed)
        finally:
            await close_quietly(backend)
        if not result.verified:
            raise RuntimeError(f"{target.label}: a cycle was not verified: {result.to_json()}")
        samples.append(
            {
                "off_s": _between(result, StepName.OFF_REQUESTED, StepName.OFF_VERIFIED),
                "on_s": _between(result, StepName.ON_REQUESTED, StepName.ON_VERIFIED),
                "cycle_s": result.elapsed_s,
            }
        )
    return samples


def p95(values: list[float]) -> float:
    """Nearest-rank p95, as bench/detection_latency.py reports it: of 20, the 19th."""
    ordered = sorted(values)
    return ordered[max(1, -(-95 * len(ordered) // 100)) - 1]


def summarize(samples: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"cycles": len(samples)}
    for key in ("off_s", "on_s", "cycle_s"):
        values = [s[key] for s in samples]
        out[key] = {
            "median_ms": round(statistics.median(values) * 1000, 1),
            "p95_ms": round(p95(values) * 1000, 1),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.power_paths", description=__doc__)
    parser.add_argument("--cycles", type=int, default=20)
    have_kasa = importlib.util.find_spec("kasa") is not None
    default = [name for name in PATHS if have_kasa or not name.startswith("kasa")]
    parser.add_argument("--paths", nargs="*", choices=sorted(PATHS), default=default)
    parser.add_argument("--json-out", type=Path, default=None)
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    header = ["off ms (p50/p95)", "on ms (p50/p95)", "cycle ms (p50/p95)"]
    print(f"{'path':<28} {header[0]:>18} {header[1]:>18} {header[2]:>20}")
    for name in args.paths:
        started = time.monotonic()
        with PATHS[name]() as target:
            samples = asyncio.run(_cycles(target, args.cycles, timed=False))
        summary = summarize(samples)
        results[name] = {"label": target.label, **summary, "samples": samples}
        cells = [
            f"{summary[k]['median_ms']:.0f}/{summary[k]['p95_ms']:.0f}"
            for k in ("off_s", "on_s", "cycle_s")
        ]
        print(
            f"{target.label:<28} {cells[0]:>18} {cells[1]:>18} {cells[2]:>20}"
            f"   ({time.monotonic() - started:.1f} s)",
            flush=True,
        )
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
