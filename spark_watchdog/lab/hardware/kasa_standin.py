"""A stand-in TP-Link Kasa or Tapo plug (or power strip) for tests and the lab.

No real plug can run here, so this is built from the protocol as python-kasa
(its transports and protocols, read, not copied) and the published reverse
engineering of it (softScheck's tplink-smartplug for the legacy protocol;
the KLAP write-ups python-kasa cites) describe it. One stand-in speaks one
of three dialects, on a real socket on loopback:

- ``legacy``: TCP; each message is a 4-byte big-endian length and the JSON
  XOR-ed with an autokey (the key starts at 171 and becomes each cipher
  byte). ``{"system": {"get_sysinfo": {}}}`` answers ``relay_state`` (a
  plug) or ``children`` with ``id`` and ``state`` (a strip);
  ``{"system": {"set_relay_state": {"state": 0|1}}}`` switches, a strip's
  outlet named by ``{"context": {"child_ids": [id]}}``; answers carry
  ``err_code``;
- ``klap``: the same JSON over HTTP. ``POST /app/handshake1`` takes the
  client's 16-byte seed and answers the plug's seed and
  ``sha256(client_seed + auth_hash)``, ``auth_hash = md5(md5(e-mail) +
  md5(password))``, with a ``TP_SESSIONID`` cookie; ``/app/handshake2``
  takes ``sha256(plug_seed + auth_hash)``; ``/app/request?seq=N`` carries
  ``sha256(sig + seq + cipher) + cipher``, AES-128-CBC with a key, an IV
  prefix and a signature key each derived by SHA-256 from ``lsk``, ``iv``
  or ``ldk`` and both seeds and the hash, the IV's last 4 bytes the
  sequence number; the answer is encrypted under the same sequence number;
- ``smart``: Tapo's JSON-RPC (``get_device_info`` → ``device_on``;
  ``set_device_info``; a strip's ``get_child_device_list`` and
  ``control_child``; ``error_code`` in every answer) over KLAP with its
  second hashes: ``auth_hash = sha256(sha1(e-mail) + sha1(password))``,
  handshake1 ``sha256(client_seed + plug_seed + auth_hash)``, handshake2
  ``sha256(plug_seed + client_seed + auth_hash)``.

``delay_s`` makes a switch land that long after its answer; ``one_answer``
makes the legacy plug close each connection after one answer (firmware that
does, instead of keeping it open). Faults
(:meth:`KasaStandin.set_fault`) apply to switching requests: ``drop`` (the
switch applied, the connection closed without an answer), ``hang`` (not
applied, no answer for ``hang_s``), ``error`` (answered with an error code,
not applied), ``garbage`` (applied, answered with bytes that are no JSON),
and ``reject_auth`` for every handshake (the plug proves credentials other
than the client's, as a plug bound to another account does).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import socketserver
import struct
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from spark_watchdog.lab.hardware.served import Served

FAULTS = ("none", "drop", "hang", "error", "garbage", "reject_auth")
DIALECTS = ("legacy", "klap", "smart")
_XOR_KEY = 171
_LENGTH = struct.Struct(">I")
_SEQ = struct.Struct(">l")


def xor_encode(plain: bytes) -> bytes:
    """The legacy protocol's framing and autokey cipher, client to plug or back."""
    key, out = _XOR_KEY, bytearray()
    for byte in plain:
        key ^= byte
        out.append(key)
    return _LENGTH.pack(len(plain)) + bytes(out)


def xor_decode(cipher: bytes) -> bytes:
    key, out = _XOR_KEY, bytearray()
    for byte in cipher:
        out.append(key ^ byte)
        key = byte
    return bytes(out)


def _md5(data: bytes) -> bytes:
    return hashlib.md5(data).digest()  # the protocol's hash


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _sha1(data: bytes) -> bytes:
    return hashlib.sha1(data).digest()  # the protocol's hash


def auth_hash(dialect: str, username: str, password: str) -> bytes:
    user, word = username.encode(), password.encode()
    if dialect == "smart":
        return _sha256(_sha1(user) + _sha1(word))
    return _md5(_md5(user) + _md5(word))


