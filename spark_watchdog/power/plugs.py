"""Smart plugs as power backends: Shelly Gen2+ (RPC over HTTP) and Tasmota (``/cm``).

Both speak plain HTTP GET on the LAN. A plug is the crudest power path: it
cuts the wall socket, so it works on any frozen host, and it is only as good
as what it switches (both supplies of a node, or none). Plugs also differ in
what they do after their *own* power loss (Shelly ``initial_state``, Tasmota
``PowerOnState``): check that before relying on one (docs/facts.md, "Smart plugs").

Shelly Gen2+ (shelly-api-docs.shelly.cloud, gen2 Switch component and
Authentication): ``GET /rpc/Switch.GetStatus?id=N`` answers
``{"id": N, "output": true, ...}``; ``GET /rpc/Switch.Set?id=N&on=false``
answers ``{"was_on": true}``. Errors come as ``{"code": -105, "message": ...}``
(sometimes inside ``"error"``) with a non-2xx status. With authentication on,
the device answers 401 with an RFC 7616 SHA-256 digest challenge; the user
name is always ``admin``.

Tasmota (tasmota.github.io/docs/Commands): ``GET /cm?cmnd=Power1`` answers
``{"POWER1": "ON"}``, or ``{"POWER": "ON"}`` on a device with one relay
(unless SetOption26 is set); ``cmnd=Power1 Off`` switches and answers the
new state. An unknown command (or a relay it does not have) answers
``{"Command": "Unknown"}``. With a web password set, the credentials go in
the query string (``user=`` and ``password=``): see ``TasmotaPlug``.

Both can switch themselves back on after an off (``SelfTimingBackend``), so
a controller that dies during a cycle's hold does not leave the node dark:
Shelly's ``Switch.Set`` takes ``toggle_after`` (seconds until the switch
flips back), and Tasmota runs ``Backlog Power1 Off;Delay N;Power1 On``
itself, ``Delay`` in tenths of a second up to 3600
(docs/facts.md, "Devices that time their own cycle").
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlencode, urlsplit, urlunsplit

import requests
from requests.auth import HTTPDigestAuth

from spark_watchdog.config.controller import ShellyDevice, TasmotaDevice
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import Ambiguous, ConfigError, PowerError, Refused, Unreachable
from spark_watchdog.power import send_window
from spark_watchdog.power._http import (
    drop_idle_connections,
    excerpt,
    json_body,
    new_session,
    transport_error,
)
from spark_watchdog.power.base import TIMED_ON_MARGIN_S, PowerState, TimedOn

log = logging.getLogger("spark_watchdog.power.plugs")

# Shelly Gen2+ digest authentication has one user, always "admin" (Shelly
# API docs, gen2 General/Authentication).
SHELLY_USER = "admin"
# Tasmota's web user is "admin" unless the firmware was built otherwise.
TASMOTA_USER = "admin"
# Tasmota's PowerOnState values (tasmota.github.io/docs/Commands), as words.
TASMOTA_POWER_ON = {
    0: "off",
    1: "on",
    2: "toggle",
    3: "restore_last",
    4: "on_locked",  # on, and the relay no longer obeys commands
    5: "pulse_time",  # on after PulseTime, then off
}
# Tasmota's Delay (tasmota.github.io/docs/Commands): tenths of a second, at most 3600.
TASMOTA_MAX_DELAY_DS = 3600


def timed_on_after(off_seconds: float) -> float | None:
    """When a plug's own on is armed for an off of ``off_seconds``: whole seconds, with margin."""
    if off_seconds < 1:
        return None
    return math.ceil(off_seconds) + TIMED_ON_MARGIN_S


