"""TP-Link Kasa and Tapo plugs and power strips (per outlet), through python-kasa.

python-kasa (python-kasa.readthedocs.io) is the kept library that speaks every
generation of these devices; this path uses its protocol layer (a transport
and a protocol object per call) rather than its ``Device`` classes, because
those retry a failed query up to three times, and a power command whose fate
is unknown must never be sent again. Every query here is sent with
``retry_count=0``. Three dialects (``protocol`` in the config):

- ``legacy``: the original Kasa protocol, JSON framed by a 4-byte length and
  XOR-"encrypted" (autokey, initial key 171) over TCP port 9999, no
  credentials. ``{"system": {"get_sysinfo": {}}}`` answers ``relay_state``
  (a plug) or ``children`` (a strip: ``id`` and ``state`` per outlet);
  ``{"system": {"set_relay_state": {"state": 0}}}`` switches, on a strip
  with ``{"context": {"child_ids": [id]}}``; the answer's ``err_code`` is 0;
- ``klap``: the same JSON inside KLAP, the authenticated protocol of newer
  Kasa firmware: HTTP POSTs to ``/app/handshake1``, ``/app/handshake2`` and
  ``/app/request?seq=N`` on port 80, the payload AES-128-CBC encrypted with
  keys derived from both sides' seeds and a hash of the TP-Link account's
  e-mail and password (the password itself never leaves the controller);
- ``smart``: Tapo plugs and strips (and newer Kasa ones that python-kasa's
  discovery shows as ``SMART.*``): JSON-RPC (``get_device_info`` answers
  ``device_on``; ``set_device_info`` switches; a strip's outlets through
  ``get_child_device_list`` and ``control_child``) over KLAP with its second
  version of the hashes.

What may have landed: a KLAP handshake that fails (refused credentials, no
answer) sent no command, so here the handshake is done first, on its own; a
legacy connection that cannot be opened sent nothing either (the transport
reports the moment its bytes leave). Anything failing after that, a timeout,
a reset connection, an answer that cannot be read, is ``Ambiguous``: read
back, never resent. An answer with an error code says the device did not do
it (``Refused``).

The e-mail and the password come from ``username_file`` and ``password_file``
and go only into python-kasa's ``Credentials``: never a log line or an error.
python-kasa needs Python 3.11 or newer; it is the ``kasa`` extra
(``pip install 'spark-watchdog[kasa]'``), imported only when a ``kasa`` path
is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from spark_watchdog.config.power_devices import KasaDevice
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import Ambiguous, ConfigError, PowerError, Refused, Unreachable
from spark_watchdog.power import send_window
from spark_watchdog.power._http import excerpt
from spark_watchdog.power.base import PowerState

if TYPE_CHECKING:
    from kasa.protocols import BaseProtocol
    from kasa.transports import BaseTransport

# python-kasa's DEBUG lines carry each KLAP handshake's seeds and hashes (enough
# to test password guesses offline) and every request: not even under --debug.
logging.getLogger("kasa").setLevel(logging.INFO)

Dialect = Literal["legacy", "klap", "smart"]
LEGACY_PORT = 9999
KLAP_PORT = 80
INSTALL_HINT = (
    "the kasa path needs python-kasa (Python 3.11 or newer): pip install 'spark-watchdog[kasa]'"
)


def library_missing() -> str | None:
    """Why python-kasa cannot be used here (None: it can)."""
    try:
        import kasa  # noqa: F401
    except ImportError as exc:
        return f"{INSTALL_HINT} ({exc})"
    return None


def load_library() -> None:
    """Import python-kasa and aiohttp now (about 0.4 s): at the controller's start,
    not on its event loop at an incident's first command."""
    import aiohttp  # noqa: F401
    import kasa.httpclient
    import kasa.protocols
    import kasa.transports  # noqa: F401


def default_port(dialect: str) -> int:
    return LEGACY_PORT if dialect == "legacy" else KLAP_PORT


@dataclass
class _Link:
    """One call's python-kasa objects: the transport under a protocol."""

    transport: BaseTransport
    protocol: BaseProtocol
    # Legacy only: set by the transport when a request's bytes are about to leave.
    reached: list[bool]
    # KLAP only: the HTTP session, one TCP connection per request (closed with the link).
    http: Any = None


