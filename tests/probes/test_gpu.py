"""GPU probe: answer parsing, the low-power rule, and real worker processes.

The integration tests run real child processes: the real worker with the real
pynvml (this machine has no NVIDIA driver, so it must say ``unavailable``),
children that hang past the deadline, and simulated GPUs that answer canned
lines.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import sys
import textwrap
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from spark_watchdog.probes.gpu import (
    GpuDevice,
    GpuProbe,
    GpuReading,
    GpuState,
    low_power_while_running,
    read_once,
)

T = TypeVar("T")


def _has_nvidia_driver() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


NO_DRIVER = pytest.mark.skipif(_has_nvidia_driver(), reason="this machine has an NVIDIA driver")
WITH_DRIVER = pytest.mark.skipif(not _has_nvidia_driver(), reason="no NVIDIA driver here")

# What a GB10 answers (docs/facts.md, "NVML on GB10"): memory is NOT_SUPPORTED,
# power ~45 W healthy.
GB10_ANSWER: dict[str, Any] = {
    "state": "ok",
    "devices": [
        {
            "index": 0,
            "name": "NVIDIA GB10",
            "uuid": "GPU-5d2e8f7a-1b3c-4d5e-8f9a-0b1c2d3e4f5a",
            "power_w": 44.871,
            "utilization_gpu_pct": 96,
            "temperature_c": 53,
            "sm_clock_mhz": 2405,
            "memory_used_bytes": None,
            "memory_total_bytes": None,
            "not_supported": ["memory_used_bytes", "memory_total_bytes"],
            "errors": {},
        }
    ],
    "error": None,
    "driver_version": "580.95.05",
    "nvml_version": "13.580.95.05",
}


def run_async(scenario: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await scenario()

    return asyncio.run(main())


def child(tmp_path: Path, name: str, body: str) -> list[str]:
    """A Python child process running ``body``; it appends its pid to ``pids``."""
    script = tmp_path / f"{name}.py"
    prologue = f"""
        import json, os, signal, sys, time
        with open({str(tmp_path / "pids")!r}, "a") as pids:
            pids.write(f"{{os.getpid()}}\\n")
    """
    script.write_text(textwrap.dedent(prologue) + textwrap.dedent(body))
    return [sys.executable, str(script)]


def spawned_pids(tmp_path: Path) -> list[int]:
    path = tmp_path / "pids"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


# Reads the request, then never answers, and ignores SIGTERM: a worker stuck in
# the driver. Gives up after a minute so a failed test leaves nothing behind.
HANGING = """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.stdin.readline()
    time.sleep(60)
