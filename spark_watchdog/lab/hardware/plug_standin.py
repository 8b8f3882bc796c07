"""A stand-in smart plug for tests and the lab: Shelly Gen2+ RPC, Shelly Gen1 or Tasmota.

It keeps relay state and answers the way the real firmware documents
(shelly-api-docs.shelly.cloud gen2 Switch and gen1 Shelly 1/Plug;
tasmota.github.io/docs/Commands):

- ``shelly``: ``GET /rpc/Switch.GetStatus?id=N`` → ``{"id": N, "output": bool, ...}``,
  ``GET /rpc/Switch.GetConfig?id=N`` → ``{..., "initial_state": power_on}``,
  ``GET /rpc/Switch.Set?id=N&on=true|false`` → ``{"was_on": bool}``, ``GET /shelly``
  (device info, never behind auth). With a password, every ``/rpc`` call needs
  RFC 7616 digest auth, SHA-256, user ``admin``, as Shelly Gen2+ does.
  RPC errors answer ``{"code": ..., "message": ...}`` with a 4xx/5xx status.
- ``shelly_gen1``: ``GET /relay/N`` → ``{"ison": bool, "has_timer": bool, ...}``,
  ``GET /relay/N?turn=on|off[&timer=S]`` switches (``timer``: the flip-back
  timer, in seconds) and answers the same object with the new state,
  ``GET /settings/relay/N`` → ``{..., "default_state": power_on}`` (off, on,
  last, switch), ``GET /shelly`` (device info, never behind auth). With a
  password, every other path needs HTTP Basic auth as ``admin``; otherwise
  401 with ``WWW-Authenticate: Basic``. A relay it does not have: 404.
- ``tasmota`` (its answers: lab/hardware/plug_tasmota.py):
  ``GET /cm?cmnd=Power1`` → ``{"POWER": "ON"}`` with one relay (or
  ``{"POWER1": ...}`` with several, or with ``indexed_keys``), ``cmnd=Power1 Off``
  switches and answers the new state, ``cmnd=PowerOnState`` answers
  ``{"PowerOnState": power_on}``, unknown commands answer
  ``{"Command": "Unknown"}``. With a password, ``user=admin&password=...``
  must be in the query; otherwise 401 (200 with ``legacy_auth_answer``, as
  firmware before arendst/Tasmota#8170 did) and
  ``{"WARNING": "Need user=<username>&password=<password>"}``.

``switch_delay`` makes the relay change that long after the command was
accepted; ``on_change(relay, on)`` is called (in a server thread) whenever a
relay actually changes, so the lab can stop or start a "host" process.

Faults (:meth:`PlugStandin.set_fault`, or ``GET /_standin/fault?mode=...&times=N``):

- ``refuse``: commands are answered with an error and not applied;
- ``drop``: the command is applied, then the connection closed without an answer;
- ``stall``: the command is applied, then no answer for ``hang_s`` seconds;
- ``hang``: nothing is applied and nothing answered (reads included) for ``hang_s``;
- ``garble``: nothing is applied; every request (reads included) gets 200 with
  ``{"standin": "garbled"}``, an answer of a shape no firmware documents.

``times`` limits a fault to that many affected requests; then it heals.
``GET /_standin/state`` shows the relays and the applied commands. The
``/_standin/`` paths are never faulted nor behind auth.

Run as ``python -m spark_watchdog.lab.hardware plug --kind shelly --port N``
(``--password-file`` to require auth: a password never goes on a command line).
"""

from __future__ import annotations

import argparse
import json
import logging
import secrets
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

from spark_watchdog.lab.hardware import plug_auth
from spark_watchdog.lab.hardware.plug_answer import Answer, NoAnswer
from spark_watchdog.lab.hardware.plug_tasmota import NEED_CREDENTIALS as NEED_CREDENTIALS
from spark_watchdog.lab.hardware.plug_tasmota import TASMOTA_USER as TASMOTA_USER
from spark_watchdog.lab.hardware.plug_tasmota import tasmota

log = logging.getLogger("spark_watchdog.lab.hardware.plug_standin")

