"""Host probe: boot id, uptime, memory headroom and pressure, load, loop lag.

MemAvailable, not MemFree: on GB10's unified memory MemFree sits near 1 GiB
in healthy operation while MemAvailable falls ~1 GiB/s before a freeze
(docs/facts.md, "Freeze precursors"), so the trend of MemAvailable is kept. Memory
pressure is the kernel's PSI (``/proc/pressure/memory``): the share of time
in the last 10 s that some (or all) tasks waited for memory. A kernel built
without PSI has no such file; the fields are then null, which is not an error.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_watchdog.errors import ProbeError

_TREND_WINDOW_S = 10.0


@dataclass(frozen=True)
class HostReading:
    state: str  # "ok" | "error"
    boot_id: str | None
    uptime_s: float | None
    mem_available_bytes: int | None
    mem_total_bytes: int | None
    mem_available_trend_bytes_per_s: float | None
    load1: float | None
    loop_lag_s: float
    error: str | None = None
    # PSI memory avg10, percent (0-100); None without PSI.
    mem_pressure_some_avg10: float | None = None
    mem_pressure_full_avg10: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "boot_id": self.boot_id,
            "uptime_s": self.uptime_s,
            "mem_available_bytes": self.mem_available_bytes,
            "mem_total_bytes": self.mem_total_bytes,
            "mem_available_trend_bytes_per_s": self.mem_available_trend_bytes_per_s,
            "mem_pressure_some_avg10": self.mem_pressure_some_avg10,
            "mem_pressure_full_avg10": self.mem_pressure_full_avg10,
            "load1": self.load1,
            "loop_lag_s": round(self.loop_lag_s, 4),
            "error": self.error,
        }


def read_boot_id(proc_root: str | Path = "/proc") -> str:
    """The kernel's boot id as 32 lowercase hex digits (journald's _BOOT_ID form)."""
    path = Path(proc_root) / "sys/kernel/random/boot_id"
    try:
        raw = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ProbeError(f"{path}: cannot read the boot id ({exc})") from None
    boot_id = raw.replace("-", "").lower()
    if len(boot_id) != 32 or any(c not in "0123456789abcdef" for c in boot_id):
        raise ProbeError(f"{path}: expected a UUID, got {raw!r}")
    return boot_id


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as bytes per key; lines that don't parse are skipped."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if not parts:
            continue
        try:
            number = int(parts[0])
        except ValueError:
            continue
        unit = parts[1] if len(parts) > 1 else ""
        values[key.strip()] = number * 1024 if unit == "kB" else number
    return values


def parse_pressure(text: str) -> dict[str, float]:
    """``/proc/pressure/memory`` as ``{"some": avg10, "full": avg10}`` (percent).

    Raises ValueError naming the line when a ``some``/``full`` line has no
    usable ``avg10=`` (a number from 0 to 100).
    """
    values: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        if kind not in ("some", "full"):
            continue
        fields = dict(part.partition("=")[::2] for part in rest.split())
        try:
            avg10 = float(fields["avg10"])
        except (KeyError, ValueError):
            raise ValueError(f"expected avg10=<percent> in {line!r}") from None
        if not 0.0 <= avg10 <= 100.0:
            raise ValueError(f"expected avg10 from 0 to 100 in {line!r}")
        values[kind] = avg10
    return values


class HostProbe:
    """Reads ``/proc`` (the root is injectable so tests use a committed fake tree)."""

    def __init__(self, proc_root: str | Path = "/proc") -> None:
        self.proc_root = Path(proc_root)
        self._mem_history: deque[tuple[float, int]] = deque()

    def read(self, loop_lag_s: float = 0.0, now: float | None = None) -> HostReading:
        now = time.monotonic() if now is None else now
        problems: list[str] = []
        boot_id = None
        try:
            boot_id = read_boot_id(self.proc_root)
        except ProbeError as exc:
            problems.append(str(exc))
        uptime = self._first_float("uptime", problems)
        load1 = self._first_float("loadavg", problems)
        mem_available = mem_total = None
        try:
            meminfo = parse_meminfo((self.proc_root / "meminfo").read_text(encoding="ascii"))
            mem_available = meminfo.get("MemAvailable")
            mem_total = meminfo.get("MemTotal")
            if mem_available is None:
                problems.append(f"{self.proc_root / 'meminfo'}: no MemAvailable line")
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(f"{self.proc_root / 'meminfo'}: {exc}")
        trend = self._trend(now, mem_available)
        pressure = self._pressure(problems)
        return HostReading(
            state="error" if problems else "ok",
            boot_id=boot_id,
            uptime_s=uptime,
            mem_available_bytes=mem_available,
            mem_total_bytes=mem_total,
            mem_available_trend_bytes_per_s=trend,
            load1=load1,
            loop_lag_s=loop_lag_s,
            error="; ".join(problems) or None,
            mem_pressure_some_avg10=pressure.get("some"),
            mem_pressure_full_avg10=pressure.get("full"),
        )

    def _pressure(self, problems: list[str]) -> dict[str, float]:
        path = self.proc_root / "pressure" / "memory"
        try:
            return parse_pressure(path.read_text(encoding="ascii"))
        except FileNotFoundError:
            return {}  # a kernel without PSI
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            problems.append(f"{path}: {exc}")
            return {}

    def _first_float(self, name: str, problems: list[str]) -> float | None:
        path = self.proc_root / name
        try:
            return float(path.read_text(encoding="ascii").split()[0])
        except (OSError, UnicodeDecodeError, ValueError, IndexError) as exc:
            problems.append(f"{path}: expected a number first, {exc}")
            return None

    def _trend(self, now: float, mem_available: int | None) -> float | None:
        """Bytes/s change of MemAvailable over the last ~10 s (negative = falling)."""
        if mem_available is None:
            return None
        history = self._mem_history
        history.append((now, mem_available))
        while history and now - history[0][0] > _TREND_WINDOW_S:
            history.popleft()
        first_t, first_v = history[0]
        if now - first_t < 1.0:
            return None
        return (mem_available - first_v) / (now - first_t)
