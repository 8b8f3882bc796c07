"""A Redfish ComputerSystem as a power backend (DMTF DSP0266, over HTTPS).

Discovery walks from the service root: ``/redfish/v1/`` → ``Systems`` →
the configured member (or the only one). The state is the system's
``PowerState``; a command POSTs ``#ComputerSystem.Reset`` to the ``target``
the system advertises, with a ``ResetType`` picked from what it says it
allows (``ResetType@Redfish.AllowableValues``, or its ``@Redfish.ActionInfo``),
as openstack/sushy does before acting.

Only ForceOff switches off: the host we power-cycle is frozen, and a frozen
host ignores GracefulShutdown (an ACPI request to the OS). Worse, a graceful
shutdown the BMC keeps pending can fire later, on a host that has recovered.
A BMC that does not offer ForceOff gets a clear refusal instead; configure
another power path for it.

Transitions (``PoweringOn`` / ``PoweringOff``) read as ``MIXED``: neither on
nor off, so VerifiedPower keeps polling and never takes one for "already
there".

Basic auth on every request (no Redfish session: one fewer thing to expire
on a BMC that is itself in trouble). TLS is verified unless the config says
``verify_tls: false``.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

import requests
import urllib3.exceptions

from spark_watchdog.config.controller import RedfishDevice
from spark_watchdog.config.secrets import Secret
from spark_watchdog.errors import Ambiguous, ConfigError, PowerError, Refused, Unreachable
from spark_watchdog.power._http import (
    drop_idle_connections,
    excerpt,
    json_body,
    new_session,
    transport_error,
)
from spark_watchdog.power.base import PowerState

log = logging.getLogger("spark_watchdog.power.redfish")

# Resource.PowerState (DSP8010). Paused: powered, execution suspended: on.
_POWER_STATES = {
    "On": PowerState.ON,
    "Off": PowerState.OFF,
    "PoweringOn": PowerState.MIXED,
    "PoweringOff": PowerState.MIXED,
    "Paused": PowerState.ON,
}

# The ResetType values of ComputerSystem.Reset (Resource.ResetType, DSP8010):
# what a service that omits the allowable values is assumed to accept (sushy
# makes the same assumption, and logs it).
STANDARD_RESET_TYPES = (
    "On",
    "ForceOff",
    "GracefulShutdown",
    "GracefulRestart",
    "ForceRestart",
    "Nmi",
    "ForceOn",
    "PushPowerButton",
    "PowerCycle",
    "Suspend",
    "Pause",
    "Resume",
)

# Preference order per target. Off is ForceOff only (see the module docstring).
_RESET_FOR = {
    PowerState.OFF: ("ForceOff",),
    PowerState.ON: ("On", "ForceOn"),
}

_ACCEPTED = (200, 202, 204)


def choose_reset_type(target: PowerState, allowed: Sequence[str] | None) -> str:
    """The ResetType that brings a system to ``target``; Refused-worthy ValueError if none.

    ``allowed`` None means the service did not say: the standard types are assumed.
    """
    candidates = _RESET_FOR.get(target)
    if candidates is None:
        raise ValueError(f"cannot switch a system to {target.value}")
    offered = STANDARD_RESET_TYPES if allowed is None else tuple(allowed)
    for reset_type in candidates:
        if reset_type in offered:
            return reset_type
    offered_text = ", ".join(offered) or "none"
    if target is PowerState.OFF:
        raise ValueError(
            f"the system does not offer ForceOff (it allows: {offered_text}); "
            "GracefulShutdown cannot stop a frozen host and may fire later on a recovered "
            "one, so it is not used: configure another power path for this node"
        )
    raise ValueError(f"the system offers neither On nor ForceOn (it allows: {offered_text})")


def redfish_error_message(body: Any, text: str) -> str:
    """The service's own words from a Redfish error body, quoted; else an excerpt of the text."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        error = body["error"]
        parts: list[str] = []
        infos = error.get("@Message.ExtendedInfo")
        if isinstance(infos, list):
            for info in infos:
                if not isinstance(info, dict):
                    continue
                words = info.get("Message") or info.get("MessageId")
                if isinstance(words, str) and words and words not in parts:
                    parts.append(words)
        main = error.get("message")
        if isinstance(main, str) and main and main not in parts:
            parts.insert(0, main)
        if parts:
            return "; ".join(f'"{excerpt(p)}"' for p in parts)
    shown = excerpt(text)
    return f'"{shown}"' if shown else "no message"


@dataclass(frozen=True)
class ResetAction:
    """Where and how to reset one system, as it advertised itself."""

    target: str
    allowed: tuple[str, ...] | None


