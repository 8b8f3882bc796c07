"""``spark-watchdog probe gpu``: one NVML reading through the killable worker.

Exit codes (DESIGN.md §7): 0 when the GPU was read (state ``ok``), 1 otherwise
(``unavailable``, ``timeout``, ``error``), 2 for usage errors (argparse).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable

from spark_watchdog.probes.gpu import GpuDevice, GpuReading, read_once

DEFAULT_DEADLINE_S = 3.0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f'expected a number of seconds > 0, got "{text}"')
    return value


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``gpu`` to the ``spark-watchdog probe`` subcommands."""
    parser = subparsers.add_parser(
        "gpu",
        help="read the GPU through NVML, in a child process with a deadline",
        description=(
            "Read every NVIDIA GPU through NVML in a separate process that is killed if it "
            "does not answer within the deadline (a wedged driver can block NVML forever). "
            "Exit 0 when the GPU was read, 1 otherwise."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the reading as JSON")
    parser.add_argument(
        "--deadline",
        type=_seconds,
        default=DEFAULT_DEADLINE_S,
        metavar="S",
        help=f"seconds to wait for NVML (default {DEFAULT_DEADLINE_S:g})",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    reading = read_once(args.deadline)
    if args.json:
        print(json.dumps(reading.to_json(), indent=2))
    else:
        print(render_table(reading))
    return 0 if reading.state == "ok" else 1


def _cell(device: GpuDevice, name: str, show: Callable[[float], str]) -> str:
    value = getattr(device, name)
    if value is not None:
        return show(value)
    if name in device.not_supported:
        return "n/s"
    return "err" if name in device.errors else "-"


def render_table(reading: GpuReading) -> str:
    """A human-readable reading: one row per GPU, n/s where NVML does not support a field."""
    if reading.state != "ok":
        return f"GPU: {reading.state}: {reading.error}"
    columns: list[tuple[str, str, Callable[[float], str]]] = [
        ("POWER W", "power_w", lambda v: f"{v:.1f}"),
        ("UTIL %", "utilization_gpu_pct", lambda v: f"{v:g}"),
        ("TEMP °C", "temperature_c", lambda v: f"{v:g}"),
        ("SM MHz", "sm_clock_mhz", lambda v: f"{v:g}"),
        ("MEM USED GiB", "memory_used_bytes", lambda v: f"{v / 2**30:.1f}"),
        ("MEM TOTAL GiB", "memory_total_bytes", lambda v: f"{v / 2**30:.1f}"),
    ]
    header = ["GPU", "NAME", *(title for title, _, _ in columns)]
    rows = [
        [
            str(device.index),
            device.name or ("err" if "name" in device.errors else "-"),
            *(_cell(device, name, show) for _, name, show in columns),
        ]
        for device in reading.devices
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in [header, *rows]
    ]
    lines.append(
        f"driver {reading.driver_version or '?'}, NVML {reading.nvml_version or '?'}, "
        f"read in {reading.duration_s * 1000:.0f} ms"
    )
    for device in reading.devices:
        for name, message in sorted(device.errors.items()):
            lines.append(f"GPU {device.index} {name}: {message}")
    return "\n".join(line.rstrip() for line in lines)