PLUG_KINDS = ("shelly", "shelly_gen1", "tasmota")
FAULTS = ("none", "refuse", "drop", "stall", "hang", "garble")
CONTROL_PREFIX = "/_standin/"
SHELLY_USER = "admin"
# Shelly Gen1's default web login (its /settings/login can change it).
SHELLY_GEN1_USER = "admin"
# Shelly Gen1's relay default_state values (what the relay does at its own power-up).
SHELLY_GEN1_DEFAULT_STATES = ("off", "on", "last", "switch")

OnChange = Callable[[int, bool], None]


@dataclass(frozen=True)
class AppliedCommand:
    """One command the plug accepted: which relay, to what, and how it answered."""

    relay: int
    on: bool
    answered: str  # "yes", or the fault that ate the answer ("drop", "stall")
    # The plug's own on armed with this off (Shelly toggle_after, a Tasmota backlog).
    on_after_s: float | None = None


class PlugStandin:
    """One stand-in plug with ``relays`` relays, serving over HTTP on ``host:port``."""

    def __init__(
        self,
        kind: str,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        password: str | None = None,
        relays: int = 1,
        initially_on: bool = True,
        switch_delay: float = 0.0,
        on_change: OnChange | None = None,
        legacy_auth_answer: bool = False,
        indexed_keys: bool = False,
        # After the plug's own power loss: Shelly initial_state, Shelly Gen1
        # default_state, Tasmota PowerOnState.
        power_on: str | int | None = None,
        hang_s: float = 300.0,
    ) -> None:
        if kind not in PLUG_KINDS:
            raise ValueError(f"kind: expected one of {', '.join(PLUG_KINDS)}, got {kind!r}")
        if relays < 1:
            raise ValueError(f"relays: expected at least 1, got {relays}")
        if switch_delay < 0:
            raise ValueError(f"switch_delay: expected ≥ 0 seconds, got {switch_delay}")
        self.kind = kind
        self.password = password
        self.switch_delay = switch_delay
        self.on_change = on_change
        self.legacy_auth_answer = legacy_auth_answer
        self.indexed_keys = indexed_keys
        default_power_on: str | int = {"shelly": "restore_last", "shelly_gen1": "last"}.get(kind, 3)
        self.power_on: str | int = power_on if power_on is not None else default_power_on
        self.hang_s = hang_s
        # Shelly numbers switches from 0, Tasmota relays from 1.
        self.first_relay = 0 if kind.startswith("shelly") else 1
        self._lock = threading.Lock()
        self._outputs = {self.first_relay + i: initially_on for i in range(relays)}
        self._pending: dict[int, threading.Timer] = {}
        # Self-timed ons (flip-back timers, backlogs), by relay.
        self._timed: dict[int, threading.Timer] = {}
        # False: the plug accepts a timed off but its timer never fires (the
        # controller must then send the on itself).
        self.timers_fire = True
        # True: the plug accepts and records commands, answers as usual, and
        # its relay does not move (a welded relay, firmware that lies).
        self.ignores_commands = False
        self._commands: list[AppliedCommand] = []
        self._refused = 0
        self._fault = "none"
        self._fault_times: int | None = None
        self._nonces: set[str] = set()
        self.realm = f"shellyplugus-standin{secrets.token_hex(3)}"
        self._stopping = threading.Event()
        self._server = _PlugServer((host, port), _PlugHandler, self)
        self._serving: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        name = host.decode() if isinstance(host, bytes) else str(host)
        return f"http://[{name}]:{self.port}" if ":" in name else f"http://{name}:{self.port}"

    def start(self) -> PlugStandin:
        self._serving = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"plug-standin-{self.kind}",
            daemon=True,
        )
        self._serving.start()
        return self

    def stop(self) -> None:
        self._stopping.set()  # releases stalled and hung requests
        with self._lock:
            for timer in [*self._pending.values(), *self._timed.values()]:
                timer.cancel()
            self._pending.clear()
            self._timed.clear()
        if self._serving is not None:
            self._server.shutdown()
            self._serving.join()
        self._server.server_close()

    def __enter__(self) -> PlugStandin:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --- state and control ---------------------------------------------------

    def is_on(self, relay: int | None = None) -> bool:
        with self._lock:
            return self._outputs[self._relay(relay)]

    def set_output(self, on: bool, relay: int | None = None) -> None:
        """Switch a relay directly (a press of the plug's button): no command is counted."""
        self._apply(self._relay(relay), on)

    @property
    def commands(self) -> list[AppliedCommand]:
        with self._lock:
            return list(self._commands)

    @property
    def refused_commands(self) -> int:
        with self._lock:
            return self._refused

    @property
    def fault(self) -> str:
        with self._lock:
            return self._fault

    def set_fault(self, fault: str, times: int | None = None) -> None:
        if fault not in FAULTS:
            raise ValueError(f"fault: expected one of {', '.join(FAULTS)}, got {fault!r}")
        if times is not None and times < 1:
            raise ValueError(f"times: expected at least 1, got {times}")
        with self._lock:
            self._fault = fault
            self._fault_times = None if fault == "none" else times

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "kind": self.kind,
                "outputs": {str(k): v for k, v in self._outputs.items()},
                "commands": len(self._commands),
                "refused": self._refused,
                "fault": self._fault,
                "fault_times": self._fault_times,
            }

    def _relay(self, relay: int | None) -> int:
        chosen = self.first_relay if relay is None else relay
        if chosen not in self._outputs:
            raise ValueError(f"no relay {chosen}; this plug has {sorted(self._outputs)}")
        return chosen

    def _take_fault(self, applies_to: tuple[str, ...]) -> str:
        """The fault for this request (counting it against ``times``), or "none"."""
        with self._lock:
            fault = self._fault
            if fault not in applies_to:
                return "none"
            if self._fault_times is not None:
                self._fault_times -= 1
                if self._fault_times <= 0:
                    self._fault, self._fault_times = "none", None
            return fault

    def _accept(self, relay: int, on: bool, answered: str, on_after_s: float | None = None) -> bool:
        """Record a command and switch (now or after switch_delay); the output before it.

        ``on_after_s`` (an off): the plug switches on by itself that long after.
        """
        with self._lock:
            was_on = self._outputs[relay]
            self._commands.append(AppliedCommand(relay, on, answered, on_after_s))
            if self.ignores_commands:
                return was_on
            pending = self._pending.pop(relay, None)
            if pending is not None:
                pending.cancel()  # the newer command wins, as on a real relay
            if self.kind.startswith("shelly"):
                # A newer Switch.Set (or turn=) replaces the flip-back timer; a Tasmota
                # backlog runs on whatever else is sent.
                flip = self._timed.pop(relay, None)
                if flip is not None:
                    flip.cancel()
            if on_after_s is not None and self.timers_fire:
                timed = threading.Timer(on_after_s, self._timed_on, (relay,))
                timed.daemon = True
                self._timed[relay] = timed
                timed.start()
            if self.switch_delay > 0:
                timer = threading.Timer(self.switch_delay, self._apply, (relay, on))
                timer.daemon = True
                self._pending[relay] = timer
                timer.start()
        if self.switch_delay <= 0:
            self._apply(relay, on)
        return was_on

    def _apply(self, relay: int, on: bool) -> None:
        with self._lock:
            changed = self._outputs[relay] != on
            self._outputs[relay] = on
            self._pending.pop(relay, None)
        if changed and self.on_change is not None:
            try:
                self.on_change(relay, on)
            except Exception:  # the hook is the lab's; the plug keeps working
                log.exception("plug stand-in: on_change hook failed for relay %d", relay)

    def _timed_on(self, relay: int) -> None:
        with self._lock:
            self._timed.pop(relay, None)
            self._commands.append(AppliedCommand(relay, True, "own timer"))
        self._apply(relay, True)

    def _wait_hang(self) -> None:
        self._stopping.wait(self.hang_s)

    # --- authentication -----------------------------------------------------

    def digest_challenge(self, stale: bool = False) -> str:
        nonce = secrets.token_hex(16)
        with self._lock:
            self._nonces.add(nonce)
        stale_part = ", stale=true" if stale else ""
        return (
            f'Digest qop="auth", realm="{self.realm}", nonce="{nonce}", '
            f"algorithm=SHA-256{stale_part}"
        )

    def digest_ok(self, method: str, uri: str, header: str | None) -> bool:
        """RFC 7616 digest check with SHA-256 and qop=auth, as Shelly Gen2+ does it."""
        if self.password is None:
            return True
        fields = plug_auth.digest_fields(header)
        with self._lock:
            known_nonce = fields is not None and fields.get("nonce") in self._nonces
        if fields is None or not known_nonce:
            return False
        return plug_auth.digest_ok(fields, method, uri, self.realm, SHELLY_USER, self.password)

    def basic_ok(self, header: str | None) -> bool:
        """HTTP Basic auth as Shelly Gen1 checks it (user ``admin``)."""
        if self.password is None:
            return True
        return plug_auth.basic_ok(header, SHELLY_GEN1_USER, self.password)

    def tasmota_credentials_ok(self, query: dict[str, list[str]]) -> bool:
        if self.password is None:
            return True
        return plug_auth.query_credentials_ok(query, TASMOTA_USER, self.password)