@dataclass
class KlapSession:
    """One client's KLAP session: the seeds, the hash, and the keys derived from them."""

    dialect: str
    local_seed: bytes
    remote_seed: bytes
    auth: bytes
    confirmed: bool = False

    def _derive(self, label: bytes) -> bytes:
        return _sha256(label + self.local_seed + self.remote_seed + self.auth)

    def expected_handshake1(self) -> bytes:
        if self.dialect == "smart":
            return _sha256(self.local_seed + self.remote_seed + self.auth)
        return _sha256(self.local_seed + self.auth)

    def expected_handshake2(self) -> bytes:
        if self.dialect == "smart":
            return _sha256(self.remote_seed + self.local_seed + self.auth)
        return _sha256(self.remote_seed + self.auth)

    def _cipher(self, seq: int) -> Cipher[modes.CBC]:
        key = self._derive(b"lsk")[:16]
        iv = self._derive(b"iv")[:12] + _SEQ.pack(seq)
        return Cipher(algorithms.AES(key), modes.CBC(iv))

    def _signature(self, seq: int, cipher: bytes) -> bytes:
        return _sha256(self._derive(b"ldk")[:28] + _SEQ.pack(seq) + cipher)

    def open(self, seq: int, body: bytes) -> bytes | None:
        """The request's plain text, or None when its signature does not hold."""
        signature, cipher = body[:32], body[32:]
        if signature != self._signature(seq, cipher) or not cipher or len(cipher) % 16:
            return None
        decryptor = self._cipher(seq).decryptor()
        padded = decryptor.update(cipher) + decryptor.finalize()
        unpadder = padding.PKCS7(128).unpadder()
        return unpadder.update(padded) + unpadder.finalize()

    def seal(self, seq: int, plain: bytes) -> bytes:
        padder = padding.PKCS7(128).padder()
        encryptor = self._cipher(seq).encryptor()
        cipher = encryptor.update(padder.update(plain) + padder.finalize()) + encryptor.finalize()
        return self._signature(seq, cipher) + cipher


@dataclass(frozen=True)
class Switch:
    """One switching request the stand-in took: which outlet, to what, how it answered."""

    outlet: int | None
    on: bool
    answered: str  # "yes", or the fault


class _Dropped(Exception):
    """Close the connection without an answer."""