"""


def canned(answer: object) -> str:
    """A simulated GPU that answers every request with ``answer``."""
    return f"""
        line = json.dumps({answer!r})
        for request in sys.stdin:
            print(line, flush=True)
    """


# --- answers -------------------------------------------------------------------------


def test_parses_a_gb10_answer() -> None:
    reading = GpuReading.from_json(GB10_ANSWER)
    assert reading.state == "ok"
    assert reading.error is None
    assert reading.driver_version == "580.95.05"
    (device,) = reading.devices
    assert device.name == "NVIDIA GB10"
    assert device.power_w == pytest.approx(44.871)
    assert device.utilization_gpu_pct == 96
    assert device.memory_used_bytes is None
    assert device.not_supported == ("memory_used_bytes", "memory_total_bytes")
    assert GpuReading.from_json(reading.to_json()) == reading
    assert {"state", "devices", "error"} <= set(reading.to_json())


def _gb10_with(**changes: Any) -> dict[str, Any]:
    device = {**GB10_ANSWER["devices"][0], **changes}
    return {**GB10_ANSWER, "devices": [device]}


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        ([1, 2], "expected a JSON object"),
        ({"state": "fine", "devices": []}, "state: expected one of ok, unavailable"),
        ({"devices": []}, "state: expected one of"),
        ({"state": "ok", "devices": {}}, "devices: expected a list"),
        ({"state": "ok", "devices": []}, "devices: expected at least one device"),
        ({"state": "ok", "devices": ["gpu0"]}, "devices[0]: expected an object"),
        (_gb10_with(index=True), "devices[0].index: expected an integer"),
        (_gb10_with(index=None), "devices[0].index: expected an integer"),
        (_gb10_with(power_w="45 W"), 'devices[0].power_w: expected a number or null, got "45 W"'),
        (_gb10_with(power_w=float("nan")), "devices[0].power_w: expected a number"),
        (_gb10_with(utilization_gpu_pct=96.5), "devices[0].utilization_gpu_pct: expected an int"),
        (_gb10_with(temperature_c=False), "devices[0].temperature_c: expected an integer"),
        (_gb10_with(name=10), "devices[0].name: expected a string or null"),
        (_gb10_with(not_supported="memory"), "devices[0].not_supported: expected a list"),
        (_gb10_with(errors={"power_w": 3}), "devices[0].errors: expected an object"),
        ({**GB10_ANSWER, "error": 7}, "error: expected a string or null"),
        ({**GB10_ANSWER, "driver_version": 580}, "driver_version: expected a string"),
    ],
)
def test_malformed_answers_become_errors_naming_the_field(payload: object, named: str) -> None:
    reading = GpuReading.from_json(payload)
    assert reading.state == "error"
    assert reading.devices == ()
    assert reading.error is not None
    assert named in reading.error


def test_error_answers_keep_their_message() -> None:
    reading = GpuReading.from_json({"state": "unavailable", "devices": [], "error": "no GPU"})
    assert (reading.state, reading.error) == ("unavailable", "no GPU")


# --- the low-power rule -----------------------------------------------------------------


def _reading(*watts: float | None, state: GpuState = "ok") -> GpuReading:
    return GpuReading(state, tuple(GpuDevice(index=i, power_w=w) for i, w in enumerate(watts)))


@pytest.mark.parametrize(
    ("reading", "running", "expected"),
    [
        (_reading(21.0), 4, True),  # wedged GB10: 16-27 W with work queued
        (_reading(21.0), 0.5, True),
        (_reading(45.0), 4, False),  # healthy
        (_reading(30.0), 4, False),  # at the threshold is not below it
        (_reading(21.0), 0, False),  # idle GPUs are cheap
        (_reading(21.0), None, False),  # vLLM metrics unknown
        (_reading(None), 4, False),  # power not readable
        (_reading(None, 21.0), 4, True),  # any device counts
        (_reading(45.0, 90.0), 4, False),
        (_reading(state="timeout"), 4, False),  # a timeout is its own signal
        (_reading(state="unavailable"), 4, False),
    ],
)
def test_low_power_while_running(
    reading: GpuReading, running: float | None, expected: bool
) -> None:
    assert low_power_while_running(reading, running, low_power_watts=30.0) is expected


def test_the_probe_refuses_a_nonsense_deadline() -> None:
    with pytest.raises(ValueError, match="deadline"):
        GpuProbe(0)
    with pytest.raises(ValueError, match="worker_argv"):
        GpuProbe(1, worker_argv=[])


# --- the real worker ----------------------------------------------------------------------


@pytest.mark.integration
@NO_DRIVER
def test_real_worker_without_a_driver_is_unavailable() -> None:
    async def scenario() -> None:
        async with GpuProbe(deadline=10) as probe:
            first = await probe.read()
            pid = probe.worker_pid
            second = await probe.read()
            assert probe.worker_pid == pid  # the worker stays up and retries init
        assert first.state == second.state == "unavailable"
        assert first.devices == ()
        assert first.error is not None
        assert "libnvidia-ml.so.1 not found" in first.error
        assert "no NVIDIA driver" in first.error
        assert pid is not None
        assert is_gone(pid)  # close() ended it

    run_async(scenario)


@pytest.mark.integration
@WITH_DRIVER
def test_real_worker_reads_real_gpus() -> None:
    reading = read_once(deadline=10)
    assert reading.state == "ok", reading.error
    assert reading.devices
    assert all(d.name and d.uuid and d.power_w is not None for d in reading.devices)


@pytest.mark.integration
def test_the_worker_is_the_parents_own_copy_of_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Another spark_watchdog earlier on the path (an older install, another
    # checkout) must not answer for this one: parent and worker speak one protocol.
    shadow = tmp_path / "shadow" / "spark_watchdog" / "probes"
    shadow.mkdir(parents=True)
    (shadow.parent / "__init__.py").write_text("")
    (shadow / "__init__.py").write_text("")
    (shadow / "gpu_worker.py").write_text(
        "import sys\n"
        "for line in sys.stdin:\n"
        '    print(\'{"state": "error", "error": "shadow worker"}\', flush=True)\n'
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "shadow"))
    monkeypatch.chdir(tmp_path)
    reading = read_once(deadline=10)
    assert reading.state in ("ok", "unavailable"), reading.error


# --- deadlines and dead workers ---------------------------------------------------------------


@pytest.mark.integration
class _QuickStartProbe(GpuProbe):
    # Keeps the hanging tests short: a fresh worker waits 0.5 s + 0.5 s.
    start_allowance_s = 0.5


def test_a_hanging_worker_times_out_is_killed_and_replaced(tmp_path: Path) -> None:
    argv = child(tmp_path, "hanging", HANGING)

    async def scenario() -> None:
        async with _QuickStartProbe(deadline=0.5, worker_argv=argv) as probe:
            first = await probe.read()
            assert first.state == "timeout"
            assert first.error == (
                "a freshly started NVML worker did not answer within 1 s (0.5 s to start "
                "and initialise NVML, 0.5 s to read); the driver may be wedged"
            )
            assert 1.0 <= first.duration_s < 4
            assert probe.worker_pid is None
            assert probe.stuck_worker_pids == ()
            (killed,) = spawned_pids(tmp_path)
            assert is_gone(killed)

            second = await probe.read()  # a fresh worker, which hangs as well
            assert second.state == "timeout"
            pids = spawned_pids(tmp_path)
            assert len(pids) == 2
            assert pids[1] != killed
            assert is_gone(pids[1])

    run_async(scenario)


# Slow to start (a loaded machine, a slow nvmlInit), then quick; hangs once
# the file ``hang`` exists.
SLOW_START = f"""
    time.sleep(1.5)
    line = json.dumps({GB10_ANSWER!r})
    for request in sys.stdin:
        if os.path.exists(os.path.join(os.path.dirname(__file__), "hang")):
            time.sleep(60)
        print(line, flush=True)