class _PlugServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        plug: PlugStandin,
    ) -> None:
        self.plug = plug
        super().__init__(address, handler)


class _PlugHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    sys_version = ""

    @property
    def plug(self) -> PlugStandin:
        return cast(_PlugServer, self.server).plug

    def version_string(self) -> str:
        return "ShellyHTTP" if self.plug.kind.startswith("shelly") else "Tasmota"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a line per poll would bury the test output (and Tasmota URLs hold passwords)

    def do_GET(self) -> None:
        self.close_connection = True
        parts = urlsplit(self.path)
        query = parse_qs(parts.query, keep_blank_values=True)
        try:
            if parts.path.startswith(CONTROL_PREFIX):
                self._control(parts.path[len(CONTROL_PREFIX) :], query)
            elif self.plug.kind == "shelly":
                self._shelly(parts.path, query)
            elif self.plug.kind == "shelly_gen1":
                self._shelly_gen1(parts.path, query)
            else:
                tasmota(
                    self.plug,
                    parts.path,
                    query,
                    hang_if_asked=self._hang_if_asked,
                    after_apply=self._after_apply,
                )
        except Answer as answer:
            self._send(answer.status, answer.body, answer.headers)
        except NoAnswer:
            return

    # --- control -------------------------------------------------------------

    def _control(self, what: str, query: dict[str, list[str]]) -> None:
        plug = self.plug
        if what == "state":
            raise Answer(HTTPStatus.OK, plug.snapshot())
        if what == "fault":
            mode = query.get("mode", ["none"])[0]
            times_text = query.get("times", [""])[0]
            try:
                plug.set_fault(mode, int(times_text) if times_text else None)
            except ValueError as exc:
                raise Answer(HTTPStatus.BAD_REQUEST, {"error": str(exc)}) from None
            raise Answer(HTTPStatus.OK, plug.snapshot())
        raise Answer(HTTPStatus.NOT_FOUND, {"error": f"no control {what!r}"})

    def _hang_if_asked(self) -> None:
        fault = self.plug._take_fault(("hang", "garble"))
        if fault == "hang":
            self.plug._wait_hang()
            raise NoAnswer
        if fault == "garble":
            raise Answer(HTTPStatus.OK, {"standin": "garbled"})

    # --- Shelly Gen2+ ----------------------------------------------------------

    def _shelly(self, path: str, query: dict[str, list[str]]) -> None:
        plug = self.plug
        if path == "/shelly":  # device info: never behind auth (Shelly API docs)
            raise Answer(
                HTTPStatus.OK,
                {
                    "id": "shellyplugus-standin",
                    "model": "SNPL-00116US",
                    "gen": 2,
                    "app": "PlugUS",
                    "auth_en": plug.password is not None,
                    "auth_domain": plug.realm if plug.password is not None else None,
                },
            )
        if not path.startswith("/rpc/"):
            raise Answer(HTTPStatus.NOT_FOUND, {"code": 404, "message": "Not Found"})
        self._hang_if_asked()
        if not plug.digest_ok("GET", self.path, self.headers.get("Authorization")):
            raise Answer(
                HTTPStatus.UNAUTHORIZED,
                {"code": 401, "message": "unauthorized"},
                {"WWW-Authenticate": plug.digest_challenge()},
            )
        method = path[len("/rpc/") :]
        if method == "Switch.GetConfig":
            relay = self._shelly_id(query)
            raise Answer(
                HTTPStatus.OK,
                {"id": relay, "name": None, "in_mode": "flip", "initial_state": plug.power_on},
            )
        if method not in ("Switch.GetStatus", "Switch.Set"):
            raise Answer(HTTPStatus.NOT_FOUND, {"code": 404, "message": f"No handler for {method}"})
        relay = self._shelly_id(query)
        if method == "Switch.GetStatus":
            raise Answer(HTTPStatus.OK, self._shelly_status(relay))
        self._shelly_set(relay, query)

    def _shelly_status(self, relay: int) -> dict[str, Any]:
        """Switch.GetStatus: the relay's output and a plug's meter readings."""
        with self.plug._lock:
            output = self.plug._outputs[relay]
        return {
            "id": relay,
            "source": "HTTP_in",
            "output": output,
            "apower": 42.0 if output else 0.0,
            "voltage": 120.3,
            "current": 0.35 if output else 0.0,
            "aenergy": {"total": 1234.5},
            "temperature": {"tC": 38.2, "tF": 100.8},
        }

    def _shelly_set(self, relay: int, query: dict[str, list[str]]) -> None:
        """Switch.Set: switch the relay (a timed off with ``toggle_after``); ``was_on``."""
        plug = self.plug
        on_text = query.get("on", [""])[0]
        if on_text not in ("true", "false"):
            raise Answer(
                HTTPStatus.BAD_REQUEST, {"code": -103, "message": "Missing required argument 'on'!"}
            )
        on = on_text == "true"
        toggle_after = self._toggle_after(query)
        fault = plug._take_fault(("refuse", "drop", "stall"))
        if fault == "refuse":
            with plug._lock:
                plug._refused += 1
            raise Answer(
                HTTPStatus.INTERNAL_SERVER_ERROR,
                {"code": -109, "message": "Switch is in safe mode (stand-in refuse fault)"},
            )
        # toggle_after flips back to the other state; only a timed off is modelled.
        on_after = None if on else toggle_after
        was_on = plug._accept(relay, on, "yes" if fault == "none" else fault, on_after)
        self._after_apply(fault)
        raise Answer(HTTPStatus.OK, {"was_on": was_on})

    def _toggle_after(self, query: dict[str, list[str]]) -> float | None:
        text = query.get("toggle_after", [""])[0]
        if not text:
            return None
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise Answer(
                HTTPStatus.BAD_REQUEST,
                {"code": -103, "message": f"Invalid argument 'toggle_after': {text}"},
            )
        return seconds

    def _shelly_id(self, query: dict[str, list[str]]) -> int:
        text = query.get("id", [""])[0]
        if not text:
            raise Answer(HTTPStatus.BAD_REQUEST, {"code": -103, "message": "Missing required 'id'"})
        try:
            relay = int(text)
        except ValueError:
            raise Answer(
                HTTPStatus.BAD_REQUEST, {"code": -103, "message": f"Invalid argument 'id': {text}"}
            ) from None
        if relay not in self.plug._outputs:
            # Real firmware's HTTP status for RPC errors varies; the code is what counts.
            raise Answer(HTTPStatus.NOT_FOUND, {"code": -105, "message": f"Bad id={relay}"})
        return relay

    def _after_apply(self, fault: str) -> None:
        if fault == "drop":
            raise NoAnswer
        if fault == "stall":
            self.plug._wait_hang()
            raise NoAnswer

    # --- Shelly Gen1 ------------------------------------------------------------

    def _shelly_gen1(self, path: str, query: dict[str, list[str]]) -> None:
        plug = self.plug
        if path == "/shelly":  # device info: never behind auth (Shelly Gen1 API docs)
            raise Answer(
                HTTPStatus.OK,
                {"type": "SHPLG-S", "mac": "A4CF12F3D1E2", "auth": plug.password is not None},
            )
        self._hang_if_asked()
        if not plug.basic_ok(self.headers.get("Authorization")):
            raise Answer(
                HTTPStatus.UNAUTHORIZED,
                "401 Unauthorized",
                {"WWW-Authenticate": 'Basic realm="SHPLG-S-F3D1E2"'},
            )
        settings = path.startswith("/settings/relay/")
        prefix = "/settings/relay/" if settings else "/relay/"
        if not path.startswith(prefix) or not path[len(prefix) :].isdigit():
            raise Answer(HTTPStatus.NOT_FOUND, "Not Found")
        relay = int(path[len(prefix) :])
        if relay not in plug._outputs:
            raise Answer(HTTPStatus.NOT_FOUND, "Bad relay index")
        if settings:
            raise Answer(
                HTTPStatus.OK,
                {"name": None, "default_state": plug.power_on, "btn_type": "toggle"},
            )
        turn = query.get("turn", [""])[0]
        if not turn:
            raise Answer(HTTPStatus.OK, self._gen1_relay(relay))
        if turn not in ("on", "off"):
            raise Answer(HTTPStatus.BAD_REQUEST, "Bad turn")
        timer = self._gen1_timer(query)
        fault = plug._take_fault(("refuse", "drop", "stall"))
        if fault == "refuse":
            with plug._lock:
                plug._refused += 1
            raise Answer(HTTPStatus.BAD_REQUEST, "Relay is locked (stand-in refuse)")
        on = turn == "on"
        # timer flips back to the other state; only a timed off is modelled.
        plug._accept(relay, on, "yes" if fault == "none" else fault, None if on else timer)
        self._after_apply(fault)
        body = self._gen1_relay(relay)
        if not plug.ignores_commands:
            # The answer carries the commanded state even with a slow relay.
            body["ison"] = on
        raise Answer(HTTPStatus.OK, body)

    def _gen1_relay(self, relay: int) -> dict[str, Any]:
        plug = self.plug
        with plug._lock:
            output = plug._outputs[relay]
            timed = relay in plug._timed
        return {
            "ison": output,
            "has_timer": timed,
            "timer_started": 0,
            "timer_duration": 0,
            "timer_remaining": 0,
            "overpower": False,
            "source": "http",
        }

    def _gen1_timer(self, query: dict[str, list[str]]) -> float | None:
        text = query.get("timer", [""])[0]
        if not text:
            return None
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise Answer(HTTPStatus.BAD_REQUEST, "Bad timer")
        return seconds

    # --- output -------------------------------------------------------------------

    def _send(self, status: int, body: object, headers: dict[str, str]) -> None:
        # A str is a plain-text answer (Shelly Gen1's errors), anything else JSON.
        text = isinstance(body, str)
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if text else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