class KasaStandin(Served):
    """A plug (``outlets=0``) or a strip of ``outlets`` outlets on ``127.0.0.1:port``."""

    def __init__(
        self,
        dialect: str = "legacy",
        *,
        outlets: int = 0,
        username: str = "",
        password: str = "",
        delay_s: float = 0.0,
        hang_s: float = 60.0,
        one_answer: bool = False,
        port: int = 0,
    ) -> None:
        if dialect not in DIALECTS:
            raise ValueError(f"dialect: one of {', '.join(DIALECTS)}, got {dialect!r}")
        self.dialect = dialect
        self.delay_s = delay_s
        self.hang_s = hang_s
        self.one_answer = one_answer
        self._auth = auth_hash(dialect, username, password)
        self._lock = threading.Lock()
        self._relays = [True] * max(1, outlets)
        self._strip = outlets > 0
        self._device_id = os.urandom(20).hex().upper()
        self.switches: list[Switch] = []
        self._sessions: dict[str, KlapSession] = {}
        self._timers: list[threading.Timer] = []
        self._fault = "none"
        self._fault_times: int | None = None
        self._stopping = threading.Event()
        self._server: socketserver.TCPServer
        if dialect == "legacy":
            self._server = _LegacyServer(("127.0.0.1", port), _LegacyHandler, self)
        else:
            self._server = _KlapServer(("127.0.0.1", port), _KlapHandler, self)

    # --- lifecycle ------------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def thread_name(self) -> str:
        return f"kasa-standin-{self.dialect}"

    # --- the test's hand ------------------------------------------------------

    def state(self, outlet: int | None = None) -> str:
        """``"on"`` or ``"off"``: the plug's relay, or a strip's outlet (from 1)."""
        with self._lock:
            return "on" if self._relays[self._index(outlet)] else "off"

    def set_state(self, on: bool, outlet: int | None = None) -> None:
        """Someone pressed the button."""
        with self._lock:
            self._relays[self._index(outlet)] = on

    def set_fault(self, fault: str, times: int | None = None) -> None:
        """``fault`` for the next ``times`` switching requests (or handshakes), or all."""
        if fault not in FAULTS:
            raise ValueError(f"fault: one of {', '.join(FAULTS)}, got {fault!r}")
        with self._lock:
            self._fault, self._fault_times = fault, times

    # --- internals --------------------------------------------------------------

    def _index(self, outlet: int | None) -> int:
        return 0 if outlet is None else outlet - 1

    def _take_fault(self, kinds: tuple[str, ...]) -> str:
        with self._lock:
            fault = self._fault
            if fault not in kinds:
                return "none"
            if self._fault_times is not None:
                self._fault_times -= 1
                if self._fault_times <= 0:
                    self._fault, self._fault_times = "none", None
            return fault

    def _switch(self, index: int, on: bool) -> bytes | None:
        """A switching request arrived: its fault, then the relay. None: answer normally."""
        fault = self._take_fault(("drop", "hang", "error", "garbage"))
        outlet = index + 1 if self._strip else None
        with self._lock:
            self.switches.append(Switch(outlet, on, "yes" if fault == "none" else fault))
        if fault == "hang":
            self._stopping.wait(self.hang_s)
            raise _Dropped
        if fault == "error":
            return b"error"
        self._land(index, on)
        if fault == "drop":
            raise _Dropped
        return b"<html>not json" if fault == "garbage" else None

    def _land(self, index: int, on: bool) -> None:
        def flip() -> None:
            with self._lock:
                self._relays[index] = on

        if self.delay_s <= 0:
            flip()
            return
        timer = threading.Timer(self.delay_s, flip)
        timer.daemon = True
        with self._lock:
            self._timers.append(timer)
        timer.start()

    def _child_id(self, index: int) -> str:
        return f"{self._device_id}{index:02d}"

    def _child_index(self, child_id: Any) -> int | None:
        for index in range(len(self._relays)):
            if child_id == self._child_id(index):
                return index
        return None

    # --- legacy JSON (legacy and klap) -----------------------------------------

    def answer_iot(self, request: dict[str, Any]) -> bytes:
        system = request.get("system")
        if not isinstance(system, dict):
            return _json({"system": {"err_code": -1, "err_msg": "module not support"}})
        if "get_sysinfo" in system:
            return _json({"system": {"get_sysinfo": self._sysinfo()}})
        setting = system.get("set_relay_state")
        if not isinstance(setting, dict) or setting.get("state") not in (0, 1):
            return _json({"system": {"err_code": -2, "err_msg": "member not support"}})
        index = 0
        if self._strip:
            context = request.get("context")
            ids = context.get("child_ids") if isinstance(context, dict) else None
            found = self._child_index(ids[0]) if isinstance(ids, list) and len(ids) == 1 else None
            if found is None:
                return _json({"system": {"set_relay_state": {"err_code": -14}}})
            index = found
        said = self._switch(index, bool(setting["state"]))
        if said == b"error":
            return _json({"system": {"set_relay_state": {"err_code": -1, "err_msg": "failed"}}})
        return said or _json({"system": {"set_relay_state": {"err_code": 0}}})

    def _sysinfo(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "sw_ver": "1.0.0 Build standin",
            "model": "HS300(US)" if self._strip else "HS103(US)",
            "deviceId": self._device_id,
            "alias": "stand-in",
            "err_code": 0,
        }
        with self._lock:
            relays = list(self._relays)
        if self._strip:
            info["children"] = [
                {"id": self._child_id(i), "state": int(on), "alias": f"Plug {i + 1}"}
                for i, on in enumerate(relays)
            ]
            info["child_num"] = len(relays)
        else:
            info["relay_state"] = int(relays[0])
        return info

    # --- Tapo's JSON-RPC (smart) -------------------------------------------------

    def answer_smart(self, request: dict[str, Any]) -> bytes:
        method, params = request.get("method"), request.get("params")
        with self._lock:
            relays = list(self._relays)
        if method == "get_device_info" and not self._strip:
            return _json({"error_code": 0, "result": {"device_on": relays[0], "model": "P110"}})
        if method == "get_child_device_list" and self._strip:
            children = [
                {"device_id": self._child_id(i), "position": i + 1, "device_on": on}
                for i, on in enumerate(relays)
            ]
            result = {"child_device_list": children, "start_index": 0, "sum": len(children)}
            return _json({"error_code": 0, "result": result})
        if method == "set_device_info" and not self._strip and isinstance(params, dict):
            return self._smart_switch(0, params, wrap=False)
        if method == "control_child" and self._strip and isinstance(params, dict):
            index = self._child_index(params.get("device_id"))
            inner = params.get("requestData")
            if index is None or not isinstance(inner, dict):
                return _json({"error_code": -1})
            if inner.get("method") != "set_device_info" or not isinstance(
                inner.get("params"), dict
            ):
                return _json({"error_code": -1})
            return self._smart_switch(index, inner["params"], wrap=True)
        return _json({"error_code": -1002})  # the method does not exist

    def _smart_switch(self, index: int, params: dict[str, Any], *, wrap: bool) -> bytes:
        on = params.get("device_on")
        if not isinstance(on, bool):
            return _json({"error_code": -1008})
        said = self._switch(index, on)
        code = -1 if said == b"error" else 0
        if said is not None and said != b"error":
            return said
        if wrap:
            return _json({"error_code": 0, "result": {"responseData": {"error_code": code}}})
        return _json({"error_code": code})

    # --- KLAP ---------------------------------------------------------------------

    def handshake1(self, local_seed: bytes) -> tuple[str, bytes]:
        auth = self._auth
        if self._take_fault(("reject_auth",)) == "reject_auth":
            auth = os.urandom(len(auth))  # a plug bound to some other account
        session = KlapSession(self.dialect, local_seed, os.urandom(16), auth)
        cookie = os.urandom(16).hex().upper()
        with self._lock:
            self._sessions[cookie] = session
        return cookie, session.remote_seed + session.expected_handshake1()

    def session(self, cookie: str | None) -> KlapSession | None:
        with self._lock:
            return None if cookie is None else self._sessions.get(cookie)


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