"""


def test_a_fresh_worker_gets_time_to_start_on_top_of_the_read_deadline(tmp_path: Path) -> None:
    """After one real timeout, the replacement's slow start is not a second one."""
    argv = child(tmp_path, "slow_start", SLOW_START)

    async def scenario() -> list[GpuReading]:
        async with GpuProbe(deadline=0.5, worker_argv=argv) as probe:
            first = await probe.read()  # 1.5 s to start: more than the 0.5 s deadline
            (tmp_path / "hang").touch()
            hung = await probe.read()  # a warm worker gets the plain deadline
            (tmp_path / "hang").unlink()
            return [first, hung, await probe.read()]

    first, hung, replaced = run_async(scenario)
    assert first.state == "ok", first.error
    assert first.duration_s >= 1.5
    assert hung.state == "timeout"
    assert hung.error == "NVML did not answer within 0.5 s; the driver may be wedged"
    assert hung.duration_s < 1.5
    assert replaced.state == "ok", replaced.error
    assert len(spawned_pids(tmp_path)) == 2


def stuck_count(probe: GpuProbe) -> int:
    # A function, not len() inline: mypy would narrow the property's tuple length
    # across awaits that change it.
    return len(probe.stuck_worker_pids)


class _UnkillableProbe(_QuickStartProbe):
    # Plays a worker in uninterruptible sleep: the "kill" does not kill.
    kill_signal = signal.SIGCONT
    reap_grace_s = 0.2


@pytest.mark.integration
def test_stuck_workers_do_not_pile_up(tmp_path: Path) -> None:
    argv = child(tmp_path, "stuck", HANGING)

    async def scenario() -> None:
        probe = _UnkillableProbe(deadline=0.5, worker_argv=argv)
        try:
            first = await probe.read()
            assert first.state == "timeout"
            assert first.error is not None
            assert "has not exited yet" in first.error
            assert stuck_count(probe) == 1

            second = await probe.read()  # one stuck: one more worker is allowed
            assert second.state == "timeout"
            assert stuck_count(probe) == 2

            third = await probe.read()  # two stuck: no more
            assert third.state == "timeout"
            assert third.error is not None
            assert "not starting another" in third.error
            await asyncio.sleep(0.3)
            assert spawned_pids(tmp_path) == list(probe.stuck_worker_pids)

            # When one finally dies, the probe starts workers again.
            os.kill(spawned_pids(tmp_path)[0], signal.SIGKILL)
            for _ in range(100):
                if stuck_count(probe) == 1:
                    break
                await asyncio.sleep(0.05)
            assert stuck_count(probe) == 1
            fourth = await probe.read()
            assert fourth.state == "timeout"
            assert len(spawned_pids(tmp_path)) == 3
        finally:
            for pid in spawned_pids(tmp_path):
                if not is_gone(pid):
                    os.kill(pid, signal.SIGKILL)
            await probe.close()
        assert probe.stuck_worker_pids == ()

    run_async(scenario)