class RedfishSystem:
    """One ComputerSystem behind a BMC's Redfish service."""

    def __init__(
        self,
        url: str,
        user: str,
        password: Secret,
        *,
        system: str | None = None,
        ca_file: str | None = None,
        verify_tls: bool = True,
        timeout: float = 10.0,
        conflict_retries: int = 3,
        conflict_delay: float = 2.0,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f'expected an http(s)://host[:port] URL, got "{url}"')
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        # Drop any user:password@ from the URL: credentials go in the header only.
        self._base = urlunsplit((parts.scheme, f"{host}:{port}", "", "", ""))
        self._system_wanted = system
        self._timeout = timeout
        self._conflict_retries = conflict_retries
        self._conflict_delay = conflict_delay
        self._label = f"redfish {self._base}" + (f" system {system}" if system else "")
        self._key = f"redfish:{host}:{port}"
        self._system_path: str | None = None
        self._session = new_session()
        self._session.auth = (user, password.reveal())
        self._session.headers.update({"Accept": "application/json", "OData-Version": "4.0"})
        if not verify_tls:
            log.warning(
                "%s: TLS verification is off (verify_tls: false): anyone on the path can "
                "impersonate this BMC and read its password; prefer ca_file",
                self._label,
            )
            # One warning above instead of urllib3's one per request.
            warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)
            self._session.verify = False
        elif ca_file is not None:
            self._session.verify = ca_file

    # -- PowerBackend ------------------------------------------------------

    @property
    def name(self) -> str:
        return self._label

    @property
    def limiter_key(self) -> str:
        return self._key

    async def read_state(self) -> PowerState:
        system = await self._get(await self.system_path())
        value = system.get("PowerState")
        if not isinstance(value, str) or value not in _POWER_STATES:
            known = ", ".join(_POWER_STATES)
            raise Refused(
                self.name,
                f"unexpected PowerState {value!r} in the system resource (expected one of {known})",
            )
        return _POWER_STATES[value]

    async def command(self, target: PowerState) -> None:
        path = await self.system_path()
        action = await self.reset_action(path)
        try:
            reset_type = choose_reset_type(target, action.allowed)
        except ValueError as exc:
            raise Refused(self.name, str(exc)) from None
        await self._reset(action.target, reset_type, target)

    # -- discovery -----------------------------------------------------------

    async def system_path(self) -> str:
        """The system's resource path, found once from the service root."""
        if self._system_path is None:
            self._system_path = await self._discover()
        return self._system_path

    async def _discover(self) -> str:
        root = await self._get("/redfish/v1/")
        collection_path = _odata_id(root.get("Systems"))
        if collection_path is None:
            raise Refused(self.name, "the service root has no Systems collection")
        collection = await self._get(collection_path)
        members = collection.get("Members")
        paths = [p for p in (_odata_id(m) for m in members or []) if p is not None]
        if not isinstance(members, list) or not paths:
            raise Refused(self.name, f"no systems in {collection_path}")
        ids = [p.rstrip("/").rsplit("/", 1)[-1] for p in paths]
        wanted = self._system_wanted
        if wanted is None:
            if len(paths) > 1:
                raise Refused(
                    self.name,
                    f"{len(paths)} systems behind this BMC ({', '.join(ids)}): "
                    "set system to the one that powers this node",
                )
            return paths[0]
        for path, system_id in zip(paths, ids, strict=True):
            if wanted in (system_id, path, path.rstrip("/")):
                return path
        raise Refused(self.name, f'no system "{wanted}" behind this BMC; it has: {", ".join(ids)}')

    async def reset_action(self, system_path: str) -> ResetAction:
        """The system's Reset target and allowed reset types, as advertised now."""
        system = await self._get(system_path)
        actions = system.get("Actions")
        reset = actions.get("#ComputerSystem.Reset") if isinstance(actions, dict) else None
        if not isinstance(reset, dict) or not isinstance(reset.get("target"), str):
            raise Refused(self.name, "the system advertises no #ComputerSystem.Reset action")
        allowed = _string_list(reset.get("ResetType@Redfish.AllowableValues"))
        info_path = reset.get("@Redfish.ActionInfo")
        if allowed is None and isinstance(info_path, str):
            # Some services list the values in an ActionInfo resource instead.
            info = await self._get(info_path)
            for parameter in info.get("Parameters") or []:
                if isinstance(parameter, dict) and parameter.get("Name") == "ResetType":
                    allowed = _string_list(parameter.get("AllowableValues"))
        if allowed is None:
            log.warning(
                "%s: the system does not list its allowed reset types; assuming the standard ones",
                self.name,
            )
        return ResetAction(target=reset["target"], allowed=allowed)

    # -- HTTP ------------------------------------------------------------------

    async def _get(self, path: str) -> dict[str, Any]:
        response = await self._send("GET", path, None, command=False)
        status = response.status_code
        if status == 200:
            body = json_body(response)
            if not isinstance(body, dict):
                raise Refused(
                    self.name,
                    f"GET {path}: expected a JSON object, got {excerpt(response.text)!r}",
                )
            return body
        words = redfish_error_message(json_body(response), response.text)
        if status in (401, 403):
            raise Refused(
                self.name,
                f"credentials rejected (HTTP {status}) on GET {path}: {words}; "
                "check user and password_file",
            )
        if 400 <= status < 500:
            raise Refused(self.name, f"GET {path} refused (HTTP {status}): {words}")
        # A 5xx or anything odd on a read: the BMC is not answering properly now.
        raise Unreachable(self.name, f"GET {path}: HTTP {status}: {words}")

    async def _reset(self, target_path: str, reset_type: str, target: PowerState) -> None:
        attempts = 1 + max(0, self._conflict_retries)
        for attempt in range(1, attempts + 1):
            # A fresh to_thread per attempt: if the caller gives up (cancels),
            # no further attempt is ever sent from a leftover thread.
            drop_idle_connections(self._session)
            response = await self._send(
                "POST", target_path, {"ResetType": reset_type}, command=True
            )
            status = response.status_code
            if status in _ACCEPTED:
                log.info("%s: %s accepted (HTTP %d)", self.name, reset_type, status)
                return
            words = redfish_error_message(json_body(response), response.text)
            if status == 409 and attempt < attempts:
                # 409 Conflict (RFC 9110 §15.5.10): the request "could not be
                # completed" because of the resource's current state - e.g. a
                # BMC still busy with the previous action. It was not applied,
                # so sending it again is not a blind retry. Some BMCs also say
                # 409 when the system is already there: look before resending.
                log.info(
                    "%s: %s answered 409 (%s); attempt %d of %d",
                    self.name,
                    reset_type,
                    words,
                    attempt,
                    attempts,
                )
                if await self._already(target):
                    return
                await asyncio.sleep(self._conflict_delay)
                continue
            raise self._post_error(response, reset_type, words, attempt)

    async def _already(self, target: PowerState) -> bool:
        try:
            return await self.read_state() is target
        except PowerError:
            return False

    def _post_error(
        self, response: requests.Response, reset_type: str, words: str, attempt: int
    ) -> PowerError:
        status = response.status_code
        if status in (401, 403):
            return Refused(
                self.name,
                f"credentials rejected (HTTP {status}) for {reset_type}: {words}; "
                "check user and password_file",
            )
        if status == 409:
            return Refused(
                self.name,
                f"{reset_type} refused with 409 Conflict {attempt} times: {words}",
            )
        if 300 <= status < 400:
            where = excerpt(response.headers.get("Location") or "nowhere")
            return Refused(
                self.name, f"{reset_type} redirected (HTTP {status}) to {where}; not followed"
            )
        if status == 501:
            # Not Implemented: the service cannot do this at all; nothing was done.
            return Refused(self.name, f"{reset_type} not implemented (HTTP 501): {words}")
        if 400 <= status < 500:
            return Refused(self.name, f"{reset_type} refused (HTTP {status}): {words}")
        # A 5xx after the request arrived: the BMC may have started the reset
        # before failing (or a proxy in front of it may have given up waiting).
        return Ambiguous(
            self.name,
            f"{reset_type} answered HTTP {status}: {words}; it may have been applied",
        )

    async def _send(
        self, method: str, path: str, payload: dict[str, Any] | None, *, command: bool
    ) -> requests.Response:
        url = urljoin(self._base + "/", path)
        try:
            return await asyncio.to_thread(
                self._session.request,
                method,
                url,
                json=payload,
                timeout=self._timeout,
                # requests turns a POST redirected by 301/302 into a GET, which
                # would "succeed" without resetting anything: never follow one.
                allow_redirects=not command,
            )
        except requests.RequestException as exc:
            raise transport_error(self.name, exc, command=command, timeout=self._timeout) from exc

    async def aclose(self) -> None:
        self._session.close()


def _odata_id(link: object) -> str | None:
    if isinstance(link, dict):
        value = link.get("@odata.id")
        if isinstance(value, str) and value:
            return value
    return None


def _string_list(value: object) -> tuple[str, ...] | None:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def build_redfish_backend(device: RedfishDevice, secrets: Mapping[str, Secret]) -> RedfishSystem:
    """The backend of one ``type: redfish`` device; password: ``secrets["password_file"]``."""
    password = secrets.get("password_file")
    if password is None:
        raise ConfigError(device.url, ["password_file: a redfish device needs its password"])
    return RedfishSystem(
        device.url,
        device.user,
        password,
        system=device.system,
        ca_file=device.ca_file,
        verify_tls=device.verify_tls,
        timeout=device.timeout,
    )