def _said(exc: BaseException) -> str:
    """A python-kasa failure in words (its messages name the host, never a secret)."""
    return f"{type(exc).__name__}: {excerpt(str(exc) or repr(exc))}"


class KasaOutlet:
    """One outlet of a Kasa or Tapo plug or strip (``outlet`` None: the plug itself)."""

    def __init__(
        self,
        host: str,
        outlet: int | None = None,
        *,
        dialect: Dialect = "legacy",
        port: int | None = None,
        username: Secret | None = None,
        password: Secret | None = None,
        timeout: float = 5.0,
    ) -> None:
        if dialect != "legacy" and (username is None or password is None):
            raise ValueError(f"protocol {dialect} needs the account's e-mail and password")
        self._host = host
        self._port = port or default_port(dialect)
        self.outlet = outlet
        self.dialect = dialect
        self._username = username
        self._password = password
        self._timeout = timeout
        where = f"[{host}]:{self._port}" if ":" in host else f"{host}:{self._port}"
        which = "" if outlet is None else f" outlet {outlet}"
        self._name = f"kasa {dialect} {where}{which}"
        self._key = f"kasa:{where}"
        # A strip outlet's id, read before each command.
        self._child_id: str | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def limiter_key(self) -> str:
        return self._key

    async def read_state(self) -> PowerState:
        link = self._open()
        try:
            await self._handshake(link)
            return await self._read(link)
        finally:
            await _close(link)

    async def command(self, target: PowerState) -> None:
        if target not in (PowerState.ON, PowerState.OFF):
            raise ValueError(f"an outlet switches on or off, not {target.value}")
        link = self._open()
        try:
            await self._handshake(link)
            # Nothing sent yet: the device is what the config says (a plug, or a
            # strip with this outlet: what a strip does with a command naming no
            # outlet is documented nowhere, and python-kasa never sends one), and
            # the outlet's id is known.
            await self._read(link, before_command=True)
            if self.dialect == "legacy":
                # The command on a connection of its own: one the plug closed
                # after the read would turn a command it never got into an
                # unknown outcome. A failure to open this one sent nothing.
                await link.transport.reset()
            request = self._switch_request(target is PowerState.ON)
            answer = await self._send_command(link, request)
        finally:
            await _close(link)
        self._check_switched(answer)

    async def aclose(self) -> None:
        return None  # one link per call, closed by the call

    # -- a link per call ---------------------------------------------------

    def _open(self) -> _Link:
        from kasa import Credentials, DeviceConfig
        from kasa.protocols import IotProtocol, SmartProtocol
        from kasa.transports import KlapTransport, KlapTransportV2

        credentials = None
        if self._username is not None and self._password is not None:
            credentials = Credentials(self._username.reveal(), self._password.reveal())
        config = DeviceConfig(
            host=self._host,
            port_override=self._port,
            # Annotated int; both transports take it as seconds, and a float works.
            timeout=self._timeout,  # type: ignore[arg-type]
            credentials=credentials,
            http_client=None if self.dialect == "legacy" else _fresh_connections(),
        )
        reached: list[bool] = []
        if self.dialect == "legacy":
            transport: BaseTransport = _watched_xor(config, reached, self._name)
            return _Link(transport, IotProtocol(transport=transport), reached)
        if self.dialect == "klap":
            transport = KlapTransport(config=config)
            protocol: BaseProtocol = IotProtocol(transport=transport)
        else:
            transport = KlapTransportV2(config=config)
            protocol = SmartProtocol(transport=transport)
        return _Link(transport, protocol, reached, config.http_client)

    async def _handshake(self, link: _Link) -> None:
        """KLAP's two handshakes, before any query: a failure here sent no command."""
        from kasa.exceptions import AuthenticationError, KasaException
        from kasa.transports import KlapTransport

        if not isinstance(link.transport, KlapTransport):
            return
        try:
            await link.transport.perform_handshake()
        except AuthenticationError:
            raise Refused(
                self.name,
                "the plug refused the credentials (KLAP handshake): check username_file (the "
                "TP-Link account's e-mail) and password_file; nothing was sent",
            ) from None
        except (KasaException, OSError, asyncio.TimeoutError) as exc:
            raise Unreachable(
                self.name, f"the KLAP handshake failed ({_said(exc)}); nothing was sent"
            ) from None

    async def _query(self, link: _Link, request: dict[str, Any]) -> dict[str, Any]:
        """One query, never retried by python-kasa."""
        return await link.protocol.query(request, retry_count=0)

    async def _read(self, link: _Link, *, before_command: bool = False) -> PowerState:
        from kasa.exceptions import AuthenticationError

        unsent = "; nothing was sent" if before_command else ""
        request = _read_request(self.dialect, self.outlet)
        try:
            answer = await self._query(link, request)
        except AuthenticationError:
            raise Refused(
                self.name,
                "the plug refused the credentials: check username_file and password_file" + unsent,
            ) from None
        except Exception as exc:  # a timeout, a reset, an answer that is no JSON
            raise Unreachable(self.name, f"no state read ({_said(exc)}){unsent}") from None
        try:
            state, child_id = _state_in(self.dialect, self.outlet, answer)
        except ValueError as exc:
            raise Refused(self.name, f"{exc}{unsent}") from None
        self._child_id = child_id
        return state

    def _switch_request(self, on: bool) -> dict[str, Any]:
        if self.dialect == "smart":
            params = {"device_on": on}
            if self.outlet is None:
                return {"set_device_info": params}
            inner = {"method": "set_device_info", "params": params}
            return {"control_child": {"device_id": self._child_id, "requestData": inner}}
        request: dict[str, Any] = {"system": {"set_relay_state": {"state": int(on)}}}
        if self.outlet is not None:
            request["context"] = {"child_ids": [self._child_id]}
        return request

    async def _send_command(self, link: _Link, request: dict[str, Any]) -> dict[str, Any]:
        """The command's query: failing before its bytes left, Unreachable; after, Ambiguous."""
        from kasa.exceptions import DeviceError

        link.reached.clear()
        if self.dialect != "legacy":
            # The handshake is done: the request is the next thing to leave.
            send_window.enforce(self.name)
            link.reached.append(True)
        else:
            link.reached.append(False)  # the transport flips it (and asks the window)
        try:
            return await self._query(link, request)
        except PowerError:
            raise
        except Exception as exc:  # a timeout, a reset, an answer that is no JSON
            refused = _window_refusal(exc)
            if refused is not None:
                raise refused from None
            if not link.reached[-1] or _never_connected(exc):
                raise Unreachable(
                    self.name, f"cannot connect ({_said(exc)}); nothing was sent"
                ) from None
            if type(exc) is DeviceError:
                raise Refused(self.name, f"the plug answered with an error: {_said(exc)}") from None
            raise Ambiguous(self.name, f"the command may have been applied: {_said(exc)}") from None

    def _check_switched(self, answer: dict[str, Any]) -> None:
        """The command's answer: an error code says not done; another shape, unknown."""
        code: Any
        if self.dialect == "smart":
            if self.outlet is None:
                if "set_device_info" in answer:
                    return  # python-kasa raised for any error code
                code = None
            else:
                result = answer.get("control_child")
                inner = result.get("responseData") if isinstance(result, dict) else None
                code = inner.get("error_code") if isinstance(inner, dict) else None
        else:
            system = answer.get("system")
            relay = system.get("set_relay_state") if isinstance(system, dict) else None
            code = relay.get("err_code") if isinstance(relay, dict) else None
        if code == 0:
            return
        if isinstance(code, int) and not isinstance(code, bool):
            raise Refused(self.name, f"the plug answered error code {code}: not switched")
        raise Ambiguous(
            self.name,
            f"the command was answered {excerpt(repr(answer))}, without a result code; "
            "it may have been applied",
        )


