"""The exec power path: the operator's own commands, run as real subprocesses.

The commands are a homemade relay board's tool (spark_watchdog.lab.hardware.
relay_board, a plain script with its relay in a JSON file) that follows the
exec contract of docs/power.md: ``status`` prints ``{"state": ...}``, ``off``
and ``on`` exit 0, 75 when nothing was sent. Its faults are the bad answers a
real tool gives: garbage, a relay that does not follow, a failure after the
command, a hang.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.config.controller import ExecDevice, parse_controller_config
from spark_watchdog.errors import (
    Ambiguous,
    ConfigError,
    Refused,
    SendRefused,
    StateTimeout,
    Unreachable,
)
from spark_watchdog.lab.hardware.relay_board import RelayBoard
from spark_watchdog.power.base import CommandSpacing, PowerState, PowerTiming, VerifiedPower
from spark_watchdog.power.exec_path import (
    ExecPower,
    build_exec_backend,
    command_environment,
    parse_status,
)

ON, OFF = PowerState.ON, PowerState.OFF


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def backend(board: RelayBoard, timeout: float = 20.0) -> ExecPower:
    return ExecPower(board.argv("off"), board.argv("on"), board.argv("status"), timeout=timeout)


async def _record(steps: list[str], step: Any) -> None:
    steps.append(step.name)


def verified(power: ExecPower, steps: list[str], power_timeout: float = 20.0) -> VerifiedPower:
    timing = PowerTiming(
        poll_interval=0.1,
        power_timeout=power_timeout,
        min_command_interval=0.0,
        read_timeout=30.0,
        command_timeout=30.0,
    )
    return VerifiedPower(
        power, timing, on_step=lambda step: _record(steps, step), spacing=CommandSpacing()
    )


@pytest.mark.integration
def test_a_verified_cycle_through_the_operators_commands(tmp_path: Path) -> None:
    board = RelayBoard(tmp_path, switch_delay=0.3)  # the relay follows late: polled
    steps: list[str] = []
    result = run(verified(backend(board), steps).cycle(off_seconds=0.5))
    assert result.verified and result.state_after is ON
    assert result.off_held_s is not None and result.off_held_s >= 0.5
    assert steps == [
        "off_requested",
        "off_verified",
        "hold_started",
        "hold_done",
        "on_requested",
        "on_verified",
    ]
    assert board.commands == ["off", "on"] and board.state() == "on"


@pytest.mark.integration
def test_status_garbage_is_refused_with_the_contract(tmp_path: Path) -> None:
    board = RelayBoard(tmp_path)
    board.set_fault("garbage")
    with pytest.raises(Refused) as caught:
        run(backend(board).read_state())
    assert "'relay 3 is ON-ish'" in caught.value.message
    assert '{"state": "on"} or {"state": "off"}' in caught.value.message


@pytest.mark.integration
def test_a_status_that_fails_is_unreachable(tmp_path: Path) -> None:
    board = RelayBoard(tmp_path)
    board.set_fault("status_down")
    with pytest.raises(Unreachable, match=r"status exited 1: 'relay board: no answer"):
        run(backend(board).read_state())
    # Before a command, an unreadable device gets none.
    steps: list[str] = []
    with pytest.raises(Unreachable):
        run(verified(backend(board), steps).off())
    assert steps == [] and board.commands == []


@pytest.mark.integration
def test_a_relay_that_reads_on_after_an_off_is_never_sent_again(tmp_path: Path) -> None:
    board = RelayBoard(tmp_path)
    board.set_fault("ignore")
    steps: list[str] = []
    with pytest.raises(StateTimeout, match=r"off not read back within 3s \(last read on"):
        run(verified(backend(board), steps, power_timeout=3.0).off())
    assert steps == ["off_requested"]
    assert board.commands == ["off"] and board.state() == "on"


@pytest.mark.integration
def test_a_failure_after_the_command_is_ambiguous_then_read_back(tmp_path: Path) -> None:
    board = RelayBoard(tmp_path)
    board.set_fault("fail_after", times=1)
    with pytest.raises(Ambiguous, match=r"off exited 1: .*lost the line.*it may have switched"):
        run(backend(board).command(OFF))
    assert board.state() == "off"  # it did land
    board.set_fault("fail_after", times=1)
    steps: list[str] = []
    result = run(verified(backend(board), steps).on())
    assert result.verified and steps == ["on_requested", "on_ambiguous", "on_verified"]
    assert board.commands == ["off", "on"]


@pytest.mark.integration
def test_ambiguous_and_still_on_is_held_not_resent(tmp_path: Path) -> None:
    """The tool failed somewhere (exit 1) and the relay never moved: whether the
    board got the off is unknown, so it is held for a person, never sent again."""
    board = RelayBoard(tmp_path)
    board.set_fault("fail_unmoved")
    steps: list[str] = []
    with pytest.raises(Ambiguous, match=r"off exited 1.*Not retried"):
        run(verified(backend(board), steps, power_timeout=3.0).off())
    assert steps == ["off_requested", "off_ambiguous"]
    assert board.commands == ["off"] and board.state() == "on"


@pytest.mark.integration
def test_exit_75_says_nothing_was_sent(tmp_path: Path) -> None:
    board = RelayBoard(tmp_path)
    board.set_fault("not_sent")
    with pytest.raises(Unreachable, match=r"off exited 75 \(nothing was sent\)"):
        run(backend(board).command(OFF))
    assert board.commands == [] and board.state() == "on"


@pytest.mark.integration
def test_a_command_that_hangs_is_killed_with_its_group_and_ambiguous(tmp_path: Path) -> None:
    board = RelayBoard(tmp_path, hang_s=60.0)
    board.set_fault("hang", times=1)
    started = time.monotonic()
    with pytest.raises(Ambiguous, match=r"off ran over its 1s timeout and was killed"):
        run(backend(board, timeout=1.0).command(OFF))
    assert time.monotonic() - started < 60
    pid = board.hung_pid
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped, not left to act later
    assert board.commands == []


@pytest.mark.integration
def test_a_status_that_hangs_is_unreachable(tmp_path: Path) -> None:
    board = RelayBoard(tmp_path, hang_s=60.0)
    board.set_fault("hang", times=1)
    with pytest.raises(Unreachable, match=r"status ran over its 1s timeout"):
        run(backend(board, timeout=1.0).read_state())


# A vendor tool gone wrong: it writes without end as fast as a pipe takes it,
# and a child of its own writes too. Run in a process of its own, so the
# test can bound a run that does not end, and read that process's peak memory.
_FLOODED_READ = """
import asyncio, json, re, sys, time
def _peak_kib():
    # This process's own peak (VmHWM). Not ru_maxrss: Linux keeps the forking
    # process's peak in it across exec, a whole test worker's.
    status = open("/proc/self/status").read()
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", status).group(1))
from spark_watchdog.power.exec_path import ExecPower
flood = ["/bin/sh", "-c", "yes garbage & exec cat /dev/zero"]
power = ExecPower(flood, flood, flood, timeout=1.0)
started = time.monotonic()
errors = []
for call in (power.read_state, lambda: power.command(__import__(
        "spark_watchdog.power.base").power.base.PowerState.OFF)):
    try:
        asyncio.run(call())
    except Exception as exc:
        errors.append([type(exc).__name__, str(exc)])
