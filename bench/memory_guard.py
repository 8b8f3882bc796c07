"""The memory guard's figures: lead time on collapses, kills on healthy patterns,
a live soak on this machine's own /proc, and the cost of one judgement.

1. Collapses (virtual time, one reading per second as the agent's default
   loop): MemAvailable falls at a fixed rate from a random level; the margin
   is MemAvailable at the kill minus ``floor_gib``, in GiB and in seconds of
   the fall left.
2. Healthy patterns (virtual time): a model load (a fast ramp to a plateau
   above ``watch_below_gib``), then an hour of serving with noise and bursts;
   any kill is a false positive.
3. Ramps into the judged zone (virtual time): a load that ramps at a fixed
   rate to a plateau below ``watch_below_gib`` cannot be told from a
   collapse until it stops; for each rate, the lowest plateau (in 0.1 GiB
   steps) that no run kills, readings with 20 MiB of noise.
4. Live (real time): the real host probe and guard read this machine's
   ``/proc/meminfo`` and ``/proc/pressure/memory`` once a second while this
   process takes real memory down to 1 GiB under ``watch_below_gib`` at a
   slow rate and holds it there with bursts (a healthy config run close to
   the line); kills must be 0 (nothing is killed here: the guard only
   judges).

    .venv/bin/python -m bench.memory_guard --json-out docs/results/memory_guard.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from spark_watchdog.agent.memory_guard import GIB, GuardPolicy, MemoryGuard, MemorySample
from spark_watchdog.probes.host import HostProbe

RATES_GIB_S = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0)


def collapses(policy: GuardPolicy, runs: int, rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for rate in RATES_GIB_S:
        margins, missed = [], 0
        for _ in range(runs):
            guard = MemoryGuard(policy)
            level = rng.uniform(8.0, 60.0) * GIB
            phase = rng.random()  # where the readings fall against the start
            t, killed_at = phase, None
            while level - rate * GIB * t > 0 and killed_at is None:
                now = level - rate * GIB * t
                if guard.observe(MemorySample(t, int(now))).trip:
                    killed_at = now
                t += 1.0
            if killed_at is None or killed_at <= policy.floor_bytes:
                missed += 1
            else:
                margins.append(killed_at - policy.floor_bytes)
        rows.append(
            {
                "rate_gib_per_s": rate,
                "runs": runs,
                "killed_before_floor": runs - missed,
                "margin_gib_min": round(min(margins) / GIB, 2) if margins else None,
                "margin_gib_median": round(statistics.median(margins) / GIB, 2)
                if margins
                else None,
                "margin_s_min": round(min(margins) / GIB / rate, 2) if margins else None,
                "margin_s_median": round(statistics.median(margins) / GIB / rate, 2)
                if margins
                else None,
            }
        )
    return rows


def healthy(policy: GuardPolicy, runs: int, rng: random.Random) -> dict[str, Any]:
    kills = readings = 0
    for _ in range(runs):
        guard = MemoryGuard(policy)
        level = rng.uniform(90.0, 115.0) * GIB
        plateau = rng.uniform(policy.watch_below_bytes / GIB + 0.2, 30.0) * GIB
        ramp = rng.uniform(0.5, 8.0) * GIB
        t = 0.0
        psi = rng.choice([0.0, 5.0, 60.0])
        while level > plateau:
            level = max(plateau, level - ramp)
            kills += guard.observe(MemorySample(t, int(level), psi)).trip
            t += 1.0
        for _ in range(3600):
            dip = rng.uniform(0.0, 0.25) * GIB if rng.random() < 0.01 else 0.0
            now = max(policy.watch_below_bytes + 1, plateau - dip + rng.gauss(0.0, 0.05 * GIB))
            kills += guard.observe(MemorySample(t, int(now), psi)).trip
            t += 1.0
            readings += 1
    return {"runs": runs, "serving_hours": round(readings / 3600, 1), "kills": kills}


RAMP_RATES_GIB_S = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


def ramp_killed(policy: GuardPolicy, rate: float, plateau: float, rng: random.Random) -> bool:
    """One load from 8-20 GiB down at ``rate`` GiB/s to ``plateau`` GiB, held 30 s."""
    guard = MemoryGuard(policy)
    level = rng.uniform(8.0, 20.0)
    t = start = rng.random()
    settled = start + (level - plateau) / rate + 30.0
    while t <= settled:
        now = max(plateau, level - rate * (t - start)) * GIB + rng.gauss(0.0, 0.02 * GIB)
        if guard.observe(MemorySample(t, int(now))).trip:
            return True
        t += 1.0
    return False


def ramps(policy: GuardPolicy, runs: int, rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for rate in RAMP_RATES_GIB_S:
        lowest, plateau = None, round(policy.watch_below_bytes / GIB, 1)
        while plateau > policy.floor_bytes / GIB:
            if any(ramp_killed(policy, rate, plateau, rng) for _ in range(runs)):
                break
            lowest, plateau = plateau, round(plateau - 0.1, 1)
        rows.append({"rate_gib_per_s": rate, "runs": runs, "lowest_plateau_not_killed": lowest})
    return rows


def live(policy: GuardPolicy, hold_seconds: float, ramp_gib_s: float) -> dict[str, Any]:
    """This process takes real memory: down at ``ramp_gib_s`` to 1 GiB under
    ``watch_below`` (a healthy config close to the line), holds it with bursts
    of allocation and release for ``hold_seconds``, then frees it. The real
    probe and guard read /proc once a second all along."""
    probe, guard = HostProbe("/proc"), MemoryGuard(policy)
    target = policy.watch_below_bytes - GIB
    chunk = 64 * 1024**2
    held: list[bytearray] = []
    burst: list[bytearray] = []
    states: dict[str, int] = {}
    lowest, psi_max, fall_max, kills = None, 0.0, 0.0, 0
    began = time.monotonic()
    phase, hold_from, next_reading = "ramp", None, began
    rng = random.Random(5)
    try:
        while True:
            now = time.monotonic()
            reading = probe.read(now=now)
            available = reading.mem_available_bytes or 0
            if now >= next_reading:
                next_reading += 1.0
                assessment = guard.observe(
                    MemorySample(now, available, reading.mem_pressure_full_avg10)
                )
                states[assessment.state] = states.get(assessment.state, 0) + 1
                kills += assessment.trip
                lowest = available if lowest is None else min(lowest, available)
                psi_max = max(psi_max, reading.mem_pressure_full_avg10 or 0.0)
                if assessment.slope_bytes_per_s is not None:
                    fall_max = max(fall_max, -assessment.slope_bytes_per_s)
            if phase == "ramp":
                if available - chunk <= target:
                    phase, hold_from = "hold", now
                else:
                    held.append(bytearray(chunk))
                    time.sleep(chunk / (ramp_gib_s * GIB))
                    continue
            assert hold_from is not None
            if now - hold_from >= hold_seconds:
                break
            # Bursts: up to 0.5 GiB taken and given back, never below 4 GiB left.
            if burst and rng.random() < 0.3:
                burst.clear()
            elif available - chunk > 4 * GIB and len(burst) < 8 and rng.random() < 0.3:
                burst.append(bytearray(chunk))
            time.sleep(0.1)
    finally:
        held.clear()
        burst.clear()
    return {
        "how": f"this process allocates down to {target / GIB:g} GiB MemAvailable at "
        f"{ramp_gib_s:g} GiB/s, then holds it {hold_seconds:g} s with 64 MiB bursts",
        "readings": sum(states.values()),
        "states": states,
        "mem_available_lowest_gib": None if lowest is None else round(lowest / GIB, 2),
        "fastest_fall_gib_per_s": round(fall_max / GIB, 2),
        "psi_full_avg10_max": psi_max,
        "kills": kills,
    }


def cost(policy: GuardPolicy) -> dict[str, Any]:
    guard = MemoryGuard(policy)
    n = 100_000
    began = time.perf_counter()
    for i in range(n):
        guard.observe(MemorySample(float(i), 40 * GIB - (i % 7) * 1024, 0.0))
    per = (time.perf_counter() - began) / n
    return {"observe_us": round(per * 1e6, 2), "per_agent_loop_cpu_pct": round(per * 100, 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2000, help="runs per collapse rate")
    parser.add_argument("--healthy-runs", type=int, default=500)
    parser.add_argument("--ramp-runs", type=int, default=200, help="runs per ramp and plateau")
    parser.add_argument("--live-seconds", type=float, default=60.0, help="hold time; 0 = skip")
    parser.add_argument("--live-ramp", type=float, default=0.2, help="GiB/s down to the hold")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args(argv)
    policy, rng = GuardPolicy(), random.Random(args.seed)
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {platform.python_version()}",
        "policy": {k: v for k, v in vars(policy).items()},
        "collapses": collapses(policy, args.runs, rng),
        "healthy": healthy(policy, args.healthy_runs, rng),
        "ramps_into_zone": ramps(policy, args.ramp_runs, rng),
        "cost": cost(policy),
    }
    for row in result["collapses"]:
        print(
            f"collapse {row['rate_gib_per_s']:.1f} GiB/s: killed before the floor "
            f"{row['killed_before_floor']}/{row['runs']}, margin min {row['margin_gib_min']} GiB "
            f"({row['margin_s_min']} s), median {row['margin_gib_median']} GiB "
            f"({row['margin_s_median']} s)"
        )
    h = result["healthy"]
    print(f"healthy: {h['runs']} runs, {h['serving_hours']} serving hours, kills {h['kills']}")
    for row in result["ramps_into_zone"]:
        print(
            f"ramp {row['rate_gib_per_s']:.2f} GiB/s into the zone: lowest plateau not killed "
            f"{row['lowest_plateau_not_killed']} GiB ({row['runs']} runs each)"
        )
    print(f"cost: {result['cost']['observe_us']} us per reading")
    if args.live_seconds > 0:
        print(f"live: {args.live_seconds:g} s on this machine's /proc ...", file=sys.stderr)
        result["live"] = live(policy, args.live_seconds, args.live_ramp)
        print(f"live: {json.dumps(result['live'])}")
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    failed = h["kills"] or (args.live_seconds > 0 and result["live"]["kills"])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