def _window_refusal(exc: BaseException) -> PowerError | None:
    """The send window's refusal, wrapped by python-kasa's transport on its way out."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, PowerError):
            return seen
        seen = seen.__cause__
    return None


def _fresh_connections() -> Any:
    """An HTTP session for KLAP that opens a TCP connection per request.

    A kept-alive connection the plug closed in between would fail the
    command after it was written: an unknown outcome for a command the plug
    never got. On a new connection, a failure to connect says nothing was sent.
    """
    import aiohttp
    from kasa.httpclient import get_cookie_jar

    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(force_close=True), cookie_jar=get_cookie_jar()
    )


def _never_connected(exc: BaseException) -> bool:
    """The request's TCP connection was never made (aiohttp's connector said so)."""
    import aiohttp

    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, aiohttp.ClientConnectorError):
            return True
        seen = seen.__cause__
    return False


def _watched_xor(config: Any, reached: list[bool], name: str) -> BaseTransport:
    """python-kasa's legacy transport, telling us when a request's bytes are about to leave.

    ``_execute_send`` runs once the TCP connection is open, right before the
    request is written: the send window is asked there, and ``reached`` flips,
    so that a failure before it is known to have sent nothing.
    """
    from kasa.transports import XorTransport

    class _Watched(XorTransport):
        async def _execute_send(self, request: str) -> dict[Any, Any]:
            if reached and not reached[-1]:
                send_window.enforce(name)
                reached[-1] = True
            return await super()._execute_send(request)

    return _Watched(config=config)


async def _close(link: _Link) -> None:
    with contextlib.suppress(Exception):
        await link.protocol.close()
    if link.http is not None:
        with contextlib.suppress(Exception):
            await link.http.close()


def _read_request(dialect: str, outlet: int | None) -> dict[str, Any]:
    if dialect != "smart":
        return {"system": {"get_sysinfo": {}}}
    return {"get_device_info": None} if outlet is None else {"get_child_device_list": None}


def _state_in(dialect: str, outlet: int | None, answer: dict[str, Any]) -> tuple[PowerState, Any]:
    """(state, the outlet's id on a strip) from a read's answer; ValueError for another shape."""
    if dialect == "smart":
        if outlet is None:
            info = answer.get("get_device_info")
            return _on_off(info.get("device_on") if isinstance(info, dict) else None), None
        listing = answer.get("get_child_device_list")
        children = listing.get("child_device_list") if isinstance(listing, dict) else None
        child = _child(children, outlet, "position")
        return _on_off(child.get("device_on")), child.get("device_id")
    system = answer.get("system")
    info = system.get("get_sysinfo") if isinstance(system, dict) else None
    if not isinstance(info, dict):
        raise ValueError(f"get_sysinfo answered {excerpt(repr(answer))}: no sysinfo")
    children = info.get("children")
    if outlet is None:
        if children:
            raise ValueError(
                f"the device is a strip of {len(children)} outlets: set outlet (1 to "
                f"{len(children)})"
            )
        return _on_off(info.get("relay_state")), None
    child = _child(children, outlet, None)
    return _on_off(child.get("state")), child.get("id")


def _child(children: Any, outlet: int, position_key: str | None) -> dict[str, Any]:
    """Outlet ``outlet`` (counted from 1) of a strip's list of children."""
    if not isinstance(children, list) or not children:
        raise ValueError(f"no outlet {outlet}: the device is not a strip (remove outlet)")
    if position_key is not None:
        for child in children:
            if isinstance(child, dict) and child.get(position_key) == outlet:
                return child
    if 1 <= outlet <= len(children) and isinstance(children[outlet - 1], dict):
        return dict(children[outlet - 1])
    raise ValueError(f"no outlet {outlet}: the strip has {len(children)} (1 to {len(children)})")


def _on_off(value: Any) -> PowerState:
    if value is True or value == 1:
        return PowerState.ON
    if value is False or value == 0:
        return PowerState.OFF
    raise ValueError(f"the relay reads {excerpt(repr(value))}: expected on or off")


def build_kasa_backend(device: KasaDevice, secrets: Mapping[str, Secret]) -> KasaOutlet:
    """The backend of one ``type: kasa`` path; credentials: ``username_file``, ``password_file``."""
    missing = library_missing()
    if missing is not None:
        raise ConfigError(device.host, [f"type: {missing}"])
    username, password = secrets.get("username_file"), secrets.get("password_file")
    if device.protocol != "legacy" and (username is None or password is None):
        raise ConfigError(device.host, ["password_file: the Kasa credentials were not read"])
    return KasaOutlet(
        device.host,
        device.outlet,
        dialect=device.protocol,
        port=device.port,
        username=username,
        password=password,
        timeout=device.timeout,
    )
