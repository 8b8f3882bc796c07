"""GPU probe: NVML readings from a long-lived worker process that can be abandoned.

NVML calls can block in uninterruptible sleep when the driver is wedged
(NVIDIA/gpu-monitoring-tools #46; leptonai/gpud PR #117), so the agent never
calls NVML itself. :class:`GpuProbe` keeps one child process
(:mod:`spark_watchdog.probes.gpu_worker`) that holds NVML open, sends it a
request per read and waits at most ``deadline`` seconds. A worker that misses
its deadline is killed and the reading says ``timeout`` — itself a strong sign
of a wedged driver. The next read starts a fresh worker.

States: ``ok`` (devices read; single fields may be null, see
:class:`GpuDevice`), ``unavailable`` (no NVIDIA driver or no GPU here),
``timeout`` (NVML did not answer in time) and ``error`` (the worker failed or
answered nonsense).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal, get_args

import spark_watchdog
from spark_watchdog.probes.gpu_worker import DEVICE_FIELDS, READ_REQUEST
from spark_watchdog.probes.xid_events import XidReport, parse_xid_report

GpuState = Literal["ok", "unavailable", "timeout", "error"]
GPU_STATES: tuple[GpuState, ...] = get_args(GpuState)

# An answer lists a handful of fields per device; anything near this size is not
# a worker answer.
_ANSWER_LIMIT_BYTES = 1024 * 1024
_STDERR_TAIL_BYTES = 2000
_STDERR_IN_MESSAGE_CHARS = 400


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as NVML reported it.

    Every reading is independent: a field NVML does not support on this device
    is null and named in ``not_supported`` (on GB10 the memory fields, because
    its memory is unified with the host's: nvitop PR #208, gpud PR #1170); a
    field whose call failed otherwise is null with the reason in ``errors``.
    """

    index: int
    name: str | None = None
    uuid: str | None = None
    power_w: float | None = None
    utilization_gpu_pct: int | None = None
    temperature_c: int | None = None
    sm_clock_mhz: int | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    not_supported: tuple[str, ...] = ()
    errors: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            **{name: getattr(self, name) for name in DEVICE_FIELDS},
            "not_supported": list(self.not_supported),
            "errors": dict(self.errors),
        }


@dataclass(frozen=True)
class GpuReading:
    """One GPU probe result: a state, the devices read, and why when not ``ok``."""

    state: GpuState
    devices: tuple[GpuDevice, ...] = ()
    error: str | None = None
    duration_s: float = 0.0
    driver_version: str | None = None
    nvml_version: str | None = None
    # The worker's Xid watcher and the events since the last read (handed on to
    # the agent's fault log, not part of the probe's report): probes/xid_events.py.
    xids: XidReport | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "devices": [device.to_json() for device in self.devices],
            "error": self.error,
            "duration_s": self.duration_s,
            "driver_version": self.driver_version,
            "nvml_version": self.nvml_version,
        }

    @classmethod
    def from_json(cls, payload: object) -> GpuReading:
        """Parse a worker answer (or :meth:`to_json` output).

        Never raises for bad input: a payload of the wrong shape becomes an
        ``error`` reading whose message names the offending field.
        """
        try:
            return _parse_reading(payload)
        except MalformedGpuAnswer as exc:
            return cls("error", error=f"malformed GPU answer: {exc}")


class MalformedGpuAnswer(ValueError):
    """A GPU answer does not have the expected shape; the message names the field."""


def _show(value: object) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _optional(data: Mapping[str, Any], key: str, path: str, kind: str) -> Any:
    """``data[key]`` checked against ``kind`` (str, int or number); absent or null gives None."""
    value = data.get(key)
    if value is None:
        return None
    if kind == "str":
        if isinstance(value, str):
            return value
        raise MalformedGpuAnswer(f"{path}: expected a string or null, got {_show(value)}")
    # bool is an int subclass in Python; true/false is never a valid reading.
    if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
        return value
    if (
        kind == "number"
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    ):
        return float(value)
    article = "an integer" if kind == "int" else "a number"
    raise MalformedGpuAnswer(f"{path}: expected {article} or null, got {_show(value)}")