@pytest.mark.integration
def test_a_cancelled_read_does_not_leave_its_answer_for_the_next(tmp_path: Path) -> None:
    argv = child(
        tmp_path,
        "slow",
        f"""
        line = json.dumps({GB10_ANSWER!r})
        for request in sys.stdin:
            time.sleep(0.5)
            print(line, flush=True)
        """,
    )

    async def scenario() -> None:
        async with GpuProbe(deadline=5, worker_argv=argv) as probe:
            first = asyncio.create_task(probe.read())
            # Cancelled while its worker is at work (started, and answering 0.5 s
            # after the request): on a loaded machine a Python start alone can
            # take longer than any fixed delay.
            deadline = time.monotonic() + 60
            while not spawned_pids(tmp_path) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.1)
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            assert probe.worker_pid is None
            assert (await probe.read()).state == "ok"
        cancelled, fresh = spawned_pids(tmp_path)
        assert cancelled != fresh
        assert is_gone(cancelled)

    run_async(scenario)


@pytest.mark.integration
def test_a_worker_that_exits_is_an_error_with_its_stderr(tmp_path: Path) -> None:
    argv = child(
        tmp_path,
        "crashing",
        """
        sys.stdin.readline()
        print("Traceback: libnvidia-ml.so.1: cannot open shared object", file=sys.stderr)
        sys.exit(3)
        """,
    )

    async def scenario() -> None:
        async with GpuProbe(deadline=5, worker_argv=argv) as probe:
            reading = await probe.read()
            assert reading.state == "error"
            assert reading.error is not None
            assert "exited (exit code 3) without answering" in reading.error
            assert "cannot open shared object" in reading.error
            assert probe.worker_pid is None
            assert (await probe.read()).state == "error"
        assert len(spawned_pids(tmp_path)) == 2  # each read tried a fresh worker

    run_async(scenario)


@pytest.mark.integration
def test_a_garbage_answer_is_an_error_and_the_worker_is_replaced(tmp_path: Path) -> None:
    argv = child(
        tmp_path,
        "garbage",
        """
        for request in sys.stdin:
            print("Segmentation fault (core dumped)", flush=True)
        """,
    )

    async def scenario() -> None:
        async with GpuProbe(deadline=5, worker_argv=argv) as probe:
            reading = await probe.read()
            assert reading.state == "error"
            assert reading.error is not None
            assert "not JSON" in reading.error
            assert "Segmentation fault" in reading.error
            assert probe.worker_pid is None
            await probe.read()
        first, second = spawned_pids(tmp_path)
        assert first != second
        assert is_gone(first)
        assert is_gone(second)

    run_async(scenario)


@pytest.mark.integration
def test_a_wrongly_shaped_answer_names_the_field(tmp_path: Path) -> None:
    argv = child(tmp_path, "wrong", canned(_gb10_with(power_w="45 W")))
    reading = read_once(deadline=5, worker_argv=argv)
    assert reading.state == "error"
    assert reading.error is not None
    assert "devices[0].power_w" in reading.error


@pytest.mark.integration
def test_a_worker_that_cannot_start_is_an_error(tmp_path: Path) -> None:
    reading = read_once(deadline=5, worker_argv=[str(tmp_path / "no-such-worker")])
    assert reading.state == "error"
    assert reading.error is not None
    assert "could not start the NVML worker" in reading.error


# --- a simulated GPU ------------------------------------------------------------------------------


@pytest.mark.integration
def test_a_simulated_gb10_is_read_through_one_long_lived_worker(tmp_path: Path) -> None:
    argv = child(tmp_path, "gb10", canned(GB10_ANSWER))

    async def scenario() -> None:
        async with GpuProbe(deadline=5, worker_argv=argv) as probe:
            readings = [await probe.read() for _ in range(5)]
            pid = probe.worker_pid
        assert spawned_pids(tmp_path) == [pid]  # one worker served every read
        assert pid is not None
        assert is_gone(pid)
        for reading in readings:
            assert reading.state == "ok"
            assert reading.devices == GpuReading.from_json(GB10_ANSWER).devices
            assert reading.devices[0].not_supported == ("memory_used_bytes", "memory_total_bytes")
        # Warm reads skip process start-up: far below the first one's cost.
        assert max(r.duration_s for r in readings[1:]) < 0.2
        assert not low_power_while_running(readings[0], 3, low_power_watts=30)

    run_async(scenario)


@pytest.mark.integration
def test_a_noisy_worker_stderr_does_not_block_it(tmp_path: Path) -> None:
    # 1 MiB of stderr per answer: more than a pipe holds. Undrained, the worker
    # would block on write and look like a wedged driver.
    body = f"""
        line = json.dumps({GB10_ANSWER!r})
        for request in sys.stdin:
            sys.stderr.write("w" * 2**20)
            sys.stderr.flush()
            print(line, flush=True)
    """
    argv = child(tmp_path, "noisy", body)

    async def scenario() -> list[GpuReading]:
        async with GpuProbe(deadline=5, worker_argv=argv) as probe:
            return [await probe.read() for _ in range(3)]

    assert [r.state for r in run_async(scenario)] == ["ok"] * 3