print(json.dumps({"took": time.monotonic() - started, "errors": errors,
                  "peak_mib": _peak_kib() / 1024}))
"""


@pytest.mark.integration
def test_a_command_that_floods_its_output_is_cut_and_killed_in_time() -> None:
    # Generous for a loaded machine: what it rules out is the flood running on
    # past its timeout (3 s asked, 10.5 s and 600 MiB taken before).
    done = subprocess.run(
        [sys.executable, "-c", _FLOODED_READ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["took"] < 2 * 1.0 + 10.0
    assert report["peak_mib"] < 200
    (read, read_said), (off, off_said) = report["errors"]
    assert read == "Unreachable" and "status ran over its 1s timeout" in read_said
    assert off == "Ambiguous" and "off ran over its 1s timeout" in off_said
    assert "may have switched" in off_said
    assert len(read_said) < 600 and len(off_said) < 600


@pytest.mark.integration
def test_output_is_redacted_in_logs_and_errors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    board = RelayBoard(tmp_path)
    with caplog.at_level(logging.DEBUG):
        run(backend(board).command(OFF))
        board.set_fault("fail_after", times=1)
        with pytest.raises(Ambiguous) as caught:
            run(backend(board).command(ON))
    assert "RELAY_TOKEN=***" in caplog.text and "RELAY_TOKEN=***" in caught.value.message
    assert "hunter2" not in caplog.text and "hunter2" not in str(caught.value)


@pytest.mark.integration
def test_a_program_that_is_not_there_never_ran(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-relay")
    power = ExecPower([missing, "off"], [missing, "on"], [missing, "status"])
    with pytest.raises(Unreachable, match="status could not be started: No such file"):
        run(power.read_state())
    with pytest.raises(Unreachable, match=r"off could not be started.*nothing was sent"):
        run(power.command(OFF))


@pytest.mark.integration
def test_a_command_past_its_send_window_never_runs(tmp_path: Path) -> None:
    board = RelayBoard(tmp_path)
    steps: list[str] = []
    power = VerifiedPower(
        backend(board),
        PowerTiming(poll_interval=0.1, power_timeout=5.0, min_command_interval=0.0),
        on_step=lambda step: _record(steps, step),
        send_window=lambda: "past the send deadline",
        spacing=CommandSpacing(),
    )
    with pytest.raises(SendRefused, match="past the send deadline"):
        run(power.off())
    assert steps == ["off_requested", "off_withdrawn"] and board.commands == []


@pytest.mark.parametrize(
    ("stdout", "state"),
    [
        ('{"state": "on"}\n', ON),
        ('relay fw 1.2\n{"state": "off"}\n\n', OFF),
        ('{"state": "ON"}', None),
        ('{"state": "off"} trailing', None),
        ('["off"]', None),
        ("", None),
        ('{"state": "off"}\nok', None),
    ],
)
def test_the_status_contract(stdout: str, state: PowerState | None) -> None:
    assert parse_status(stdout) is state


def test_the_commands_environment_is_small() -> None:
    given = {"PATH": "/bin", "HOME": "/root", "HF_TOKEN": "x", "CREDENTIALS_DIRECTORY": "/run/c"}
    assert command_environment(given) == {
        "PATH": "/bin",
        "LC_ALL": "C",
        "CREDENTIALS_DIRECTORY": "/run/c",
    }
    assert "CREDENTIALS_DIRECTORY" not in command_environment({"PATH": "/bin"})


def _exec(**keys: object) -> dict[str, object]:
    device: dict[str, object] = {
        "type": "exec",
        "off_command": ["/usr/local/bin/relay", "off", "3"],
        "on_command": ["/usr/local/bin/relay", "on", "3"],
        "status_command": ["/usr/local/bin/relay", "status", "3"],
    }
    device.update(keys)
    return {"nodes": [{"name": "spark-1", "agent": "http://127.0.0.1:9720", "power": [device]}]}


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        (
            {"off_command": ["relay", "off"]},
            "nodes[0].power[0].off_command[0]: expected the program's absolute",
        ),
        ({"on_command": []}, "nodes[0].power[0].on_command: required: the command as a list"),
        (
            {"status_command": "/usr/local/bin/relay status"},
            "nodes[0].power[0].status_command: expected a list",
        ),
        (
            {"off_command": ["/usr/local/bin/relay", "--token", "s3cret", "off"]},
            'nodes[0].power[0].off_command[2]: looks like a secret ("***")',
        ),
        ({"timeout": 0}, "nodes[0].power[0].timeout: expected a number > 0"),
    ],
)
def test_config_errors_name_the_field_and_the_fix(keys: dict[str, object], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_controller_config(_exec(**keys))
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems
    assert all("s3cret" not in p for p in caught.value.problems)


def test_build_from_config() -> None:
    config = parse_controller_config(_exec(timeout=4))
    device = config.nodes[0].power[0]
    assert isinstance(device, ExecDevice)
    power = build_exec_backend(device, {})
    assert power.name == "exec /usr/local/bin/relay status 3"
    assert power.limiter_key == "exec:/usr/local/bin/relay off 3"


@pytest.mark.integration
def test_the_board_runs_as_a_plain_script(tmp_path: Path) -> None:
    """The stand-in imports nothing of the project: an operator's tool would not."""
    import subprocess

    board = RelayBoard(tmp_path)
    result = subprocess.run(
        board.argv("status"),
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.defpath, "PYTHONPATH": ""},
        cwd="/",
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == '{"state": "on"}'
    assert sys.executable == board.python