def base_url(url: str) -> tuple[str, str]:
    """``scheme://host:port`` (no user info, no path) and ``host:port`` for keys."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f'expected an http(s)://host[:port] URL, got "{url}"')
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return urlunsplit((parts.scheme, f"{host}:{port}", "", "", "")), f"{host}:{port}"


class HttpPlug:
    """The HTTP plumbing every plug shares: a session, a timeout on every request, error mapping."""

    def __init__(self, label: str, key: str, timeout: float) -> None:
        self._label = label
        self._key = key
        self._timeout = timeout
        self._session = new_session()

    @property
    def name(self) -> str:
        return self._label

    @property
    def limiter_key(self) -> str:
        return self._key

    async def _fetch(self, url: str, *, command: bool) -> requests.Response:
        """GET ``url``; transport failures mapped (Unreachable / Ambiguous). Never logs the URL."""
        if command:
            drop_idle_connections(self._session)

        def get() -> requests.Response:
            if command:
                # In the worker thread, right before the request: the send
                # window once more (power/send_window.py).
                send_window.enforce(self.name)
            return self._session.get(
                url,
                timeout=self._timeout,
                # A redirected command is not followed: whatever answers
                # there is not the plug we were configured to switch.
                allow_redirects=not command,
            )

        try:
            return await asyncio.to_thread(get)
        except requests.RequestException as exc:
            # from None: the chained exception would carry the URL (and, for
            # Tasmota, the password) into any traceback that gets logged.
            raise transport_error(self.name, exc, command=command, timeout=self._timeout) from None

    def _credentials_refused(self, status: int, detail: str, *, have_password: bool) -> Refused:
        if have_password:
            return Refused(
                self.name,
                f"credentials rejected (HTTP {status}{detail}): check password_file and user",
            )
        return Refused(
            self.name,
            f"the plug requires a password (HTTP {status}{detail}): set password_file",
        )

    async def aclose(self) -> None:
        self._session.close()


def shelly_rpc_error(body: Any) -> tuple[int, str] | None:
    """``(code, message)`` of a Shelly RPC error answer, bare or inside ``"error"``."""
    error = body.get("error") if isinstance(body, dict) else None
    candidate = error if isinstance(error, dict) else body
    if isinstance(candidate, dict):
        code, message = candidate.get("code"), candidate.get("message")
        if isinstance(code, int) and not isinstance(code, bool):
            return code, message if isinstance(message, str) else ""
    return None


class ShellyPlug(HttpPlug):
    """One switch (relay) of a Shelly Gen2+ device."""

    def __init__(
        self,
        url: str,
        switch_id: int = 0,
        *,
        password: Secret | None = None,
        user: str = SHELLY_USER,
        timeout: float = 5.0,
    ) -> None:
        base, key = base_url(url)
        super().__init__(f"shelly {base} switch {switch_id}", f"shelly:{key}", timeout)
        self._base = base
        self.switch_id = switch_id
        self._has_password = password is not None
        if password is not None:
            # Sent only after the device's 401 challenge; the digest never
            # carries the password itself.
            self._session.auth = HTTPDigestAuth(user, password.reveal())

    async def read_state(self) -> PowerState:
        method = "Switch.GetStatus"
        response = await self._fetch(
            f"{self._base}/rpc/{method}?id={self.switch_id}", command=False
        )
        body = self._check(response, method, command=False)
        output = body.get("output")
        if not isinstance(output, bool):
            raise Refused(
                self.name,
                f'{method} answered {excerpt(response.text)!r}: expected {{"output": true|false}}',
            )
        return PowerState.ON if output else PowerState.OFF

    async def command(self, target: PowerState) -> None:
        if target not in (PowerState.ON, PowerState.OFF):
            raise ValueError(f"a plug switches on or off, not {target.value}")
        await self._switch_set("true" if target is PowerState.ON else "false")

    async def plan_timed_on(self, off_seconds: float) -> TimedOn:
        on_after = timed_on_after(off_seconds)
        if on_after is None:
            return TimedOn(None, f"an off of {off_seconds:g}s is too short to time")
        return TimedOn(on_after, "Shelly Switch.Set toggle_after")

    async def command_timed_off(self, on_after_s: float) -> None:
        await self._switch_set("false", f"&toggle_after={on_after_s:.0f}")

    async def _switch_set(self, on: str, extra: str = "") -> None:
        method = "Switch.Set"
        response = await self._fetch(
            f"{self._base}/rpc/{method}?id={self.switch_id}&on={on}{extra}", command=True
        )
        body = self._check(response, method, command=True)
        if not isinstance(body.get("was_on"), bool):
            # Not the documented {"was_on": bool}: whatever answered, it may have switched.
            raise Ambiguous(
                self.name,
                f"{method} answered {excerpt(response.text)!r}, expected "
                '{"was_on": true|false}; it may have been applied',
            )

    async def read_power_on(self) -> str:
        """What the switch does after the plug's own power loss (``initial_state``:
        off, on, restore_last, match_input)."""
        method = "Switch.GetConfig"
        response = await self._fetch(
            f"{self._base}/rpc/{method}?id={self.switch_id}", command=False
        )
        value = self._check(response, method, command=False).get("initial_state")
        if not isinstance(value, str):
            raise Refused(self.name, f"{method} answered without an initial_state string")
        return value

    def _check(self, response: requests.Response, method: str, *, command: bool) -> dict[str, Any]:
        """The JSON object of a successful answer, or the right error."""
        status = response.status_code
        body = json_body(response)
        rpc_error = shelly_rpc_error(body)
        if status in (401, 403):
            raise self._credentials_refused(status, "", have_password=self._has_password)
        if rpc_error is not None:
            # The RPC layer answered with an error: the method did not run.
            code, message = rpc_error
            raise Refused(self.name, f'{method} failed: code {code}: "{excerpt(message)}"')
        if status == 200:
            if isinstance(body, dict):
                return body
            if command:
                raise Ambiguous(
                    self.name,
                    f"{method} answered 200 with {excerpt(response.text)!r} (not JSON); "
                    "it may have been applied",
                )
            raise Refused(
                self.name, f"{method} answered {excerpt(response.text)!r}: expected a JSON object"
            )
        raise status_error(self.name, method, status, excerpt(response.text), command=command)


class TasmotaPlug(HttpPlug):
    """One relay of a Tasmota device (``Power<relay>``).

    Tasmota's own HTTP protocol takes the web password as ``user=`` and
    ``password=`` query parameters (tasmota.github.io/docs/Commands, "with
    password"); it has no header-based alternative for ``/cm``. So the URL
    carries the password: it is built here, used, and never logged or put
    in an error message (urllib3's DEBUG request line is redacted by
    ``power._http``). On plain HTTP it still crosses the LAN in clear text:
    keep such plugs on a management network.
    """

    def __init__(
        self,
        url: str,
        relay: int = 1,
        *,
        password: Secret | None = None,
        user: str = TASMOTA_USER,
        timeout: float = 5.0,
    ) -> None:
        if relay < 1:
            raise ValueError(f"Tasmota relays count from 1, got {relay}")
        base, key = base_url(url)
        super().__init__(f"tasmota {base} relay {relay}", f"tasmota:{key}", timeout)
        self._base = base
        self.relay = relay
        self._user = user
        self._password = password

    def _url(self, cmnd: str) -> str:
        query: list[tuple[str, str]] = []
        if self._password is not None:
            query += [("user", self._user), ("password", self._password.reveal())]
        query.append(("cmnd", cmnd))
        # Percent-encode everything: '&', '#' or '%' in a password otherwise
        # break the query (Arksine/moonraker#393); spaces as %20, as the docs show.
        return f"{self._base}/cm?{urlencode(query, quote_via=quote, safe='')}"

    async def read_state(self) -> PowerState:
        cmnd = f"Power{self.relay}"
        response = await self._fetch(self._url(cmnd), command=False)
        body = self._check(response, cmnd, command=False)
        state = self._state_in(body, cmnd)
        if state is None:
            raise Refused(
                self.name,
                f'{cmnd} answered {excerpt(response.text)!r}: expected {{"POWER{self.relay}": '
                '"ON"|"OFF"}',
            )
        return state

    async def command(self, target: PowerState) -> None:
        if target not in (PowerState.ON, PowerState.OFF):
            raise ValueError(f"a plug switches on or off, not {target.value}")
        cmnd = f"Power{self.relay} {'On' if target is PowerState.ON else 'Off'}"
        response = await self._fetch(self._url(cmnd), command=True)
        body = self._check(response, cmnd, command=True)
        try:
            state = self._state_in(body, cmnd)
        except Refused as exc:
            # Sent and answered with something odd: it may still have switched.
            raise Ambiguous(self.name, f"{exc.message}; it may have been applied") from None
        if state is None:
            raise Ambiguous(
                self.name,
                f"{cmnd} answered {excerpt(response.text)!r}; it may have been applied",
            )
        if state is not target:
            log.warning("%s: %s answered %s; the read-back decides", self.name, cmnd, state.value)

    async def plan_timed_on(self, off_seconds: float) -> TimedOn:
        on_after = timed_on_after(off_seconds)
        if on_after is None:
            return TimedOn(None, f"an off of {off_seconds:g}s is too short to time")
        if on_after * 10 > TASMOTA_MAX_DELAY_DS:
            return TimedOn(
                None,
                f"Tasmota's Delay tops out at {TASMOTA_MAX_DELAY_DS / 10:g}s, the off is longer",
            )
        return TimedOn(on_after, "Tasmota Backlog Power Off;Delay;Power On")

    async def command_timed_off(self, on_after_s: float) -> None:
        relay = f"Power{self.relay}"
        cmnd = f"Backlog {relay} Off;Delay {round(on_after_s * 10)};{relay} On"
        response = await self._fetch(self._url(cmnd), command=True)
        # A backlog is queued and answered before its commands run, with an
        # empty result (Tasmota's CmndBacklog clears the response): the
        # read-back decides what happened.
        if response.status_code == 200 and response.text.strip() in ("", "{}"):
            return
        self._check(response, "Backlog", command=True)

    async def read_power_on(self) -> str:
        """``PowerOnState`` as a word: what the relay does after the plug's own power loss."""
        response = await self._fetch(self._url("PowerOnState"), command=False)
        value = self._check(response, "PowerOnState", command=False).get("PowerOnState")
        if isinstance(value, bool) or not isinstance(value, int) or value not in TASMOTA_POWER_ON:
            raise Refused(self.name, f"PowerOnState answered {value!r}: expected 0 to 5")
        return TASMOTA_POWER_ON[value]

    def _state_in(self, body: dict[str, Any], cmnd: str) -> PowerState | None:
        # One relay: Tasmota says "POWER" for Power1 unless SetOption26 is on.
        keys = [f"POWER{self.relay}"] + (["POWER"] if self.relay == 1 else [])
        for key in keys:
            if key in body:
                value = body[key]
                word = value.upper() if isinstance(value, str) else None
                if word == "ON":
                    return PowerState.ON
                if word == "OFF":
                    return PowerState.OFF
                raise Refused(
                    self.name,
                    f"{cmnd} answered {key}={value!r}: expected ON or OFF "
                    "(custom StateText1/StateText2 are not supported)",
                )
        return None

    def _check(self, response: requests.Response, cmnd: str, *, command: bool) -> dict[str, Any]:
        status = response.status_code
        body = json_body(response)
        warning = body.get("WARNING") if isinstance(body, dict) else None
        if warning is not None:
            said = excerpt(str(warning))
            # "Need user=<username>&password=<password>" (localized, but the
            # parameter names stay): a wrong or missing password. Newer
            # firmware says 401, older said 200 (arendst/Tasmota#8170).
            if "user=" in said and "password=" in said:
                raise self._credentials_refused(
                    status, f', "{said}"', have_password=self._password is not None
                )
            if command:
                # Old firmware answers "Enable weblog 2 if response expected"
                # *after* running the command: no state, but it may have switched.
                raise Ambiguous(
                    self.name, f'{cmnd} answered WARNING "{said}"; it may have been applied'
                )
            raise Refused(self.name, f'{cmnd} answered WARNING "{said}"')
        if status in (401, 403):
            raise self._credentials_refused(status, "", have_password=self._password is not None)
        if isinstance(body, dict) and "Command" in body:
            said = body["Command"]
            hint = f": the plug has no relay {self.relay}?" if said == "Unknown" else ""
            raise Refused(self.name, f'{cmnd} answered Command "{excerpt(str(said))}"{hint}')
        if status == 200:
            if isinstance(body, dict):
                return body
            if command:
                raise Ambiguous(
                    self.name,
                    f"{cmnd} answered 200 with {excerpt(response.text)!r} (not JSON); "
                    "it may have been applied",
                )
            raise Refused(
                self.name, f"{cmnd} answered {excerpt(response.text)!r}: expected a JSON object"
            )
        raise status_error(self.name, cmnd, status, excerpt(response.text), command=command)


def status_error(name: str, what: str, status: int, text: str, *, command: bool) -> PowerError:
    """Any other HTTP status: 4xx the device said no, 5xx it failed (and may have acted)."""
    if 300 <= status < 400:
        return Refused(name, f"{what} redirected (HTTP {status}); not followed")
    if 400 <= status < 500:
        return Refused(name, f"{what} refused (HTTP {status}): {text!r}")
    if command:
        return Ambiguous(name, f"{what} answered HTTP {status}: {text!r}; it may have been applied")
    return Unreachable(name, f"{what} answered HTTP {status}: {text!r}")


def _password(secrets: Mapping[str, Secret], device: ShellyDevice | TasmotaDevice) -> Secret | None:
    password = secrets.get("password_file")
    if device.password_file is not None and password is None:
        raise ConfigError(device.url, [f"password_file: the {device.type} password was not read"])
    return password


def build_shelly_backend(device: ShellyDevice, secrets: Mapping[str, Secret]) -> ShellyPlug:
    """The backend of one ``type: shelly`` device; password: ``secrets["password_file"]``."""
    if device.user not in (None, SHELLY_USER):
        log.warning(
            "shelly %s: user %r ignored: Shelly Gen2+ digest auth always uses %r",
            device.url,
            device.user,
            SHELLY_USER,
        )
    return ShellyPlug(
        device.url,
        device.switch_id,
        password=_password(secrets, device),
        timeout=device.timeout,
    )


def build_tasmota_backend(device: TasmotaDevice, secrets: Mapping[str, Secret]) -> TasmotaPlug:
    """The backend of one ``type: tasmota`` device; password: ``secrets["password_file"]``."""
    return TasmotaPlug(
        device.url,
        device.switch_id,
        password=_password(secrets, device),
        user=device.user or TASMOTA_USER,
        timeout=device.timeout,
    )
