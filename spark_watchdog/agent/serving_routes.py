"""``POST /v1/serving/{start,stop,canary}``: the controller drives the rank.

They run in the HTTP request threads, so a stop waiting out ``stop_timeout``
never blocks the agent's loop; the bearer token is checked by the HTTP layer
before any of these runs.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from typing import Any

from spark_watchdog.agent.serving import (
    LaunchFailed,
    ServingConflict,
    ServingLauncher,
    StopFailed,
    UnknownProfile,
)
from spark_watchdog.agent.vllm_watch import VllmWatch
from spark_watchdog.config.launch_values import printable
from spark_watchdog.http.server import PostRoute, Response, json_response

log = logging.getLogger("spark_watchdog.agent")

SERVING_POSTS = ("/v1/serving/start", "/v1/serving/stop", "/v1/serving/canary")
# What a profile's name can be (serving.profiles' keys, config/agent.py).
_PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def serving_post_routes(
    launcher: ServingLauncher | None,
    vllm: VllmWatch | None,
    loop: Callable[[], asyncio.AbstractEventLoop | None],
) -> dict[str, PostRoute]:
    """The POST routes; each answers 404 when serving control is off."""
    if launcher is None:
        return dict.fromkeys(SERVING_POSTS, _serving_disabled)
    routes = ServingRoutes(launcher, vllm, loop)
    return {
        "/v1/serving/start": routes.start,
        "/v1/serving/stop": routes.stop,
        "/v1/serving/canary": routes.canary,
    }


def _serving_disabled(body: dict[str, Any]) -> Response:
    return json_response(
        {"error": "serving control is disabled on this node (serving.enabled: false)"}, 404
    )


class ServingRoutes:
    def __init__(
        self,
        launcher: ServingLauncher,
        vllm: VllmWatch | None,
        loop: Callable[[], asyncio.AbstractEventLoop | None],
    ) -> None:
        self.launcher = launcher
        self.vllm = vllm
        self._loop = loop

    def start(self, body: dict[str, Any]) -> Response:
        launcher = self.launcher
        profile = body.get("profile")
        problem = _unexpected_keys(body, ("profile",)) or _profile_problem(profile)
        if problem is not None:
            return json_response({"error": problem}, 400)
        log.info("serving: start requested (profile %s)", profile or "default")
        if self.vllm is not None:
            self.vllm.tracker.note_planned_start()
        try:
            return json_response(launcher.start(profile))
        except UnknownProfile as exc:
            return json_response({"error": str(exc), "known_profiles": exc.known}, 400)
        except ServingConflict as exc:
            return json_response({"error": str(exc), "serving": launcher.status()}, 409)
        except LaunchFailed as exc:
            log.error("serving: %s", exc)
            return json_response({"error": str(exc), "serving": launcher.status()}, 500)

    def stop(self, body: dict[str, Any]) -> Response:
        launcher = self.launcher
        problem = _unexpected_keys(body, ())
        if problem is not None:
            return json_response({"error": problem}, 400)
        log.info("serving: stop requested")
        if self.vllm is not None:
            # The port refusing from now on is our doing, not a death.
            self.vllm.tracker.note_planned_stop()
        try:
            return json_response(launcher.stop())
        except ServingConflict as exc:
            self._stop_not_taken()
            return json_response({"error": str(exc), "serving": launcher.status()}, 409)
        except StopFailed as exc:
            self._stop_not_taken()
            log.error("serving: %s", exc)
            return json_response({"error": str(exc), "serving": launcher.status()}, 500)

    def _stop_not_taken(self) -> None:
        """A stop that failed leaves the rank serving: a later refusal is a death."""
        if self.vllm is not None:
            self.vllm.tracker.note_planned_start()

    def canary(self, body: dict[str, Any]) -> Response:
        problem = _unexpected_keys(body, ())
        if problem is not None:
            return json_response({"error": problem}, 400)
        result = None if self.vllm is None else self.vllm.run_asked_canary(self._loop())
        if result is None:
            return json_response(
                {
                    "error": "no vLLM API on this node (probes.vllm.url is null or the "
                    "vllm probe is off): canaries go to the head"
                },
                409,
            )
        log.info("serving: canary asked: %s", result.describe())
        return json_response(result.to_json())


def _profile_problem(profile: object) -> str | None:
    """Why ``profile`` of a start's body is no profile name (a NUL, a control
    character, a list): a 400 that shows it escaped, never a launch with it."""
    if profile is None:
        return None
    if not isinstance(profile, str):
        return f"profile: expected a profile name (a string), got {type(profile).__name__}"
    if not _PROFILE_NAME.match(profile):
        return (
            "profile: expected a profile name (letters, digits, '.', '_', '-'; at most 63 "
            f'characters), got "{printable(profile[:80])}"'
        )
    return None


def _unexpected_keys(body: dict[str, Any], allowed: tuple[str, ...]) -> str | None:
    extra = sorted(set(body) - set(allowed))
    if not extra:
        return None
    wanted = ", ".join(allowed) if allowed else "none (send {} or no body)"
    shown = ", ".join(printable(key[:80]) for key in extra[:10])
    more = f" and {len(extra) - 10} more" if len(extra) > 10 else ""
    return f"unknown key(s) in body: {shown}{more}; expected: {wanted}"
