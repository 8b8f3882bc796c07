"""A stand-in Home Assistant for tests and the lab: the REST API's switch calls.

Built from Home Assistant's REST API documentation
(developers.home-assistant.io, "REST API"): every call carries
``Authorization: Bearer TOKEN`` (a long-lived access token), otherwise
``401: Unauthorized``;

- ``GET /api/`` → ``{"message": "API running."}``;
- ``GET /api/states/<entity_id>`` → ``{"entity_id", "state", "attributes",
  "last_changed", "last_updated", ...}``, 404 ``{"message": "Entity not
  found."}`` for an entity it does not have;
- ``POST /api/services/switch/turn_off`` (``turn_on``) with
  ``{"entity_id": ...}`` → 200 and the list of states that changed while
  the call ran (empty when the device has not reported yet).

Timestamps are ISO 8601 in UTC by *this* Home Assistant's clock, which runs
``clock_offset_s`` off the test's: a client must not compare them with its
own. ``lag_s`` makes the device report its new state that long after the
call (Home Assistant's state lags the device). ``last_changed`` moves only
when the state changes, ``last_updated`` also when attributes do
(``touch``).

Faults (:meth:`HomeAssistantStandin.set_fault`): ``garbage`` (every answer is
200 and no JSON), ``hang`` (no answer for ``hang_s``), ``drop`` (a service
call applied, the connection closed without an answer), ``error`` (a service
call answered 500, not applied), ``ignore`` (a service call answered 200
``[]`` and the device never follows), ``stale`` (a service call switches the
state but keeps the old ``last_changed``: a state restored from before the
command), ``unavailable`` (a service call makes the entity ``unavailable``).
"""

from __future__ import annotations

import hmac
import json
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from spark_watchdog.lab.hardware.served import Served

FAULTS = ("none", "garbage", "hang", "drop", "error", "ignore", "stale", "unavailable")


@dataclass
class Entity:
    state: str
    last_changed: float
    last_updated: float


@dataclass(frozen=True)
class ServiceCall:
    """One service call the stand-in took: which entity, which service, how it answered."""

    entity_id: str
    service: str
    answered: str  # "yes", or the fault


