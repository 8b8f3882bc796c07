"""The NVML worker's answers, against a stand-in NVML that raises pynvml's real errors.

The stand-in only replaces the C library: the error objects are built exactly
as pynvml builds them from a return code (``NVMLError(code)``), and a test
below checks that every NVML function the stand-in offers exists in the
installed pynvml with a compatible signature, so the worker cannot call a
name the real module lacks.
"""

from __future__ import annotations

import inspect
import io
import json
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from spark_watchdog.probes.gpu import GpuReading
from spark_watchdog.probes.gpu_worker import DEVICE_FIELDS, NvmlSession, serve


def nvml_error(code: int) -> Exception:
    """The exception pynvml raises when the C call returns ``code``."""
    error: Exception = pynvml.NVMLError(code)
    return error


NOT_SUPPORTED = nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)


class FakeNvml:
    """Stands in for the ``pynvml`` module: canned GB10-like values, chosen failures."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM

    def __init__(
        self,
        *,
        count: int = 1,
        failures: dict[str, Exception] | None = None,
        name: str | bytes = "NVIDIA GB10",
    ) -> None:
        self.count = count
        self.failures = dict(failures or {})
        self.name = name
        self.init_calls = 0

    def _call(self, function: str, value: Any) -> Any:
        failure = self.failures.get(function)
        if failure is not None:
            raise failure
        return value

    def nvmlInit(self) -> None:
        self.init_calls += 1
        self._call("nvmlInit", None)

    def nvmlDeviceGetCount(self) -> int:
        return int(self._call("nvmlDeviceGetCount", self.count))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", ("handle", index))

    def nvmlDeviceGetName(self, handle: Any) -> Any:
        return self._call("nvmlDeviceGetName", self.name)

    def nvmlDeviceGetUUID(self, handle: Any) -> Any:
        return self._call(
            "nvmlDeviceGetUUID", f"GPU-0000000{handle[1]}-8f5e-4c1a-9d2b-3e4f5a6b7c8d"
        )

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> Any:
        return self._call("nvmlDeviceGetPowerUsage", 45250)  # milliwatts

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        return self._call("nvmlDeviceGetUtilizationRates", SimpleNamespace(gpu=96, memory=0))

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> Any:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._call("nvmlDeviceGetTemperature", 51)

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> Any:
        assert clock == pynvml.NVML_CLOCK_SM
        return self._call("nvmlDeviceGetClockInfo", 2418)

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        memory = SimpleNamespace(used=3 * 2**30, total=80 * 2**30, free=77 * 2**30)
        return self._call("nvmlDeviceGetMemoryInfo", memory)

    def nvmlSystemGetDriverVersion(self) -> Any:
        return self._call("nvmlSystemGetDriverVersion", "580.95.05")

    def nvmlSystemGetNVMLVersion(self) -> Any:
        return self._call("nvmlSystemGetNVMLVersion", "13.580.95.05")


def test_the_stand_in_offers_only_what_real_pynvml_has() -> None:
    for name, member in vars(FakeNvml).items():
        if not name.startswith(("nvml", "NVML")):
            continue
        assert hasattr(pynvml, name), f"pynvml has no {name}"
        if callable(member) and not isinstance(member, type):
            # The real function accepts the arguments the worker passes to the stand-in.
            arguments = list(inspect.signature(member).parameters)[1:]  # drop self
            inspect.signature(getattr(pynvml, name)).bind(*arguments)
    # The worker relies on pynvml turning a return code into a specific subclass.
    assert isinstance(NOT_SUPPORTED, pynvml.NVMLError_NotSupported)


def test_gb10_memory_not_supported_is_skipped_not_failed() -> None:
    nvml = FakeNvml(failures={"nvmlDeviceGetMemoryInfo": NOT_SUPPORTED})
    answer = NvmlSession(nvml).answer("read")
    assert answer["state"] == "ok"
    assert answer["error"] is None
    assert answer["driver_version"] == "580.95.05"
    assert answer["nvml_version"] == "13.580.95.05"
    (device,) = answer["devices"]
    assert device == {
        "index": 0,
        "name": "NVIDIA GB10",
        "uuid": "GPU-00000000-8f5e-4c1a-9d2b-3e4f5a6b7c8d",
        "power_w": 45.25,
        "utilization_gpu_pct": 96,
        "temperature_c": 51,
        "sm_clock_mhz": 2418,
        "memory_used_bytes": None,
        "memory_total_bytes": None,
        "not_supported": ["memory_used_bytes", "memory_total_bytes"],
        "errors": {},
    }
    # The answer is exactly what the parent accepts.
    assert GpuReading.from_json(json.loads(json.dumps(answer))).state == "ok"


def test_a_failing_field_is_null_with_its_reason_and_the_rest_is_read() -> None:
    nvml = FakeNvml(
        count=2, failures={"nvmlDeviceGetTemperature": nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)}
    )
    answer = NvmlSession(nvml).answer("read")
    assert answer["state"] == "ok"
    assert [d["index"] for d in answer["devices"]] == [0, 1]
    for device in answer["devices"]:
        assert device["temperature_c"] is None
        assert device["errors"] == {"temperature_c": "GPU is lost"}
        assert device["not_supported"] == []
        assert device["power_w"] == 45.25
        assert device["memory_total_bytes"] == 80 * 2**30


def test_a_device_without_a_handle_has_every_field_null() -> None:
    nvml = FakeNvml(
        failures={"nvmlDeviceGetHandleByIndex": nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)}
    )
    (device,) = NvmlSession(nvml).answer("read")["devices"]
    assert all(device[name] is None for name in DEVICE_FIELDS)
    assert set(device["errors"]) == set(DEVICE_FIELDS)
    assert device["errors"]["power_w"] == "Insufficient Permissions"


def test_old_pynvml_bytes_are_decoded() -> None:
    (device,) = NvmlSession(FakeNvml(name=b"NVIDIA H200")).answer("read")["devices"]
    assert device["name"] == "NVIDIA H200"


@pytest.mark.parametrize(
    ("code", "state", "words"),
    [
        (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "unavailable", "libnvidia-ml.so.1 not found"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "unavailable", "driver is not loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "unavailable", "no permission"),
        # A driver updated without a reboot is trouble, not "no GPU here".
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "error", "nvmlInit failed"),
    ],
)
def test_init_failures(code: int, state: str, words: str) -> None:
    answer = NvmlSession(FakeNvml(failures={"nvmlInit": nvml_error(code)})).answer("read")
    assert answer["state"] == state
    assert words in answer["error"]
    assert answer["devices"] == []


def test_zero_devices_is_unavailable() -> None:
    answer = NvmlSession(FakeNvml(count=0)).answer("read")
    assert answer["state"] == "unavailable"
    assert "no GPU" in answer["error"]


def test_init_is_retried_until_it_works_then_kept() -> None:
    nvml = FakeNvml(failures={"nvmlInit": nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)})
    session = NvmlSession(nvml)
    assert session.answer("read")["state"] == "unavailable"
    del nvml.failures["nvmlInit"]  # the nvidia module finished loading
    assert session.answer("read")["state"] == "ok"
    assert session.answer("read")["state"] == "ok"
    assert nvml.init_calls == 2


def test_unexpected_failures_are_answered_not_fatal() -> None:
    broken = FakeNvml(failures={"nvmlDeviceGetPowerUsage": RuntimeError("ctypes exploded")})
    answer = NvmlSession(broken).answer("read")
    assert answer["state"] == "error"
    assert "RuntimeError: ctypes exploded" in answer["error"]
    lost = FakeNvml(failures={"nvmlDeviceGetCount": nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)})
    assert NvmlSession(lost).answer("read")["error"] == "nvmlDeviceGetCount failed: GPU is lost"
    assert "unknown request" in NvmlSession(FakeNvml()).answer("reboot")["error"]
    assert "pynvml is not installed" in NvmlSession(None).answer("read")["error"]


def test_serve_answers_each_request_line_and_stops_at_eof() -> None:
    answers = io.StringIO()
    serve(NvmlSession(FakeNvml()), io.StringIO("read\n\nread\nbogus\n"), answers)
    lines = answers.getvalue().splitlines()
    assert [json.loads(line)["state"] for line in lines] == ["ok", "ok", "error"]
