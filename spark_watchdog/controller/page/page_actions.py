"""What a person does from the operator's page: hold and release a node,
clear the cluster's hold, step down the pair's leader (docs/page.md).

Each action does what the CLI does (``spark-watchdog hold``, ``release``,
``ha step-down``), through the controller: it runs on the controller's own
event loop, handed over from the HTTP server's thread, and writes the
history as the CLI would, so the hold is in the history (``spark-watchdog
status`` and the next sweep see it) whether or not the page is looked at
again. A node the controller does not watch is refused before anything
is written.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol, TypeVar

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.decide.colocation import Placement
from spark_watchdog.controller.page.page_view import WatchLike
from spark_watchdog.controller.record.ledger import HistoryUnwritable
from spark_watchdog.errors import StoreError
from spark_watchdog.history.records import CLUSTER, Hold, Incident, IncidentTimeline

T = TypeVar("T")

HOLD = "/v1/actions/hold"
RELEASE = "/v1/actions/release"
STEP_DOWN = "/v1/actions/step-down"
ACTIONS = (HOLD, RELEASE, STEP_DOWN)
# Who the history says acted.
BY = "page"
# How long an action may wait for the controller's loop and the history.
ACTION_TIMEOUT_S = 10.0
MAX_REASON = 500

LoopGetter = Callable[[], "asyncio.AbstractEventLoop | None"]
# Ends the pair's lease (history/leadership.py's end_lease); the lease it ended, as JSON.
StepDown = Callable[[], Awaitable["dict[str, Any] | None"]]


class StoreLike(Protocol):
    def hold(self, node: str, reason: str, *, by: str, at: float | None = None) -> Hold: ...

    def release(self, node: str, *, by: str, at: float | None = None) -> Hold | None: ...

    def list_incidents(
        self,
        *,
        node: str | None = None,
        since: float | None = None,
        kind: str | None = None,
        status: str | None = None,
        limit: int | None = 100,
    ) -> list[Incident]: ...

    def incident(self, incident_id: int) -> IncidentTimeline | None: ...


class LedgerLike(Protocol):
    @property
    def store(self) -> StoreLike: ...

    async def write(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T: ...


class ClockLike(Protocol):
    def monotonic(self) -> float: ...


class ServingLike(Protocol):
    profile: str | None


class HoldsLike(Protocol):
    def breaker_open(self) -> bool: ...


class PlacedLike(Protocol):
    """The other controllers on the Sparks, as the controller hears them
    (controller/look/controller_peers.py): where this one runs (None: a
    controller on a host of its own)."""

    @property
    def placement(self) -> Placement | None: ...


class PageSource(Protocol):
    """What the page reads and acts through: the controller (controller/daemon.py)."""

    @property
    def config(self) -> ControllerConfig: ...

    @property
    def ledger(self) -> LedgerLike: ...

    @property
    def watches(self) -> Mapping[str, WatchLike]: ...

    @property
    def clock(self) -> ClockLike: ...

    @property
    def serving(self) -> ServingLike: ...

    @property
    def holds(self) -> HoldsLike: ...

    @property
    def peers(self) -> PlacedLike: ...


class Unavailable(Exception):
    """The controller's loop cannot take the call now (stopped, or busy past the timeout)."""


def run_on_loop(
    loop: LoopGetter, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = ACTION_TIMEOUT_S
) -> T:
    """``make()`` run on the controller's loop, from another thread; its result."""
    running = loop()
    if running is None or running.is_closed() or not running.is_running():
        raise Unavailable("the controller's loop is not running (starting or stopping); retry")
    future = asyncio.run_coroutine_threadsafe(make(), running)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise Unavailable(
            f"the controller did not finish within {timeout:g}s (a write to the history may "
            "still complete): look at the page again before retrying"
        ) from None


def _text(body: Mapping[str, Any], key: str, limit: int) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key}: expected a non-empty string, got {value!r:.60}")
    if len(value) > limit:
        raise ValueError(f"{key}: at most {limit} characters, got {len(value)}")
    return value.strip()


def _fields(body: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        known = ", ".join(allowed) or "none"
        raise ValueError(f"unknown field {unknown[0]!r:.60}; fields: {known}")


def _target(source: PageSource, body: Mapping[str, Any]) -> str | None:
    """The node (or ``*``, the cluster) the body names; None when it names no known node."""
    node = _text(body, "node", 128)
    if node == CLUSTER or node in source.watches:
        return node
    return None


def run_action(
    source: PageSource,
    loop: LoopGetter,
    step_down: StepDown | None,
    path: str,
    body: Mapping[str, Any],
) -> tuple[int, dict[str, Any]]:
    """(status, answer) of one authorized action; nothing changes on an error."""
    try:
        if path == STEP_DOWN:
            _fields(body, ())
            if step_down is None:
                return 409, {"error": "this controller is not one of a pair: nothing to step down"}
            return 200, {"ended": run_on_loop(loop, step_down_now(step_down))}
        _fields(body, ("node", "reason") if path == HOLD else ("node",))
        reason = _text(body, "reason", MAX_REASON) if path == HOLD else ""
        node = _target(source, body)
    except ValueError as exc:
        return 400, {"error": str(exc)}
    except Unavailable as exc:
        return 503, {"error": str(exc)}
    except StoreError as exc:  # the lease could not be ended: nothing changed
        return 503, {"error": f"not done: the history cannot be written ({exc})"}
    if node is None:
        known = ", ".join(source.watches) or "none"
        return 404, {"error": f"no node {body['node']!r:.60} on this controller; known: {known}"}
    ledger = source.ledger
    try:
        if path == HOLD:

            async def hold() -> Hold:
                return await ledger.write(ledger.store.hold, node, reason, by=BY)

            return 200, {"hold": run_on_loop(loop, hold).to_json()}

        async def release() -> Hold | None:
            return await ledger.write(ledger.store.release, node, by=BY)

        released = run_on_loop(loop, release)
        return 200, {"released": None if released is None else released.to_json()}
    except HistoryUnwritable as exc:
        return 503, {"error": f"not done: the history cannot be written ({exc})"}
    except Unavailable as exc:
        return 503, {"error": str(exc)}


def step_down_now(step_down: StepDown) -> Callable[[], Coroutine[Any, Any, dict[str, Any] | None]]:
    async def call() -> dict[str, Any] | None:
        return await step_down()

    return call
