"""A stand-in for NVML (``pynvml``): one simulated GB10 GPU per lab node.

The lab copies this file into its directory as ``nvml/pynvml.py`` and puts
that directory on the node's ``PYTHONPATH``, so the agent's real GPU probe
starts its real worker (:mod:`spark_watchdog.probes.gpu_worker`), which
imports this module as ``pynvml``. Only the driver library is simulated; the
worker, its deadline and the probe that kills a worker that misses it run
unchanged.

What it answers is what a GB10 answers (docs/facts.md, "NVML on GB10"): one
device, power 45-90 W under load, ``nvmlDeviceGetMemoryInfo`` NOT_SUPPORTED
(unified memory). It reads ``$SPARK_WATCHDOG_NODE_DIR/gpu.json`` on every call:

- ``{"mode": "ok"}`` (or no file): answers at once;
- ``{"mode": "hang"}``: every device call blocks, like NVML in uninterruptible
  sleep on a wedged driver (NVIDIA/gpu-monitoring-tools #46). The probe must
  give up after its deadline and kill the worker; the next worker hangs too
  until the mode is ``ok`` again (a power cycle resets it);
- ``{"mode": "latched"}``: busy as ever, but the SM clock stays at 702 MHz
  (the clock latch: docs/facts.md, "Clock latch").

Beside the mode, ``"xids"``: the Xid critical errors the driver reported, each
``{"xid": 31, "at": UNIX_TIME}``, written by :func:`inject_xid` (``lab inject
xid NODE``). A worker's event set gets each one written after the worker
started, once, as NVML delivers an event (docs/facts.md, "Xid events").

Standard library only: it is loaded into the small NVML worker process.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
DRIVER_VERSION = "580.95.05"
NVML_VERSION = "13.580.95.05"
MODES = ("ok", "hang", "latched")
SM_CLOCK_MHZ = 2418
LATCHED_SM_CLOCK_MHZ = 702
CONTROL_NAME = "gpu.json"
# How often a hung call looks whether it was released (a healed lab, not a real driver).
_HANG_POLL_S = 0.2


class NVMLError(Exception):
    """pynvml's base error class."""


# pynvml's own names, kept so the worker finds them.
class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_DriverNotLoaded(NVMLError):
    pass


class NVMLError_NoPermission(NVMLError):
    pass


class NVMLError_Timeout(NVMLError):
    pass


nvmlEventTypeXidCriticalError = 8
_STARTED = time.time()  # a worker sees only the Xids written after it started
_DELIVERED: set[tuple[float, int]] = set()


class _EventSet:
    pass


class _EventData:
    def __init__(self, xid: int) -> None:
        self.device = _Handle(0)
        self.eventType = nvmlEventTypeXidCriticalError
        self.eventData = xid
        self.gpuInstanceId = 0
        self.computeInstanceId = 0


class _Utilization:
    def __init__(self, gpu: int, memory: int) -> None:
        self.gpu = gpu
        self.memory = memory


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def control_file(node_dir: str | os.PathLike[str] | None = None) -> Path:
    base = node_dir if node_dir is not None else os.environ.get("SPARK_WATCHDOG_NODE_DIR", ".")
    return Path(base) / CONTROL_NAME


def _control(node_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    try:
        value = json.loads(control_file(node_dir).read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _write(node_dir: str | os.PathLike[str], control: dict[str, Any]) -> None:
    path = control_file(node_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(control) + "\n")
    os.replace(tmp, path)  # atomically: a worker may be reading


def write_mode(node_dir: str | os.PathLike[str], mode: str) -> None:
    """Switch a node's simulated GPU; the Xids reported so far stay."""
    if mode not in MODES:
        raise ValueError(f"gpu mode: expected one of {', '.join(MODES)}, got {mode!r}")
    _write(node_dir, {**_control(node_dir), "mode": mode})


def inject_xid(node_dir: str | os.PathLike[str], xid: int = 31) -> None:
    """The driver reports an Xid critical error on the node's GPU now."""
    control = _control(node_dir)
    xids = [x for x in control.get("xids", []) if isinstance(x, dict)][-15:]
    _write(node_dir, {**control, "xids": [*xids, {"xid": int(xid), "at": time.time()}]})


def _mode() -> str:
    mode = _control().get("mode")
    return mode if mode in MODES else "ok"


def _device_call() -> None:
    """Every device call goes through here: a hung driver blocks them all."""
    while _mode() == "hang":
        time.sleep(_HANG_POLL_S)


def nvmlInit() -> None:
    return None


def nvmlDeviceGetCount() -> int:
    return 1


def nvmlSystemGetDriverVersion() -> str:
    return DRIVER_VERSION


def nvmlSystemGetNVMLVersion() -> str:
    return NVML_VERSION


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    if index != 0:
        raise NVMLError(f"Invalid Argument (device {index})")
    return _Handle(index)


def nvmlDeviceGetName(handle: _Handle) -> str:
    return "NVIDIA GB10"


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    node = Path(os.environ.get("SPARK_WATCHDOG_NODE_DIR", "lab")).name
    return f"GPU-lab-{node}"


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    _device_call()
    return int(random.uniform(45.0, 90.0) * 1000)  # milliwatts, like NVML


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> _Utilization:
    _device_call()
    return _Utilization(random.randint(90, 99), random.randint(20, 60))


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    _device_call()
    return random.randint(55, 72)


def nvmlDeviceGetClockInfo(handle: _Handle, clock: int) -> int:
    _device_call()
    return LATCHED_SM_CLOCK_MHZ if _mode() == "latched" else SM_CLOCK_MHZ


def nvmlDeviceGetIndex(handle: _Handle) -> int:
    return handle.index


def nvmlEventSetCreate() -> _EventSet:
    return _EventSet()


def nvmlDeviceRegisterEvents(handle: _Handle, eventTypes: int, eventSet: _EventSet) -> None:
    if eventTypes != nvmlEventTypeXidCriticalError:
        raise NVMLError_NotSupported("Not Supported")


def nvmlEventSetWait_v2(eventSet: _EventSet, timeoutms: int) -> _EventData:
    """The next Xid written since this worker started, or a timeout."""
    deadline = time.monotonic() + timeoutms / 1000.0
    while True:
        for entry in _control().get("xids", []):
            at, xid = entry.get("at"), entry.get("xid")
            if not isinstance(at, (int, float)) or not isinstance(xid, int) or at < _STARTED:
                continue
            if (at, xid) not in _DELIVERED:
                _DELIVERED.add((at, xid))
                return _EventData(xid)
        if time.monotonic() >= deadline:
            raise NVMLError_Timeout("Timeout")
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> Any:
    # GB10's unified memory: NVML has no framebuffer to report.
    raise NVMLError_NotSupported("Not Supported")
