"""Time GPU probe reads through the long-lived NVML child (parent round trip).

    python -m bench.gpu_read_latency --reads 200

Prints the first read (child start + nvmlInit) and the p50/p99/max of the
warm reads that follow, plus the state of each. On a machine without an
NVIDIA driver every read is ``unavailable``, which still times the round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time

from spark_watchdog.probes.gpu import GpuProbe


async def measure(reads: int, deadline: float) -> dict[str, object]:
    durations: list[float] = []
    states: dict[str, int] = {}
    async with GpuProbe(deadline) as probe:
        started = time.perf_counter()
        first = await probe.read()
        first_s = time.perf_counter() - started
        for _ in range(reads):
            started = time.perf_counter()
            reading = await probe.read()
            durations.append(time.perf_counter() - started)
            states[reading.state] = states.get(reading.state, 0) + 1
    durations.sort()
    return {
        "first_read_ms": round(first_s * 1000, 2),
        "first_state": first.state,
        "devices": len(first.devices),
        "warm_reads": reads,
        "warm_p50_ms": round(statistics.median(durations) * 1000, 3),
        "warm_p99_ms": round(durations[int(len(durations) * 0.99) - 1] * 1000, 3),
        "warm_max_ms": round(durations[-1] * 1000, 3),
        "states": states,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--deadline", type=float, default=3.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.reads, args.deadline)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
