"""The stand-in plug as Tasmota firmware answers (lab/hardware/plug_standin.py,
``kind: tasmota``; tasmota.github.io/docs/Commands): ``GET /cm?cmnd=...``
with ``Power<N> [On|Off|Toggle]``, ``PowerOnState``, and the one backlog
modelled, a timed cycle. With a password, ``user=admin&password=...`` must be
in the query."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from http import HTTPStatus
from typing import Protocol

from spark_watchdog.lab.hardware.plug_answer import Answer

TASMOTA_USER = "admin"
NEED_CREDENTIALS = "Need user=<username>&password=<password>"

TASMOTA_POWER = re.compile(r"^power(\d*)(?:\s+(\S+))?\s*$", re.IGNORECASE)
_TASMOTA_DELAY = re.compile(r"^delay\s+(\d+)$", re.IGNORECASE)
ON_WORDS = {"on", "1", "true"}
OFF_WORDS = {"off", "0", "false"}
TOGGLE_WORDS = {"toggle", "2"}


class TasmotaPlug(Protocol):
    """What of the stand-in (plug_standin.PlugStandin) a Tasmota answer reads and switches."""

    legacy_auth_answer: bool
    power_on: str | int
    indexed_keys: bool
    _lock: threading.Lock
    _outputs: dict[int, bool]
    _refused: int

    def tasmota_credentials_ok(self, query: dict[str, list[str]]) -> bool: ...

    def _take_fault(self, applies_to: tuple[str, ...]) -> str: ...

    def _accept(
        self, relay: int, on: bool, answered: str, on_after_s: float | None = None
    ) -> bool: ...


def tasmota(
    plug: TasmotaPlug,
    path: str,
    query: dict[str, list[str]],
    *,
    hang_if_asked: Callable[[], None],
    after_apply: Callable[[str], None],
) -> None:
    """Answer one Tasmota request (raises :class:`Answer` or NoAnswer)."""
    if path != "/cm":
        raise Answer(HTTPStatus.NOT_FOUND, {"WARNING": "Not found"})
    hang_if_asked()
    if not plug.tasmota_credentials_ok(query):
        status = HTTPStatus.OK if plug.legacy_auth_answer else HTTPStatus.UNAUTHORIZED
        raise Answer(status, {"WARNING": NEED_CREDENTIALS})
    cmnd = query.get("cmnd", [""])[0].strip()
    if not cmnd:
        raise Answer(HTTPStatus.OK, {"WARNING": "Enter command cmnd="})
    if cmnd.lower() == "poweronstate":
        raise Answer(HTTPStatus.OK, {"PowerOnState": plug.power_on})
    if cmnd.lower().startswith("backlog "):
        _backlog(plug, cmnd[len("backlog ") :], after_apply)
    match = TASMOTA_POWER.match(cmnd)
    if match is None:
        raise Answer(HTTPStatus.OK, {"Command": "Unknown"})
    relay = int(match.group(1) or "1")
    if relay not in plug._outputs:
        raise Answer(HTTPStatus.OK, {"Command": "Unknown"})
    key = _key(plug, relay)
    word = (match.group(2) or "").lower()
    if not word:
        with plug._lock:
            output = plug._outputs[relay]
        raise Answer(HTTPStatus.OK, {key: "ON" if output else "OFF"})
    if word in ON_WORDS:
        on = True
    elif word in OFF_WORDS:
        on = False
    elif word in TOGGLE_WORDS:
        with plug._lock:
            on = not plug._outputs[relay]
    else:
        raise Answer(HTTPStatus.OK, {"Command": "Error"})
    fault = plug._take_fault(("refuse", "drop", "stall"))
    if fault == "refuse":
        with plug._lock:
            plug._refused += 1
        raise Answer(HTTPStatus.OK, {"Command": "Error"})
    plug._accept(relay, on, "yes" if fault == "none" else fault)
    after_apply(fault)
    # Tasmota answers with the relay's new state.
    raise Answer(HTTPStatus.OK, {key: "ON" if on else "OFF"})


def _backlog(plug: TasmotaPlug, commands: str, after_apply: Callable[[str], None]) -> None:
    """Only the timed cycle is modelled: ``PowerN Off;Delay D;PowerN On``."""
    parts = [part.strip() for part in commands.split(";")]
    off = TASMOTA_POWER.match(parts[0]) if len(parts) == 3 else None
    delay = _TASMOTA_DELAY.match(parts[1]) if len(parts) == 3 else None
    on = TASMOTA_POWER.match(parts[2]) if len(parts) == 3 else None
    if off is None or delay is None or on is None or off.group(1) != on.group(1):
        raise Answer(HTTPStatus.OK, {"Command": "Unknown"})
    relay = int(off.group(1) or "1")
    tenths = int(delay.group(1))
    if (
        relay not in plug._outputs
        or (off.group(2) or "").lower() not in OFF_WORDS
        or (on.group(2) or "").lower() not in ON_WORDS
        or not 2 <= tenths <= 3600
    ):
        raise Answer(HTTPStatus.OK, {"Command": "Unknown"})
    fault = plug._take_fault(("refuse", "drop", "stall"))
    if fault == "refuse":
        with plug._lock:
            plug._refused += 1
        raise Answer(HTTPStatus.OK, {"Command": "Error"})
    plug._accept(relay, False, "yes" if fault == "none" else fault, tenths / 10)
    after_apply(fault)
    # CmndBacklog queues the commands and clears the response.
    raise Answer(HTTPStatus.OK, {})


def _key(plug: TasmotaPlug, relay: int) -> str:
    if len(plug._outputs) == 1 and not plug.indexed_keys:
        return "POWER"  # SetOption26 0 (the default): no index with one relay
    return f"POWER{relay}"