def _parse_device(data: object, path: str) -> GpuDevice:
    if not isinstance(data, dict):
        raise MalformedGpuAnswer(f"{path}: expected an object, got {_show(data)}")
    index = data.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise MalformedGpuAnswer(f"{path}.index: expected an integer ≥ 0, got {_show(index)}")
    not_supported = data.get("not_supported", [])
    if not isinstance(not_supported, list) or not all(isinstance(n, str) for n in not_supported):
        raise MalformedGpuAnswer(
            f"{path}.not_supported: expected a list of field names, got {_show(not_supported)}"
        )
    errors = data.get("errors", {})
    if not isinstance(errors, dict) or not all(isinstance(m, str) for m in errors.values()):
        raise MalformedGpuAnswer(
            f"{path}.errors: expected an object of field: message, got {_show(errors)}"
        )
    return GpuDevice(
        index=index,
        name=_optional(data, "name", f"{path}.name", "str"),
        uuid=_optional(data, "uuid", f"{path}.uuid", "str"),
        power_w=_optional(data, "power_w", f"{path}.power_w", "number"),
        utilization_gpu_pct=_optional(
            data, "utilization_gpu_pct", f"{path}.utilization_gpu_pct", "int"
        ),
        temperature_c=_optional(data, "temperature_c", f"{path}.temperature_c", "int"),
        sm_clock_mhz=_optional(data, "sm_clock_mhz", f"{path}.sm_clock_mhz", "int"),
        memory_used_bytes=_optional(data, "memory_used_bytes", f"{path}.memory_used_bytes", "int"),
        memory_total_bytes=_optional(
            data, "memory_total_bytes", f"{path}.memory_total_bytes", "int"
        ),
        not_supported=tuple(not_supported),
        errors=dict(errors),
    )


def _parse_reading(payload: object) -> GpuReading:
    if not isinstance(payload, dict):
        raise MalformedGpuAnswer(f"expected a JSON object, got {_show(payload)}")
    state = payload.get("state")
    if state not in GPU_STATES:
        raise MalformedGpuAnswer(
            f"state: expected one of {', '.join(GPU_STATES)}, got {_show(state)}"
        )
    devices = payload.get("devices", [])
    if not isinstance(devices, list):
        raise MalformedGpuAnswer(f"devices: expected a list, got {_show(devices)}")
    if state == "ok" and not devices:
        raise MalformedGpuAnswer("devices: expected at least one device when state is ok")
    duration = _optional(payload, "duration_s", "duration_s", "number")
    return GpuReading(
        state=state,
        devices=tuple(_parse_device(d, f"devices[{i}]") for i, d in enumerate(devices)),
        error=_optional(payload, "error", "error", "str"),
        duration_s=0.0 if duration is None else duration,
        driver_version=_optional(payload, "driver_version", "driver_version", "str"),
        nvml_version=_optional(payload, "nvml_version", "nvml_version", "str"),
        xids=parse_xid_report(payload),
    )


def low_power_while_running(
    reading: GpuReading, requests_running: float | None, low_power_watts: float
) -> bool:
    """True when vLLM has requests running but a GPU draws less than ``low_power_watts``.

    Why power and not utilization: on a wedged GB10 kernel NVML still reports
    ~96 % utilization (eugr/spark-vllm-docker #260, flashinfer #5015), while the
    power draw falls to 16-27 W against ~45 W healthy and 90 W peaks
    (docs/facts.md, "NVML on GB10"). Low power alone means nothing — an idle GPU
    is cheap — so it only counts while ``vllm:num_requests_running`` is above
    zero. Unknown request counts (``None``) and readings other than ``ok`` never
    count: a timeout is its own, stronger signal. Devices whose power is unknown
    are skipped.
    """
    if requests_running is None or not requests_running > 0 or reading.state != "ok":
        return False
    return any(
        device.power_w is not None and device.power_w < low_power_watts
        for device in reading.devices
    )


def _signal_name(returncode: int) -> str:
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        return f"signal {signal.Signals(-returncode).name}"
    except ValueError:
        return f"signal {-returncode}"


class _Worker:
    """One running worker process and the tail of what it wrote to stderr."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        if process.stdin is None or process.stdout is None or process.stderr is None:
            raise RuntimeError(
                "the NVML worker must be started with stdin, stdout and stderr pipes"
            )
        self.process = process
        self.requests = process.stdin
        self.answers = process.stdout
        self._stderr = process.stderr
        self._stderr_tail = bytearray()
        # Drained all the time: a worker that fills its stderr pipe would block
        # and look exactly like a wedged driver.
        self._draining = asyncio.create_task(self._drain_stderr())
        self.reaper: asyncio.Task[int] | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    async def _drain_stderr(self) -> None:
        while chunk := await self._stderr.read(4096):
            self._stderr_tail += chunk
            del self._stderr_tail[:-_STDERR_TAIL_BYTES]

    async def ask(self) -> bytes:
        self.requests.write(READ_REQUEST.encode("ascii") + b"\n")
        await self.requests.drain()
        return await self.answers.readline()

    async def stderr_tail(self, wait_s: float) -> str:
        """The end of the worker's stderr, after waiting up to ``wait_s`` for it to close."""
        await asyncio.wait({self._draining}, timeout=wait_s)
        text = self._stderr_tail.decode("utf-8", "replace").strip()
        if len(text) > _STDERR_IN_MESSAGE_CHARS:
            text = "..." + text[-_STDERR_IN_MESSAGE_CHARS:]
        return text

    def close_requests(self) -> None:
        """Close the worker's stdin: a healthy worker exits on EOF."""
        if not self.requests.is_closing():
            self.requests.close()

    def forget(self) -> None:
        """Stop watching a worker that will not exit (the probe is closing)."""
        self._draining.cancel()
        if self.reaper is not None:
            self.reaper.cancel()