class _LegacyServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: Any, plug: KasaStandin) -> None:
        self.plug = plug
        super().__init__(address, handler)


class _LegacyHandler(socketserver.BaseRequestHandler):
    """One TCP connection: framed requests, one answer each, until the client closes."""

    def handle(self) -> None:
        plug = cast(_LegacyServer, self.server).plug
        sock: socket.socket = self.request
        sock.settimeout(1.0)
        while not plug._stopping.is_set():
            try:
                head = _read_exactly(sock, 4, plug._stopping)
                if head is None:
                    return
                body = _read_exactly(sock, _LENGTH.unpack(head)[0], plug._stopping)
                if body is None:
                    return
                answer = plug.answer_iot(json.loads(xor_decode(body)))
            except (_Dropped, OSError, ValueError):
                return
            sock.sendall(xor_encode(answer))
            if plug.one_answer:
                return


def _read_exactly(sock: socket.socket, size: int, stopping: threading.Event) -> bytes | None:
    data = b""
    while len(data) < size and not stopping.is_set():
        try:
            chunk = sock.recv(size - len(data))
        except TimeoutError:
            continue
        if not chunk:
            return None
        data += chunk
    return data if len(data) == size else None


class _KlapServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: Any, plug: KasaStandin) -> None:
        self.plug = plug
        super().__init__(address, handler)


class _KlapHandler(BaseHTTPRequestHandler):
    """``/app/handshake1``, ``/app/handshake2`` and ``/app/request?seq=N``."""

    def log_message(self, format: str, *args: Any) -> None:
        return None

    @property
    def plug(self) -> KasaStandin:
        return cast(_KlapServer, self.server).plug

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        parts = urlsplit(self.path)
        try:
            if parts.path == "/app/handshake1" and len(body) == 16:
                cookie, answer = self.plug.handshake1(body)
                self._send(HTTPStatus.OK, answer, cookie)
            elif parts.path == "/app/handshake2":
                self._handshake2(body)
            elif parts.path == "/app/request":
                self._request(body, parse_qs(parts.query).get("seq", [""])[0])
            else:
                self._send(HTTPStatus.NOT_FOUND, b"")
        except _Dropped:
            self.close_connection = True

    def _cookie(self) -> str | None:
        for part in (self.headers.get("Cookie") or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == "TP_SESSIONID":
                return value
        return None

    def _handshake2(self, body: bytes) -> None:
        session = self.plug.session(self._cookie())
        if session is None or body != session.expected_handshake2():
            self._send(HTTPStatus.FORBIDDEN, b"")
            return
        session.confirmed = True
        self._send(HTTPStatus.OK, b"")

    def _request(self, body: bytes, seq_text: str) -> None:
        session = self.plug.session(self._cookie())
        try:
            seq = int(seq_text)
        except ValueError:
            seq = None
        plain = None if session is None or seq is None else session.open(seq, body)
        if session is None or not session.confirmed or seq is None or plain is None:
            self._send(HTTPStatus.FORBIDDEN, b"")
            return
        request = json.loads(plain)
        plug = self.plug
        answer = plug.answer_smart(request) if plug.dialect == "smart" else plug.answer_iot(request)
        self._send(HTTPStatus.OK, session.seal(seq, answer))

    def _send(self, status: HTTPStatus, body: bytes, cookie: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        if cookie is not None:
            self.send_header("Set-Cookie", f"TP_SESSIONID={cookie}")
        self.end_headers()
        self.wfile.write(body)
