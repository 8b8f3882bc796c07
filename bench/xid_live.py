"""A real GPU fault, seen live: launch → Xid event in the NVML worker → probe read → rank stopped.

    python -m bench.xid_live --runs 10 --json-out xid_live.json

Needs an NVIDIA GPU, its driver, nvidia-ml-py and CuPy (CUDA's compiler for
the kernel). Each run starts a process (the "faulting rank") that imports CuPy
and launches a kernel writing through a wild pointer: the driver reports Xid
31 (an MMU fault) and the process sees ``cudaErrorIllegalAddress``. Beside it
the agent's real GPU probe and its NVML worker (probes/gpu.py,
probes/gpu_worker.py) read every ``--poll`` seconds, and the agent's fault log
(agent/gpu_faults.py) stops a stand-in rank process (SIGTERM, then waits for
it) when the Xid ends the CUDA context. Printed per run, from the kernel's
launch (the faulting process's own clock reading right before it): when the
process saw its error, when the worker's watcher got the event, when a probe
read handed it on, and when the stand-in rank was stopped. All on one host's
wall clock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import signal
import statistics
import subprocess
import sys
import time
from typing import Any

from spark_watchdog.agent.gpu_faults import GpuFaultLog
from spark_watchdog.probes.gpu import GpuProbe

FAULTING = r"""
import json, sys, time
import cupy as cp
kernel = cp.RawKernel(r'''
extern "C" __global__ void wild(int *p) { p[threadIdx.x * 4096] = 42; }
''', "wild")
kernel.compile()
cp.cuda.runtime.deviceSynchronize()
launched = time.time()
try:
    kernel((1,), (32,), (cp.uint64(0x7f0000000000),))
    cp.cuda.runtime.deviceSynchronize()
    print(json.dumps({"launched": launched, "fault_seen": None, "error": None}))
except Exception as exc:
    print(json.dumps({"launched": launched, "fault_seen": time.time(), "error": str(exc)[:200]}))
"""


async def one_run(probe: GpuProbe, poll: float, timeout: float) -> dict[str, Any]:
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    stopped: dict[str, float] = {}

    async def stop_rank() -> str:
        rank.send_signal(signal.SIGTERM)
        await asyncio.to_thread(rank.wait, 10)
        stopped["at"] = time.time()
        return "stopped"

    log = GpuFaultLog(stop_rank)
    faulting = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FAULTING, stdout=asyncio.subprocess.PIPE
    )
    event_at = read_at = None
    xid = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and read_at is None:
        reading = await probe.read()
        if reading.xids is not None and reading.xids.events:
            read_at = time.time()
            event = reading.xids.events[0]
            event_at, xid = event.at_unix, event.xid
            await log.take(reading.xids)
        else:
            await asyncio.sleep(poll)
    out, _ = await asyncio.wait_for(faulting.communicate(), timeout)
    if rank.poll() is None:
        rank.kill()
        rank.wait()
    said = json.loads(out.decode().strip().splitlines()[-1])
    launched = said["launched"]

    def since(at: float | None) -> float | None:
        return None if at is None else round(at - launched, 4)

    return {
        "xid": xid,
        "error": said["error"],
        "process_saw_error_s": since(said["fault_seen"]),
        "worker_event_s": since(event_at),
        "probe_read_s": since(read_at),
        "rank_stopped_s": since(stopped.get("at")),
        "watcher": None if reading.xids is None else reading.xids.watcher,
        "fault_log": log.to_json()["faults"],
    }


async def measure(runs: int, poll: float, timeout: float) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    async with GpuProbe(10.0) as probe:
        first = await probe.read()
        watcher = None if first.xids is None else first.xids.watcher
        for i in range(runs):
            result = await one_run(probe, poll, timeout)
            results.append(result)
            print(
                json.dumps({"run": i + 1, **{k: v for k, v in result.items() if k != "fault_log"}})
            )
            sys.stdout.flush()
    return {
        "driver": first.driver_version,
        "gpu": [d.name for d in first.devices],
        "watcher": watcher,
        "runs": results,
    }


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("process_saw_error_s", "worker_event_s", "probe_read_s", "rank_stopped_s"):
        values = sorted(r[key] for r in results if r[key] is not None)
        if values:
            out[key] = {
                "n": len(values),
                "p50": round(statistics.median(values), 4),
                "max": round(values[-1], 4),
                "min": round(values[0], 4),
            }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--poll", type=float, default=0.05, help="seconds between probe reads")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a run may take")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    figures = asyncio.run(measure(args.runs, args.poll, args.timeout))
    figures["summary"] = summary(figures["runs"])
    figures["host"] = platform.node()
    print(json.dumps(figures["summary"], indent=2))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
