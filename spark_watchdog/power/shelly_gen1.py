"""Shelly Gen1 plugs and relays (Shelly Plug S, Shelly 1, 1PM, 2.5...) over their HTTP API.

Gen1 firmware predates the Gen2+ RPC (power/plugs.py's ``ShellyPlug``) and
speaks plain REST (shelly-api-docs.shelly.cloud, gen1 "Shelly Plug/PlugS"
and "Shelly1/1PM", ``/relay/{index}``):

- ``GET /relay/N`` answers ``{"ison": true, "has_timer": false, ...}``;
- ``GET /relay/N?turn=off`` switches and answers the same object with the
  new state; ``&timer=S`` adds a one-shot flip-back timer of S seconds
  (the relay switches back on by itself: ``SelfTimingBackend``);
- ``GET /settings/relay/N`` holds ``default_state`` (off, on, last,
  switch): what the relay does after the plug's own power loss;
- with a login set (``/settings/login``), every call needs HTTP Basic
  auth, user ``admin`` unless changed; a missing or wrong one is 401.

Basic auth sends the password base64-encoded with every request: on plain
HTTP it crosses the LAN in clear text. Keep such plugs on a management
network (docs/power.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests
from requests.auth import HTTPBasicAuth

from spark_watchdog.config.controller import ShellyGen1Device
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import Ambiguous, ConfigError, Refused
from spark_watchdog.power._http import excerpt, json_body
from spark_watchdog.power.base import PowerState, TimedOn
from spark_watchdog.power.plugs import HttpPlug, base_url, status_error, timed_on_after

# Shelly Gen1's web login is "admin" unless the operator changed it.
SHELLY_GEN1_USER = "admin"
# Gen1's relay default_state, in the words doctor judges (power_check.judge_power_on).
DEFAULT_STATES = {"off": "off", "on": "on", "last": "restore_last", "switch": "match_input"}


class ShellyGen1Plug(HttpPlug):
    """One relay of a Shelly Gen1 device (``/relay/<relay>``)."""

    def __init__(
        self,
        url: str,
        relay: int = 0,
        *,
        password: Secret | None = None,
        user: str = SHELLY_GEN1_USER,
        timeout: float = 5.0,
    ) -> None:
        if relay < 0:
            raise ValueError(f"Shelly relays count from 0, got {relay}")
        base, key = base_url(url)
        super().__init__(f"shelly_gen1 {base} relay {relay}", f"shelly_gen1:{key}", timeout)
        self._base = base
        self.relay = relay
        self._has_password = password is not None
        if password is not None:
            self._session.auth = HTTPBasicAuth(user, password.reveal())

    async def read_state(self) -> PowerState:
        what = f"/relay/{self.relay}"
        response = await self._fetch(f"{self._base}{what}", command=False)
        body = self._check(response, what, command=False)
        return self._state_in(body, response, what)

    async def command(self, target: PowerState) -> None:
        if target not in (PowerState.ON, PowerState.OFF):
            raise ValueError(f"a plug switches on or off, not {target.value}")
        await self._turn(target, "")

    async def plan_timed_on(self, off_seconds: float) -> TimedOn:
        on_after = timed_on_after(off_seconds)
        if on_after is None:
            return TimedOn(None, f"an off of {off_seconds:g}s is too short to time")
        return TimedOn(on_after, "Shelly Gen1 relay timer")

    async def command_timed_off(self, on_after_s: float) -> None:
        await self._turn(PowerState.OFF, f"&timer={on_after_s:.0f}")

    async def read_power_on(self) -> str:
        """What the relay does after the plug's own power loss (``default_state``), as a word."""
        what = f"/settings/relay/{self.relay}"
        response = await self._fetch(f"{self._base}{what}", command=False)
        value = self._check(response, what, command=False).get("default_state")
        if not isinstance(value, str) or value not in DEFAULT_STATES:
            raise Refused(
                self.name,
                f"{what} answered default_state {value!r}: expected off, on, last or switch",
            )
        return DEFAULT_STATES[value]

    async def _turn(self, target: PowerState, extra: str) -> None:
        what = f"/relay/{self.relay}?turn={target.value}"
        response = await self._fetch(f"{self._base}{what}{extra}", command=True)
        body = self._check(response, what, command=True)
        try:
            state = self._state_in(body, response, what)
        except Refused as exc:
            # Sent and answered with something odd: it may still have switched.
            raise Ambiguous(self.name, f"{exc.message}; it may have been applied") from None
        if state is not target:
            # The plug says it did something else than asked (a welded relay,
            # firmware that lies): what happened is not known, so not retried.
            said = "true" if state is PowerState.ON else "false"
            raise Ambiguous(
                self.name, f'{what} answered "ison": {said}; the relay may not have followed'
            )

    def _state_in(self, body: dict[str, Any], response: requests.Response, what: str) -> PowerState:
        ison = body.get("ison")
        if not isinstance(ison, bool):
            raise Refused(
                self.name,
                f'{what} answered {excerpt(response.text)!r}: expected {{"ison": true|false}}',
            )
        return PowerState.ON if ison else PowerState.OFF

    def _check(self, response: requests.Response, what: str, *, command: bool) -> dict[str, Any]:
        """The JSON object of a successful answer, or the right error."""
        status = response.status_code
        if status in (401, 403):
            raise self._credentials_refused(status, "", have_password=self._has_password)
        if status == 404 and "relay" in response.text.lower():
            raise Refused(
                self.name, f"{what} answered {excerpt(response.text)!r}: no relay {self.relay}?"
            )
        if status == 200:
            body = json_body(response)
            if isinstance(body, dict):
                return body
            if command:
                raise Ambiguous(
                    self.name,
                    f"{what} answered 200 with {excerpt(response.text)!r} (not JSON); "
                    "it may have been applied",
                )
            raise Refused(
                self.name, f"{what} answered {excerpt(response.text)!r}: expected a JSON object"
            )
        raise status_error(self.name, what, status, excerpt(response.text), command=command)


def build_shelly_gen1_backend(
    device: ShellyGen1Device, secrets: Mapping[str, Secret]
) -> ShellyGen1Plug:
    """The backend of one ``type: shelly_gen1`` device; password: ``secrets["password_file"]``."""
    password = secrets.get("password_file")
    if device.password_file is not None and password is None:
        raise ConfigError(device.url, ["password_file: the shelly_gen1 password was not read"])
    return ShellyGen1Plug(
        device.url,
        device.switch_id,
        password=password,
        user=device.user or SHELLY_GEN1_USER,
        timeout=device.timeout,
    )
