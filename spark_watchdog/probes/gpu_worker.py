"""The NVML worker: a long-lived child process that reads the GPU for the agent.

Run as ``python -m spark_watchdog.probes.gpu_worker``. The parent
(:mod:`spark_watchdog.probes.gpu`) writes one request line, ``read``, to stdin;
the worker answers one JSON line on stdout::

    {"state": "ok", "devices": [...], "error": null,
     "driver_version": "580.95.05", "nvml_version": "13.580.95.05"}

Why a separate process: NVML calls can block in uninterruptible sleep when the
driver is wedged (NVIDIA/gpu-monitoring-tools #46; leptonai/gpud PR #117), and no
thread can be interrupted out of that. A process can at least be abandoned, so
the parent gives each request a deadline and kills the worker that misses it.

Why long-lived: a warm NVML read costs ~1-2 µs, ``nvmlInit`` 20-90 ms and a fresh
Python process ~210 ms (measured on an H200:
docs/facts.md, "Cost of an NVML read"), so the worker keeps NVML initialised
between requests instead of starting once per read.

This module is loaded into its own small process, so it imports only the
standard library and ``pynvml`` (package ``nvidia-ml-py``), never the rest of
spark_watchdog.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

READ_REQUEST = "read"
# Xid events kept between two reads; beyond that the oldest are dropped (and counted).
XID_EVENTS_KEPT = 64
# How long one wait on the event set lasts (ms): the watcher stays responsive.
_XID_WAIT_MS = 500

# nvmlInit failures that mean "there is no usable NVIDIA GPU here" rather than
# "the GPU is in trouble". Everything else at init (GPU is lost, RM version
# mismatch after a driver update without reboot, ...) is reported as an error.
_UNAVAILABLE_AT_INIT = {
    "NVMLError_LibraryNotFound": "libnvidia-ml.so.1 not found: no NVIDIA driver is installed",
    "NVMLError_DriverNotLoaded": "the NVIDIA kernel driver is not loaded",
    "NVMLError_NoPermission": "no permission to open the NVIDIA device files (/dev/nvidia*)",
}


def _text(value: Any) -> str:
    # nvidia-ml-py returns str for names and versions; releases before 11.5
    # returned bytes.
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


class NvmlSession:
    """Holds NVML open across requests and turns one read into a JSON-ready answer.

    ``nvml`` is the ``pynvml`` module, or ``None`` when it cannot be imported;
    tests pass a stand-in that raises pynvml's own error classes.
    """

    def __init__(self, nvml: Any, watch_xids: bool = True) -> None:
        self._nvml = nvml
        self._initialised = False
        self._watch_xids = watch_xids
        self.xids: XidWatcher | None = None

    def answer(self, request: str) -> dict[str, Any]:
        if request != READ_REQUEST:
            return _failure("error", f'unknown request "{request}"; expected "{READ_REQUEST}"')
        try:
            answer = self._read()
        except Exception as exc:  # the worker must answer, not die
            answer = _failure("error", f"NVML worker failed: {type(exc).__name__}: {exc}")
        if self.xids is not None:
            answer["xid_watcher"], answer["xid_events"], answer["xid_dropped"] = self.xids.drain()
        return answer

    def _read(self) -> dict[str, Any]:
        nvml = self._nvml
        if nvml is None:
            return _failure("error", "python module pynvml is not installed (install nvidia-ml-py)")
        if not self._initialised:
            # Retried on every request until it succeeds: the agent may start
            # before the nvidia module is loaded at boot.
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                reason = _UNAVAILABLE_AT_INIT.get(type(exc).__name__)
                if reason is not None:
                    return _failure("unavailable", f"{reason} ({exc})")
                return _failure("error", f"nvmlInit failed: {exc}")
            self._initialised = True
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            return _failure("error", f"nvmlDeviceGetCount failed: {exc}")
        if count == 0:
            return _failure("unavailable", "NVML found no GPU on this machine")
        if self._watch_xids and self.xids is None:
            self.xids = XidWatcher(nvml)
            try:
                self.xids.start(count)
            except Exception as exc:  # a pynvml without the event calls: no watcher, no harm
                self.xids.state = "refused"
                self.xids.detail = f"cannot watch Xid events: {type(exc).__name__}: {exc}"
        return {
            "state": "ok",
            "devices": [self._device(index) for index in range(count)],
            "error": None,
            "driver_version": self._version(nvml.nvmlSystemGetDriverVersion),
            "nvml_version": self._version(nvml.nvmlSystemGetNVMLVersion),
        }

    def _version(self, call: Callable[[], Any]) -> str | None:
        try:
            return _text(call())
        except self._nvml.NVMLError:
            return None

    def _device(self, index: int) -> dict[str, Any]:
        nvml = self._nvml
        device: dict[str, Any] = {"index": index}
        not_supported: list[str] = []
        errors: dict[str, str] = {}

        def field(call: Callable[[], Any], *names: str) -> Any:
            # Each NVML call stands alone: on GB10 nvmlDeviceGetMemoryInfo answers
            # NOT_SUPPORTED (unified memory; nvitop PR #208, gpud PR #1170) while
            # power, utilization, temperature and clocks work. ``names`` are the
            # answer's fields that this one call feeds.
            try:
                return call()
            except nvml.NVMLError_NotSupported:
                not_supported.extend(names)
            except nvml.NVMLError as exc:
                errors.update(dict.fromkeys(names, str(exc)))
            return None

        handle = field(lambda: nvml.nvmlDeviceGetHandleByIndex(index), *DEVICE_FIELDS)
        if handle is None:
            device.update(dict.fromkeys(DEVICE_FIELDS))
        else:
            name = field(lambda: nvml.nvmlDeviceGetName(handle), "name")
            uuid = field(lambda: nvml.nvmlDeviceGetUUID(handle), "uuid")
            milliwatts = field(lambda: nvml.nvmlDeviceGetPowerUsage(handle), "power_w")
            rates = field(lambda: nvml.nvmlDeviceGetUtilizationRates(handle), "utilization_gpu_pct")
            temperature = field(
                lambda: nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
                "temperature_c",
            )
            sm_clock = field(
                lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM), "sm_clock_mhz"
            )
            memory = field(
                lambda: nvml.nvmlDeviceGetMemoryInfo(handle),
                "memory_used_bytes",
                "memory_total_bytes",
            )
            device["name"] = None if name is None else _text(name)
            device["uuid"] = None if uuid is None else _text(uuid)
            # nvmlDeviceGetPowerUsage reports milliwatts.
            device["power_w"] = None if milliwatts is None else int(milliwatts) / 1000.0
            device["utilization_gpu_pct"] = None if rates is None else int(rates.gpu)
            device["temperature_c"] = None if temperature is None else int(temperature)
            device["sm_clock_mhz"] = None if sm_clock is None else int(sm_clock)
            device["memory_used_bytes"] = None if memory is None else int(memory.used)
            device["memory_total_bytes"] = None if memory is None else int(memory.total)
        device["not_supported"] = not_supported
        device["errors"] = errors
        return device


class XidWatcher:
    """Xid critical errors as the driver reports them, live (docs/facts.md, "Xid events").

    Registers every GPU for Xid critical error events only (clock events too
    would flood the set) and waits on the set in a thread of its own, a short
    wait at a time; each event is kept (the Xid, the GPU's index, the time)
    until the next read drains them. What registered and what NVML refused is
    its ``state``: ``on``, ``refused`` (no GPU accepted: GB10's NVML may), or
    ``failed`` (the wait failed: the worker is replaced as after any error).
    """

    def __init__(self, nvml: Any, clock: Callable[[], float] = time.time) -> None:
        self._nvml = nvml
        self._clock = clock
        self.state = "off"
        self.detail: str | None = None
        self._events: deque[dict[str, Any]] = deque(maxlen=XID_EVENTS_KEPT)
        self._dropped = 0
        self._lock = threading.Lock()

    def start(self, count: int) -> None:
        nvml = self._nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            self.state, self.detail = "refused", f"nvmlEventSetCreate failed: {exc}"
            return
        refused: list[str] = []
        watched = 0
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
                watched += 1
            except nvml.NVMLError as exc:
                refused.append(f"GPU {index}: {exc}")
        self.detail = "; ".join(refused) or None
        if not watched:
            self.state = "refused"
            return
        self.state = "on"
        thread = threading.Thread(target=self._wait, args=(event_set,), daemon=True)
        thread.start()

    def _wait(self, event_set: Any) -> None:
        nvml = self._nvml
        while True:
            try:
                data = nvml.nvmlEventSetWait_v2(event_set, _XID_WAIT_MS)
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError as exc:
                self.state, self.detail = "failed", f"nvmlEventSetWait_v2 failed: {exc}"
                return
            self._note(data)

    def _note(self, data: Any) -> None:
        nvml = self._nvml
        try:
            index: int | None = int(nvml.nvmlDeviceGetIndex(data.device))
        except (nvml.NVMLError, TypeError, ValueError):
            index = None
        event = {"xid": int(data.eventData), "gpu": index, "at_unix": self._clock()}
        with self._lock:
            if len(self._events) == XID_EVENTS_KEPT:
                self._dropped += 1
            self._events.append(event)

    def drain(self) -> tuple[dict[str, Any], list[dict[str, Any]], int]:
        """What the watcher is, and the events and drops since the last drain."""
        with self._lock:
            events, dropped = list(self._events), self._dropped
            self._events.clear()
            self._dropped = 0
        return {"state": self.state, "detail": self.detail}, events, dropped


# The per-device fields of an answer, besides ``index``, ``not_supported`` and ``errors``.
DEVICE_FIELDS = (
    "name",
    "uuid",
    "power_w",
    "utilization_gpu_pct",
    "temperature_c",
    "sm_clock_mhz",
    "memory_used_bytes",
    "memory_total_bytes",
)


def _failure(state: str, message: str) -> dict[str, Any]:
    return {"state": state, "devices": [], "error": message}


def _protocol_stream() -> TextIO:
    """Keep stdout for answers only: anything else that writes to fd 1 goes to stderr."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    return answers


def serve(session: NvmlSession, requests: TextIO, answers: TextIO) -> None:
    """Answer one JSON line per request line until the parent closes stdin."""
    while True:
        line = requests.readline()
        if not line:  # EOF: the parent is gone or done with us
            return
        request = line.strip()
        if request:
            answers.write(json.dumps(session.answer(request)) + "\n")
            answers.flush()


def main() -> int:
    answers = _protocol_stream()
    try:
        import pynvml
    except ImportError:
        nvml: Any = None
    else:
        nvml = pynvml
    try:
        serve(NvmlSession(nvml), sys.stdin, answers)
    except KeyboardInterrupt:  # Ctrl-C on the CLI reaches its children too
        return 130
    except BrokenPipeError:  # the parent closed our stdout: nobody to answer
        return 0
    # No nvmlShutdown on the way out: on a wedged driver it can block like any
    # other NVML call, and process exit releases NVML anyway.
    return 0


if __name__ == "__main__":
    sys.exit(main())