# --- command line -------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spark_watchdog.lab.hardware plug",
        description="Stand-in smart plug (Shelly Gen2+ RPC, Shelly Gen1 or Tasmota /cm) with "
        "state, optional auth and faults "
        "(GET /_standin/fault?mode=refuse|drop|stall|hang|garble|none).",
    )
    parser.add_argument("--kind", choices=PLUG_KINDS, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    parser.add_argument(
        "--password-file",
        type=Path,
        default=None,
        help="require this password (Shelly: digest auth as admin; Shelly Gen1: basic auth as "
        "admin; Tasmota: user=admin&password=)",
    )
    parser.add_argument("--relays", type=int, default=1)
    parser.add_argument("--initial", choices=("on", "off"), default="on")
    parser.add_argument("--switch-delay", type=float, default=0.0, help="seconds")
    parser.add_argument(
        "--legacy-auth-answer",
        action="store_true",
        help="Tasmota: answer a missing password with 200, as firmware before #8170 did",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    password = None
    if args.password_file is not None:
        try:
            password = args.password_file.read_text(encoding="utf-8").rstrip("\n")
        except OSError as exc:
            print(f"plug_standin: --password-file: {exc}", file=sys.stderr)
            return 2
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    def on_change(relay: int, on: bool) -> None:
        print(f"relay {relay} -> {'on' if on else 'off'}", flush=True)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        plug = PlugStandin(
            args.kind,
            args.host,
            args.port,
            password=password,
            relays=args.relays,
            initially_on=args.initial == "on",
            switch_delay=args.switch_delay,
            on_change=on_change,
            legacy_auth_answer=args.legacy_auth_answer,
        )
    except (ValueError, OSError) as exc:
        print(f"plug_standin: {exc}", file=sys.stderr)
        return 2
    with plug:
        print(f"plug stand-in ({args.kind}) listening on {plug.url}", flush=True)
        while not stop.wait(0.5):
            pass
    return 0
