"""A homemade relay board's command-line tool, for the ``exec`` power path.

What an operator would write for a relay HAT or a USB relay: one program,
``relay_board.py STATE_FILE off|on|status``, that follows the exec contract
(docs/power.md, "exec"): ``status`` prints ``{"state": "on"}`` or
``{"state": "off"}`` and exits 0; ``off`` and ``on`` exit 0 once the relay
took the command. The relay is a JSON file; :class:`RelayBoard` is the test's
hand on it (its state, the commands taken, the faults).

It imports the standard library only and runs as a plain script (``python
relay_board.py``), as an operator's tool would: no package to import.

Faults (``RelayBoard.set_fault``), each for ``times`` runs or until cleared:

- ``garbage``: ``status`` prints a line that is no JSON, and exits 0;
- ``status_down``: ``status`` exits 1 (the board did not answer);
- ``ignore``: ``off``/``on`` exit 0 and the relay does not move;
- ``fail_after``: ``off``/``on`` switch the relay, then exit 1;
- ``fail_unmoved``: ``off``/``on`` exit 1 and the relay does not move;
- ``not_sent``: ``off``/``on`` exit 75 (nothing reached the board);
- ``hang``: every run sleeps ``hang_s`` seconds before anything.

``switch_delay`` makes the relay follow that long after a command. Every
command's output carries a line with a secret-named assignment, which a
caller must never show as it is.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()
FAULTS = ("garbage", "status_down", "ignore", "fail_after", "fail_unmoved", "not_sent", "hang")
NOT_SENT_EXIT = 75
# Printed by every command: what a careless tool might echo.
NOISE = "board fw 1.2 RELAY_TOKEN=hunter2-relay"


def _load(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _save(path: Path, data: dict[str, Any]) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(data))
    os.replace(temporary, path)


def _settle(data: dict[str, Any], now: float) -> None:
    """Apply a pending switch whose time has come."""
    pending = data.get("pending")
    if pending is not None and now >= pending["at"]:
        data["state"] = pending["state"]
        data["pending"] = None


def _take_fault(data: dict[str, Any], applies: tuple[str, ...]) -> str | None:
    fault = data.get("fault")
    if fault not in applies:
        return None
    times = data.get("fault_times")
    if times is not None:
        data["fault_times"] = times - 1
        if times - 1 <= 0:
            data["fault"], data["fault_times"] = None, None
    return str(fault)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[1] not in ("off", "on", "status"):
        print("usage: relay_board.py STATE_FILE off|on|status", file=sys.stderr)
        return 2
    path, action = Path(args[0]), args[1]
    data = _load(path)
    if _take_fault(data, ("hang",)) is not None:
        data["hung_pid"] = os.getpid()  # for the test: was it killed?
        _save(path, data)
        time.sleep(float(data.get("hang_s", 300.0)))
        return 1
    now = time.time()
    _settle(data, now)
    if action == "status":
        fault = _take_fault(data, ("garbage", "status_down"))
        _save(path, data)
        if fault == "status_down":
            print("relay board: no answer on /dev/ttyUSB0", file=sys.stderr)
            return 1
        if fault == "garbage":
            print("relay 3 is ON-ish")
            return 0
        print(json.dumps({"state": data["state"]}))
        return 0
    print(NOISE)
    fault = _take_fault(data, ("ignore", "fail_after", "fail_unmoved", "not_sent"))
    if fault == "not_sent":
        _save(path, data)
        print("relay board: cannot open /dev/ttyUSB0", file=sys.stderr)
        return NOT_SENT_EXIT
    data["commands"].append(action)
    if fault not in ("ignore", "fail_unmoved"):
        delay = float(data.get("switch_delay", 0.0))
        if delay > 0:
            data["pending"] = {"state": action, "at": now + delay}
        else:
            data["state"], data["pending"] = action, None
    _save(path, data)
    if fault in ("fail_after", "fail_unmoved"):
        print("relay board: lost the line after the command", file=sys.stderr)
        return 1
    return 0


class RelayBoard:
    """The test's side of one board: its state file, and the argvs that drive it."""

    def __init__(
        self,
        directory: Path,
        *,
        initially_on: bool = True,
        switch_delay: float = 0.0,
        hang_s: float = 300.0,
        python: str = sys.executable,
    ) -> None:
        self.path = directory / "relay-board.json"
        self.python = python
        _save(
            self.path,
            {
                "state": "on" if initially_on else "off",
                "pending": None,
                "commands": [],
                "fault": None,
                "fault_times": None,
                "switch_delay": switch_delay,
                "hang_s": hang_s,
            },
        )

    def argv(self, action: str) -> list[str]:
        return [self.python, str(SCRIPT), str(self.path), action]

    def device(self, timeout: float = 10.0) -> dict[str, Any]:
        """The ``type: exec`` config entry for this board."""
        return {
            "type": "exec",
            "off_command": self.argv("off"),
            "on_command": self.argv("on"),
            "status_command": self.argv("status"),
            "timeout": timeout,
        }

    def state(self) -> str:
        data = _load(self.path)
        _settle(data, time.time())
        return str(data["state"])

    @property
    def hung_pid(self) -> int | None:
        pid = _load(self.path).get("hung_pid")
        return None if pid is None else int(pid)

    @property
    def commands(self) -> list[str]:
        return list(_load(self.path)["commands"])

    def set_fault(self, fault: str | None, times: int | None = None) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(f"fault: expected one of {', '.join(FAULTS)}, got {fault!r}")
        data = _load(self.path)
        data["fault"], data["fault_times"] = fault, times
        _save(self.path, data)


if __name__ == "__main__":
    raise SystemExit(main())
