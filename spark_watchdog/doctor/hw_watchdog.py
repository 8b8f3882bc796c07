"""Node: is the hardware watchdog armed? The first layer of recovery, and only that.

systemd arms ``/dev/watchdog0`` when ``RuntimeWatchdogSec=`` is set
(systemd-system.conf(5)) and pets it from PID 1. On GB10 the driver is
``sbsa_gwdt``. It resets the host only when PID 1 stops running; whether it
resets a wedged GB10 at all is unconfirmed (open-gpu-kernel-modules #1358),
so the controller's out-of-band power path stays the real recovery.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from spark_watchdog.child_run import completed
from spark_watchdog.doctor.journal_checks import parse_timespan
from spark_watchdog.doctor.result import Finding, ok, warn

BUSCTL_ARGV = (
    "busctl",
    "get-property",
    "org.freedesktop.systemd1",
    "/org/freedesktop/systemd1",
    "org.freedesktop.systemd1.Manager",
    "RuntimeWatchdogUSec",
)
SYSTEMCTL_ARGV = ("systemctl", "show", "-p", "RuntimeWatchdogUSec")
# sd-bus's USEC_INFINITY: "RuntimeWatchdogSec=default", the driver's own timeout.
USEC_INFINITY = 2**64 - 1
# The drop-in docs/spark-prep.md writes.
DROPIN = "/etc/systemd/system.conf.d/watchdog.conf"
FIRST_LAYER = (
    "first layer only: it fires only if PID 1 stops, and whether it resets a wedged GB10 "
    "is unconfirmed; the controller's power path is the recovery that counts"
)

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """busctl or systemctl, bounded in bytes and time (child_run)."""
    return completed(argv, 5.0, 64 * 1024)


@dataclass(frozen=True)
class RuntimeWatchdog:
    """systemd's RuntimeWatchdogUSec: microseconds, USEC_INFINITY, or None with ``error``."""

    usec: int | None
    source: str
    error: str | None = None

    @property
    def armed(self) -> bool:
        return self.usec is not None and self.usec > 0

    def describe(self) -> str:
        if self.usec is None:
            return "RuntimeWatchdogUSec unknown"
        if self.usec == USEC_INFINITY:
            return "RuntimeWatchdogUSec=default (the driver's timeout)"
        return f"RuntimeWatchdogUSec={self.usec / 1e6:g}s"


def read_runtime_watchdog(run: Runner = _run) -> RuntimeWatchdog:
    """Over D-Bus (busctl) first, ``systemctl show`` second."""
    errors: list[str] = []
    for argv, parse in ((BUSCTL_ARGV, _parse_busctl), (SYSTEMCTL_ARGV, _parse_systemctl)):
        try:
            done = run(argv)
        except (OSError, subprocess.TimeoutExpired) as exc:
            errors.append(f"{argv[0]}: {exc}")
            continue
        output = done.stdout.strip()
        if done.returncode != 0:
            said = " ".join((done.stderr or output).split()) or f"exit {done.returncode}"
            errors.append(f"{argv[0]}: {said}")
            continue
        usec = parse(output)
        if usec is None:
            errors.append(f"{argv[0]}: unexpected answer {output[:80]!r}")
            continue
        return RuntimeWatchdog(usec, " ".join(argv[:2]))
    return RuntimeWatchdog(None, "", "; ".join(errors))


def _parse_busctl(output: str) -> int | None:
    kind, _, value = output.partition(" ")
    return int(value) if kind == "t" and value.strip().isdigit() else None


def _parse_systemctl(output: str) -> int | None:
    key, sep, value = output.partition("=")
    if key != "RuntimeWatchdogUSec" or not sep:
        return None
    value = value.strip()
    if value in ("infinity", "default"):
        return USEC_INFINITY
    if value == "off":
        return 0
    seconds = parse_timespan(value)
    return None if seconds is None else round(seconds * 1e6)


@dataclass(frozen=True)
class WatchdogDevice:
    """``/dev/watchdogN`` and what ``/sys/class/watchdog/watchdogN`` says of it."""

    name: str
    node_exists: bool
    sysfs_exists: bool
    identity: str | None
    timeout_s: int | None
    state: str | None  # "active" / "inactive"; needs CONFIG_WATCHDOG_SYSFS


def read_watchdog_device(root: Path = Path("/"), name: str = "watchdog0") -> WatchdogDevice:
    sysfs = root / "sys/class/watchdog" / name

    def attribute(attr: str) -> str | None:
        try:
            return (sysfs / attr).read_text(encoding="utf-8", errors="replace").strip() or None
        except OSError:
            return None

    timeout = attribute("timeout")
    return WatchdogDevice(
        name=name,
        node_exists=(root / "dev" / name).exists(),
        sysfs_exists=sysfs.is_dir(),
        identity=attribute("identity"),
        timeout_s=int(timeout) if timeout is not None and timeout.isdigit() else None,
        state=attribute("state"),
    )


def _device_text(device: WatchdogDevice) -> str:
    parts = [f"/dev/{device.name}"]
    if device.identity:
        parts.append(device.identity)
    if device.timeout_s is not None:
        parts.append(f"timeout {device.timeout_s} s")
    if device.state:
        parts.append(device.state)
    return ", ".join(parts)


def judge_watchdog(runtime: RuntimeWatchdog, device: WatchdogDevice) -> Finding:
    """Not armed is a warning, never a failure: detection and the power path work without it."""
    arm_fix = (
        f"put `[Manager]` and `RuntimeWatchdogSec=30s` in {DROPIN}, then `systemctl daemon-reexec`"
    )
    present = device.node_exists or device.sysfs_exists
    if runtime.usec is None:
        seen = _device_text(device) if present else f"no /dev/{device.name}"
        return warn(
            f"cannot read systemd's RuntimeWatchdogUSec ({runtime.error}); {seen}. "
            f"The hardware watchdog is the {FIRST_LAYER}",
            "run doctor on the node itself, as root, where systemd is PID 1; "
            "`systemctl show -p RuntimeWatchdogUSec` shows the value",
        )
    if not runtime.armed:
        seen = f"{_device_text(device)} is there" if present else f"no /dev/{device.name} either"
        return warn(
            f"systemd does not arm the hardware watchdog ({runtime.describe()}); {seen}. "
            f"It is the {FIRST_LAYER}",
            arm_fix,
        )
    if not present:
        return warn(
            f"{runtime.describe()} but there is no /dev/{device.name}: no watchdog driver is "
            f"loaded, so nothing is armed. It is the {FIRST_LAYER}",
            "load the driver (`modprobe sbsa_gwdt` on DGX Spark; make it permanent in "
            "/etc/modules-load.d/), then `systemctl daemon-reexec`",
        )
    if device.state is not None and device.state != "active":
        return warn(
            f"{runtime.describe()} but {_device_text(device)}: systemd has not opened it",
            f"`systemctl daemon-reexec`; if it stays inactive, check `journalctl -b -u init.scope "
            f"| grep -i watchdog`. ({FIRST_LAYER})",
        )
    return ok(f"armed: {runtime.describe()}, {_device_text(device)}; {FIRST_LAYER}")


def check_hardware_watchdog(root: Path = Path("/"), run: Runner = _run) -> Finding:
    return judge_watchdog(read_runtime_watchdog(run), read_watchdog_device(root))