def _worker_environment() -> dict[str, str]:
    # The worker must run this very package, also from a source checkout that is
    # not installed: put the directory holding it first on the child's path.
    root = str(Path(spark_watchdog.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


class GpuProbe:
    """Reads the GPU through one long-lived worker process, each read with a deadline.

    ``worker_argv`` replaces the worker command (tests and the lab substitute a
    child that hangs, or a simulated GPU); it must speak the line protocol of
    :mod:`spark_watchdog.probes.gpu_worker`. Reads are serialised.
    """

    # Sent to a worker that missed its deadline. SIGKILL, because a worker stuck
    # in the driver will not run a handler; tests swap in a harmless signal to
    # play a worker that does not die.
    kill_signal: ClassVar[int] = signal.SIGKILL
    # How long a read waits for a killed worker to be reaped before moving on.
    reap_grace_s: ClassVar[float] = 0.5
    # A worker in uninterruptible sleep survives SIGKILL until the driver lets
    # go. Allow this many such leftovers while still starting a replacement;
    # beyond it, stop spawning (each would wedge too) until one of them exits.
    max_stuck_workers: ClassVar[int] = 1
    # A fresh worker's first read also pays for its start: a Python process and
    # nvmlInit, 186 ms together on an idle H200 (docs/benchmarks.md), seconds
    # on a loaded small machine. It gets
    # this much on top of ``deadline``, so that after one real timeout the
    # replacement's start is not counted as a second one.
    start_allowance_s: ClassVar[float] = 5.0

    def __init__(self, deadline: float, worker_argv: Sequence[str] | None = None) -> None:
        if not (isinstance(deadline, (int, float)) and deadline > 0 and math.isfinite(deadline)):
            raise ValueError(f"deadline: expected a number of seconds > 0, got {deadline!r}")
        self.deadline = float(deadline)
        self._env: dict[str, str] | None
        if worker_argv is None:
            self._argv: tuple[str, ...] = (sys.executable, "-m", "spark_watchdog.probes.gpu_worker")
            self._env = _worker_environment()
        else:
            if not worker_argv:
                raise ValueError("worker_argv: expected a command, got an empty list")
            self._argv = tuple(worker_argv)
            self._env = None
        self._worker: _Worker | None = None
        # Killed workers not yet reaped, each with its reaper task.
        self._stuck: set[_Worker] = set()
        self._lock = asyncio.Lock()

    @property
    def worker_pid(self) -> int | None:
        """The pid of the current worker, None before the first read or after a kill."""
        return None if self._worker is None else self._worker.pid

    @property
    def stuck_worker_pids(self) -> tuple[int, ...]:
        """Workers that were killed but have not exited (yet)."""
        return tuple(sorted(worker.pid for worker in self._stuck))

    async def __aenter__(self) -> GpuProbe:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def read(self) -> GpuReading:
        """One reading; never raises for anything the worker or NVML does."""
        async with self._lock:
            started = time.monotonic()
            reading = await self._read()
            return replace(reading, duration_s=round(time.monotonic() - started, 6))

    async def _read(self) -> GpuReading:
        worker = self._worker
        limit = self.deadline
        if worker is None:
            limit += self.start_allowance_s
            started = await self._start_worker()
            if isinstance(started, GpuReading):
                return started
            worker = started
        try:
            line = await asyncio.wait_for(worker.ask(), limit)
        except asyncio.TimeoutError:
            await self._discard(worker)
            return self._no_answer(worker, limit)
        except asyncio.CancelledError:
            # Cancelled mid-exchange: this worker's answer would arrive as the
            # next read's. Replace it.
            self._kill(worker)
            raise
        except ConnectionError:
            line = b""  # it died before taking the request: reported as an exit below
        except ValueError:  # readline: the line is longer than the stream limit
            await self._discard(worker)
            return GpuReading(
                "error",
                error=f"NVML worker answered with a line over {_ANSWER_LIMIT_BYTES} bytes",
            )
        if not line:
            return await self._report_exit(worker)
        try:
            return _parse_reading(json.loads(line))
        except ValueError as exc:  # not JSON, not UTF-8, or not a GPU answer
            await self._discard(worker)
            what = str(exc) if isinstance(exc, MalformedGpuAnswer) else f"not JSON: {line[:200]!r}"
            return GpuReading(
                "error",
                error=f"NVML worker answered with a malformed line: {what}"
                + await self._stderr_note(worker),
            )

    async def _start_worker(self) -> _Worker | GpuReading:
        """A fresh NVML worker, or the reading that says why none was started."""
        if len(self._stuck) > self.max_stuck_workers:
            pids = ", ".join(map(str, self.stuck_worker_pids))
            return GpuReading(
                "timeout",
                error=(
                    f"NVML is not answering: {len(self._stuck)} killed NVML workers "
                    f"(pids {pids}) have not exited, most likely stuck in uninterruptible "
                    "sleep in the driver; not starting another until one exits"
                ),
            )
        try:
            return await self._spawn()
        except OSError as exc:
            return GpuReading(
                "error",
                error=f"could not start the NVML worker `{shlex.join(self._argv)}`: {exc}",
            )

    def _no_answer(self, worker: _Worker, limit: float) -> GpuReading:
        """The reading for a worker that did not answer within ``limit`` s (now discarded)."""
        message = f"NVML did not answer within {self.deadline:g} s; the driver may be wedged"
        if limit > self.deadline:
            message = (
                f"a freshly started NVML worker did not answer within {limit:g} s "
                f"({self.start_allowance_s:g} s to start and initialise NVML, "
                f"{self.deadline:g} s to read); the driver may be wedged"
            )
        if worker in self._stuck:
            message += (
                f"; the killed worker (pid {worker.pid}) has not exited yet, "
                "most likely stuck in uninterruptible sleep in the driver"
            )
        return GpuReading("timeout", error=message)

    async def _spawn(self) -> _Worker:
        process = await asyncio.create_subprocess_exec(
            *self._argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self._env,
            limit=_ANSWER_LIMIT_BYTES,
        )
        self._worker = _Worker(process)
        return self._worker

    def _kill(self, worker: _Worker) -> asyncio.Task[int]:
        """Send ``worker`` the kill signal and start reaping it in the background."""
        if self._worker is worker:
            self._worker = None
        worker.close_requests()
        with contextlib.suppress(ProcessLookupError):
            worker.process.send_signal(self.kill_signal)
        reaper = asyncio.create_task(worker.process.wait())
        worker.reaper = reaper
        self._stuck.add(worker)
        reaper.add_done_callback(lambda _: self._stuck.discard(worker))
        return reaper

    async def _discard(self, worker: _Worker) -> None:
        """Kill ``worker``, waiting only briefly for it to be reaped."""
        await asyncio.wait({self._kill(worker)}, timeout=self.reap_grace_s)

    async def _report_exit(self, worker: _Worker) -> GpuReading:
        """The worker closed its stdout instead of answering."""
        if self._worker is worker:
            self._worker = None
        try:
            returncode = await asyncio.wait_for(worker.process.wait(), self.reap_grace_s)
        except asyncio.TimeoutError:
            await self._discard(worker)
            how = "closed its output without answering"
        else:
            how = f"exited ({_signal_name(returncode)}) without answering"
        return GpuReading("error", error=f"NVML worker {how}" + await self._stderr_note(worker))

    async def _stderr_note(self, worker: _Worker) -> str:
        tail = await worker.stderr_tail(self.reap_grace_s)
        return f"; its stderr ends: {tail}" if tail else ""

    async def close(self) -> None:
        """Stop the worker (EOF, then SIGKILL if it lingers); give up on stuck ones."""
        async with self._lock:
            worker, self._worker = self._worker, None
            if worker is not None:
                worker.close_requests()
                try:
                    await asyncio.wait_for(worker.process.wait(), self.reap_grace_s)
                except asyncio.TimeoutError:
                    await self._discard(worker)
            reapers = {w.reaper for w in self._stuck if w.reaper is not None}
            if reapers:
                await asyncio.wait(reapers, timeout=self.reap_grace_s)
            for leftover in list(self._stuck):
                leftover.forget()


def read_once(deadline: float, worker_argv: Sequence[str] | None = None) -> GpuReading:
    """One reading with a fresh worker, for the CLI: starts, reads, closes."""

    async def one_reading() -> GpuReading:
        async with GpuProbe(deadline, worker_argv) as probe:
            return await probe.read()

    return asyncio.run(one_reading())
