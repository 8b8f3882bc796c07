"""Any Home Assistant ``switch`` entity as a power path, through HA's REST API.

Home Assistant's REST API (developers.home-assistant.io, "REST API"), with a
long-lived access token as ``Authorization: Bearer``:

- ``GET /api/states/<entity_id>`` answers the entity's ``state`` with its
  ``last_changed`` (when the state last changed) by Home Assistant's clock;
- ``POST /api/services/switch/turn_off`` (``turn_on``) with
  ``{"entity_id": ...}`` asks the integration behind the entity to switch.

Home Assistant stands between the controller and the plug, and its state can
lag the device (or run ahead of it, for an integration that assumes). So:

- a read-back after a command counts only when the entity's state *changed
  after the command was sent*: its ``last_changed`` later than the one Home
  Assistant showed at the last read before the command. Both are Home
  Assistant's clock: the controller's own may differ from it;
- ``unavailable`` and ``unknown`` say Home Assistant cannot see the device:
  before a command, the path cannot be read (``Unreachable``); after one,
  the outcome is unknown (``Ambiguous``), never taken as off.

The token comes from ``token_file`` and is sent in a header only: never in a
URL, a log line or an error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import requests

from spark_watchdog.config.controller import HomeAssistantDevice
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import Ambiguous, ConfigError, Refused, Unreachable
from spark_watchdog.power import send_window
from spark_watchdog.power._http import (
    drop_idle_connections,
    excerpt,
    json_body,
    new_session,
    transport_error,
)
from spark_watchdog.power.base import PowerState
from spark_watchdog.power.plugs import base_url, status_error

UNSEEN = ("unavailable", "unknown")


class HomeAssistantSwitch:
    """One ``switch`` entity of one Home Assistant."""

    def __init__(self, url: str, entity_id: str, token: Secret, *, timeout: float = 5.0) -> None:
        base, key = base_url(url)
        self._base = base
        self.entity_id = entity_id
        self._token = token
        self._timeout = timeout
        self._name = f"home_assistant {base} {entity_id}"
        self._key = f"home_assistant:{key}:{entity_id}"
        self._session = new_session()
        # The entity's last_changed at the last read (Home Assistant's clock).
        self._seen_changed: datetime | None = None
        # After a command: (its target, the last_changed seen before it was sent).
        self._pending: tuple[PowerState, datetime | None] | None = None

    @property
    def name(self) -> str:
        return self._name

    @property
    def limiter_key(self) -> str:
        return self._key

    async def read_state(self) -> PowerState:
        what = f"GET /api/states/{self.entity_id}"
        response = await self._request("GET", f"/api/states/{self.entity_id}", command=False)
        body = self._check(response, what, command=False)
        state, changed = self._parse(body, response, what)
        pending = self._pending
        if state in UNSEEN:
            if pending is not None:
                raise Ambiguous(
                    self.name,
                    f"reads {state} after the {pending[0].value} command: Home Assistant cannot "
                    "see the device, so whether it switched is unknown",
                )
            raise Unreachable(self.name, f"reads {state}: Home Assistant cannot see the device")
        power = PowerState.ON if state == "on" else PowerState.OFF
        if pending is not None and power is pending[0]:
            before = pending[1]
            if before is not None and not changed > before:
                # The commanded state, but from before the command (a restored
                # or assumed state): not a read-back yet.
                raise Unreachable(
                    self.name,
                    f"reads {state}, but its state last changed at {changed.isoformat()}, not "
                    "after the command was sent: Home Assistant has not heard from the device",
                )
            self._pending = None
        self._seen_changed = changed
        return power

    async def command(self, target: PowerState) -> None:
        if target not in (PowerState.ON, PowerState.OFF):
            raise ValueError(f"a switch turns on or off, not {target.value}")
        service = f"turn_{target.value}"
        what = f"POST /api/services/switch/{service}"
        self._pending = (target, self._seen_changed)
        response = await self._request(
            "POST",
            f"/api/services/switch/{service}",
            command=True,
            json={"entity_id": self.entity_id},
        )
        body = self._check(response, what, command=True)
        if not isinstance(body, list):
            raise Ambiguous(
                self.name,
                f"{what} answered {excerpt(response.text)!r}, expected the list of changed "
                "states; it may have been applied",
            )

    async def aclose(self) -> None:
        self._session.close()

    # -- internals ----------------------------------------------------------

    async def _request(
        self, method: str, path: str, *, command: bool, json: Any = None
    ) -> requests.Response:
        if command:
            drop_idle_connections(self._session)
        headers = {"Authorization": f"Bearer {self._token.reveal()}"}

        def send() -> requests.Response:
            if command:
                send_window.enforce(self.name)  # right before the request (send_window.py)
            return self._session.request(
                method,
                f"{self._base}{path}",
                headers=headers,
                json=json,
                timeout=self._timeout,
                allow_redirects=False,
            )

        try:
            return await asyncio.to_thread(send)
        except requests.RequestException as exc:
            raise transport_error(self.name, exc, command=command, timeout=self._timeout) from None

    def _check(self, response: requests.Response, what: str, *, command: bool) -> Any:
        status = response.status_code
        if status in (401, 403):
            raise Refused(
                self.name,
                f"the token was refused (HTTP {status}): check token_file (a long-lived access "
                "token from the Home Assistant user's profile)",
            )
        if status == 404 and not command:
            raise Refused(
                self.name,
                f"{what}: Home Assistant has no entity {self.entity_id} (HTTP 404): check "
                "entity_id under Settings, Entities",
            )
        if status == 200:
            body = json_body(response)
            if body is not None:
                return body
            if command:
                raise Ambiguous(
                    self.name,
                    f"{what} answered 200 with {excerpt(response.text)!r} (not JSON); "
                    "it may have been applied",
                )
            raise Refused(self.name, f"{what} answered {excerpt(response.text)!r}: not JSON")
        raise status_error(self.name, what, status, excerpt(response.text), command=command)

    def _parse(self, body: Any, response: requests.Response, what: str) -> tuple[str, datetime]:
        state = body.get("state") if isinstance(body, dict) else None
        changed = _timestamp(body.get("last_changed")) if isinstance(body, dict) else None
        if (
            not isinstance(body, dict)
            or body.get("entity_id") != self.entity_id
            or state not in ("on", "off", *UNSEEN)
            or changed is None
        ):
            raise Refused(
                self.name,
                f"{what} answered {excerpt(response.text)!r}: expected the entity's state "
                '("on", "off", "unavailable" or "unknown") and its last_changed',
            )
        return str(state), changed


def _timestamp(value: Any) -> datetime | None:
    """An ISO 8601 time with its offset (Home Assistant writes +00:00), or None."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def build_home_assistant_backend(
    device: HomeAssistantDevice, secrets: Mapping[str, Secret]
) -> HomeAssistantSwitch:
    """The backend of one ``type: home_assistant`` path; token: ``secrets["token_file"]``."""
    token = secrets.get("token_file")
    if token is None:
        raise ConfigError(device.url, ["token_file: the Home Assistant token was not read"])
    return HomeAssistantSwitch(device.url, device.entity_id, token, timeout=device.timeout)