class HomeAssistantStandin(Served):
    """Switch entities behind the REST API on ``127.0.0.1:port``."""

    def __init__(
        self,
        token: str,
        entities: dict[str, str] | None = None,
        *,
        lag_s: float = 0.0,
        clock_offset_s: float = 0.0,
        hang_s: float = 300.0,
        port: int = 0,
    ) -> None:
        self.token = token
        self.lag_s = lag_s
        self.clock_offset_s = clock_offset_s
        self.hang_s = hang_s
        self._lock = threading.Lock()
        start = self.now() - 3600.0
        self._entities = {
            entity_id: Entity(state, start, start)
            for entity_id, state in (entities or {"switch.spark_1": "on"}).items()
        }
        self._calls: list[ServiceCall] = []
        self._timers: list[threading.Timer] = []
        self._fault = "none"
        self._fault_times: int | None = None
        self._stopping = threading.Event()
        self._server = _Server(("127.0.0.1", port), _Handler, self)

    # --- lifecycle ------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def thread_name(self) -> str:
        return "home-assistant-standin"

    # --- the test's hand ------------------------------------------------------

    def now(self) -> float:
        """This Home Assistant's clock (epoch seconds)."""
        return time.time() + self.clock_offset_s

    def state(self, entity_id: str = "switch.spark_1") -> str:
        with self._lock:
            return self._entities[entity_id].state

    def set_state(self, state: str, entity_id: str = "switch.spark_1") -> None:
        """The device reports ``state`` (a press of its button)."""
        with self._lock:
            self._report(entity_id, state)

    def touch(self, entity_id: str = "switch.spark_1") -> None:
        """An attribute changed (a power reading): ``last_updated`` moves, ``last_changed`` not."""
        with self._lock:
            self._entities[entity_id].last_updated = self.now()

    @property
    def calls(self) -> list[ServiceCall]:
        with self._lock:
            return list(self._calls)

    def set_fault(self, fault: str, times: int | None = None) -> None:
        if fault not in FAULTS:
            raise ValueError(f"fault: expected one of {', '.join(FAULTS)}, got {fault!r}")
        with self._lock:
            self._fault = fault
            self._fault_times = None if fault == "none" else times

    # --- internals ------------------------------------------------------------

    def _report(self, entity_id: str, state: str) -> None:
        entity = self._entities[entity_id]
        now = self.now()
        if entity.state != state:
            entity.last_changed = now
        entity.state = state
        entity.last_updated = now

    def _take_fault(self, applies: tuple[str, ...]) -> str:
        with self._lock:
            fault = self._fault
            if fault not in applies:
                return "none"
            if self._fault_times is not None:
                self._fault_times -= 1
                if self._fault_times <= 0:
                    self._fault, self._fault_times = "none", None
            return fault

    def _call(self, entity_id: str, service: str, fault: str) -> list[dict[str, Any]]:
        """Carry out ``switch.<service>``; the states changed while it ran."""
        target = "on" if service == "turn_on" else "off"
        with self._lock:
            self._calls.append(ServiceCall(entity_id, service, "yes" if fault == "none" else fault))
            entity = self._entities[entity_id]
            if fault == "ignore":
                return []
            if fault == "unavailable":
                self._report(entity_id, "unavailable")
                return [self._json(entity_id)]
            if fault == "stale":
                entity.state, entity.last_updated = target, self.now()
                return []
            if self.lag_s > 0:
                timer = threading.Timer(self.lag_s, self._late_report, (entity_id, target))
                timer.daemon = True
                self._timers.append(timer)
                timer.start()
                return []
            self._report(entity_id, target)
            return [self._json(entity_id)]

    def _late_report(self, entity_id: str, state: str) -> None:
        with self._lock:
            self._report(entity_id, state)

    def _json(self, entity_id: str) -> dict[str, Any]:
        entity = self._entities[entity_id]

        def stamp(seconds: float) -> str:
            return datetime.fromtimestamp(seconds, timezone.utc).isoformat()

        return {
            "entity_id": entity_id,
            "state": entity.state,
            "attributes": {"friendly_name": entity_id.split(".", 1)[1]},
            "last_changed": stamp(entity.last_changed),
            "last_reported": stamp(entity.last_updated),
            "last_updated": stamp(entity.last_updated),
            "context": {"id": "01HXSTANDIN", "parent_id": None, "user_id": None},
        }


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        home: HomeAssistantStandin,
    ) -> None:
        self.home = home
        super().__init__(address, handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    @property
    def home(self) -> HomeAssistantStandin:
        return cast(_Server, self.server).home

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        self.close_connection = True
        home = self.home
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if home._take_fault(("hang",)) == "hang":
            home._stopping.wait(home.hang_s)
            return
        if not self._authorized():
            self._send(HTTPStatus.UNAUTHORIZED, "401: Unauthorized", text=True)
            return
        if home._take_fault(("garbage",)) == "garbage":
            self._send(HTTPStatus.OK, "<html>Home Assistant</html>", text=True)
            return
        path = self.path.split("?", 1)[0]
        if method == "GET" and path == "/api/":
            self._send(HTTPStatus.OK, {"message": "API running."})
        elif method == "GET" and path.startswith("/api/states/"):
            entity_id = path[len("/api/states/") :]
            with home._lock:
                found = entity_id in home._entities
                body = home._json(entity_id) if found else {"message": "Entity not found."}
            self._send(HTTPStatus.OK if found else HTTPStatus.NOT_FOUND, body)
        elif method == "POST" and path in (
            "/api/services/switch/turn_off",
            "/api/services/switch/turn_on",
        ):
            self._service(path.rsplit("/", 1)[1], raw)
        else:
            self._send(HTTPStatus.NOT_FOUND, {"message": "Not found"})

    def _authorized(self) -> bool:
        header = self.headers.get("Authorization") or ""
        if not header.startswith("Bearer "):
            return False
        return hmac.compare_digest(header[len("Bearer ") :].encode(), self.home.token.encode())

    def _service(self, service: str, raw: bytes) -> None:
        home = self.home
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            self._send(HTTPStatus.BAD_REQUEST, {"message": "Data should be valid JSON."})
            return
        entity_id = data.get("entity_id") if isinstance(data, dict) else None
        with home._lock:
            known = entity_id in home._entities
        if not known:
            # Home Assistant accepts a call for an entity it does not have and changes nothing.
            self._send(HTTPStatus.OK, [])
            return
        fault = home._take_fault(("drop", "error", "ignore", "stale", "unavailable"))
        if fault == "error":
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, "500 Internal Server Error", text=True)
            return
        changed = home._call(str(entity_id), service, fault)
        if fault == "drop":
            return  # applied; the connection closes without an answer
        self._send(HTTPStatus.OK, changed)

    def _send(self, status: int, body: object, *, text: bool = False) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if text else "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)
