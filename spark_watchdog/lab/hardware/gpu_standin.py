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


def write_mode(node_dir: str | os.PathLike[str], mode: str) -> None:
    """Switch a node's simulated GPU (atomically: a worker may be reading)."""
    if mode not in MODES:
        raise ValueError(f"gpu mode: expected one of {', '.join(MODES)}, got {mode!r}")
    path = control_file(node_dir)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"mode": mode}) + "\n")
    os.replace(tmp, path)


def _mode() -> str:
    try:
        value = json.loads(control_file().read_text())
    except (OSError, ValueError):
        return "ok"
    mode = value.get("mode") if isinstance(value, dict) else None
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


def nvmlDeviceGetMemoryInfo(handle: _Handle) -> Any:
    # GB10's unified memory: NVML has no framebuffer to report.
    raise NVMLError_NotSupported("Not Supported")
