"""Restart serving on every node, in vLLM's order
(docs/design.md, "Serving restart"; docs/facts.md, "Multi-node serving").

A rank cannot rejoin alone: every rank restarts. Down: the head first, then
the workers. Up (``serving.launcher.order``): native multi-node starts the
workers first, then the head, promptly (the head waits ~10 s for the master
port); Ray starts the head (the Ray head) first, then the workers. Done when
the head's vLLM answers /health 200 *and* makes progress, or a 1-token canary
answers, within start_timeout.

Before anything is stopped, every node's agent is asked what it offers
(``GET /v1/serving``, unauthenticated): a profile one of them does not know,
an agent that does not answer or has serving control off, and the restart
fails there with nothing stopped, instead of after every rank is down.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol

from spark_watchdog.controller.clock import Clock, SystemClock
from spark_watchdog.controller.decide.detector import vllm_status
from spark_watchdog.controller.look.http_client import HttpAnswer, HttpError, request
from spark_watchdog.profiles import EffectiveConfig, effective_matches, effective_safe
from spark_watchdog.redact import redact_text

START_SETTLE_S = 1.0


class Requester(Protocol):
    """One HTTP request to an agent (controller/look/http_client.py's ``request``)."""

    async def __call__(
        self,
        url: str,
        *,
        method: str = ...,
        timeout: float,
        body: Any = ...,
        headers: dict[str, str] | None = ...,
    ) -> HttpAnswer: ...


def heard_through(
    http: Requester, nodes: Sequence[ServingNode], heard: Callable[[str], None]
) -> Requester:
    """``http``, telling ``heard`` the name of each node whose agent answered
    (any status): an answer to a serving request is a sign of life like any
    other, and the detector must know of it (controller/look/node_watch.py)."""
    agents = {n.agent.rstrip("/") + "/": n.name for n in nodes}

    async def ask(
        url: str,
        *,
        method: str = "GET",
        timeout: float,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> HttpAnswer:
        answer = await http(url, method=method, timeout=timeout, body=body, headers=headers)
        name = next((n for prefix, n in agents.items() if url.startswith(prefix)), None)
        if name is not None:
            heard(name)
        return answer

    return ask


@dataclass
class ServingRestartReport:
    profile: str
    result: str = "running"  # succeeded | failed | timed_out | profile_mismatch
    error: str | None = None
    step_durations: dict[str, float] = field(default_factory=dict)
    effective: dict[str, Any] = field(default_factory=dict)
    # Said when it succeeded with a config that differs from the profile's but is as safe.
    note: str | None = None
    # Per node, the stacks its agent took before the stop (agent/stacks.py), if any.
    stacks: dict[str, Any] = field(default_factory=dict)
    # A cluster launcher's restart: its commands as they ran, and the ranks'
    # states before, after the stop and at the end (controller/serving/cluster_launcher.py).
    launcher: dict[str, Any] | None = None


def _unsafe(serving: dict[str, Any], asked: EffectiveConfig | None = None) -> bool:
    """The head runs a config that is not the profile's and not known to be as
    safe. Judged again here from what the agent read (``requested`` and
    ``effective``), not taken from its verdict alone: any sign of a difference
    counts unless the values themselves show a config as safe. ``asked``: what
    the profile itself sets, where someone else (a cluster launcher) built the
    command the agent read ``requested`` from."""
    effective = EffectiveConfig.from_json(serving.get("effective"))
    if asked is not None:
        safe = effective_safe(asked, effective)
        if safe is False or (effective_matches(asked, effective) is False and safe is not True):
            return True
    requested = EffectiveConfig.from_json(serving.get("requested"))
    safe = effective_safe(requested, effective)
    if safe is False or (effective_matches(requested, effective) is False and safe is not True):
        return True
    reported_safe = serving.get("effective_safe")
    if reported_safe is not None and reported_safe is not True:
        return True  # the agent says unsafe (or says something that is not a yes)
    differs = serving.get("effective_matches_profile") is False
    return differs and safe is not True


def _effective_text(serving: dict[str, Any]) -> str:
    effective = serving.get("effective") or {}
    shown = [f"{key} {value}" for key, value in effective.items() if value is not None]
    return ", ".join(shown) or "nothing shown"


def unix_time(value: object) -> float | None:
    """An agent's ISO-8601 time (agent/probe_runner.py's ``iso_time``) as UNIX
    seconds; None when absent or not such a time."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment.timestamp() if moment.tzinfo is not None else None


def not_the_new_rank(state: Mapping[str, Any], before: float | None) -> str | None:
    """Why the head's ``/v1/state`` is not yet a report on the rank the restart
    started, in words; None when it is. Both times are the agent's own clock:
    the rank must have started at another time than the one seen before the
    stop, and the vLLM report must have been taken since it started
    (docs/serving.md)."""
    serving = state.get("serving")
    started = unix_time(serving.get("started_at")) if isinstance(serving, Mapping) else None
    if started is None:
        return "the head's agent shows no rank started since the stop"
    # Another start time is another rank, even where the agent's clock was
    # stepped back between the two (a host just power-cycled, its clock synced).
    if before is not None and started == before:
        return "the head's agent still shows the rank from before the restart"
    observed = unix_time(vllm_status(state).get("observed_at"))
    if observed is None or observed < started:
        return "the head's agent has no vLLM report taken since its new rank started"
    return None


@dataclass(frozen=True)
class ServingNode:
    name: str
    agent: str  # base URL


@dataclass(frozen=True)
class ServingOffer:
    """What one node's agent said about serving (GET /v1/serving), or why it said nothing."""

    node: str
    profiles: tuple[str, ...] = ()
    enabled: bool = False
    error: str | None = None  # no usable answer
    # What each profile merges into the command (``profile_settings``), as sent.
    settings: Any = None
    # The command of the node's rank as its agent shows it (secret values ***),
    # when it knows one: what a launcher's profile flags are merged into.
    argv: tuple[str, ...] | None = None
    # When the node's rank started, by its agent's clock (``started_at``), if it
    # has one: after a restart only a report on a rank started later counts.
    started_at: float | None = None

    @property
    def answered(self) -> bool:
        return self.error is None


class PreflightFailed(Exception):
    """The restart cannot go ahead; nothing was stopped. ``unknown_profile``: the
    profile is not offered by an agent that answered (the caller's mistake)."""

    def __init__(self, message: str, *, unknown_profile: bool = False) -> None:
        super().__init__(message)
        self.unknown_profile = unknown_profile


async def serving_offer(
    node: ServingNode, timeout: float, http: Requester = request
) -> ServingOffer:
    try:
        answer = await http(f"{node.agent.rstrip('/')}/v1/serving", timeout=timeout)
        body = answer.json()
    except HttpError as exc:
        return ServingOffer(node.name, error=str(exc))
    if answer.status != 200 or not isinstance(body, dict):
        return ServingOffer(node.name, error=f"GET /v1/serving answered {answer.status}")
    profiles = body.get("profiles")
    names = tuple(p for p in profiles if isinstance(p, str)) if isinstance(profiles, list) else ()
    argv = body.get("argv")
    shown = (
        tuple(argv) if isinstance(argv, list) and all(isinstance(a, str) for a in argv) else None
    )
    return ServingOffer(
        node.name,
        names,
        body.get("enabled") is True,
        settings=body.get("profile_settings"),
        argv=shown,
        started_at=unix_time(body.get("started_at")),
    )


async def serving_offers(
    nodes: Sequence[ServingNode], timeout: float, http: Requester = request
) -> list[ServingOffer]:
    """Every node's offer, asked at once."""
    return list(await asyncio.gather(*(serving_offer(n, timeout, http) for n in nodes)))


def unknown_profile_problem(profile: str, offers: Sequence[ServingOffer]) -> str | None:
    """Why ``profile`` is unknown to the agents that answered with serving on; None if
    every one of them offers it (or none answered: nothing to say it is unknown)."""
    lacking = [o for o in offers if o.answered and o.enabled and profile not in o.profiles]
    if not lacking:
        return None
    by_offer: dict[tuple[str, ...], list[str]] = {}
    for offer in lacking:
        by_offer.setdefault(tuple(sorted(offer.profiles)), []).append(offer.node)
    where = "; ".join(
        f"{', '.join(nodes)} offer{'s' if len(nodes) == 1 else ''} {', '.join(p) or 'none'}"
        for p, nodes in by_offer.items()
    )
    return f'unknown profile "{profile}": {where}'


class ServingRestart:
    def __init__(
        self,
        head: ServingNode,
        workers: Sequence[ServingNode],
        token: str,
        *,
        timeout: float,
        request_timeout: float = 30.0,
        order: Literal["native", "ray"] = "native",
        http: Requester = request,
        clock: Clock | None = None,
        heard: Callable[[str], None] | None = None,
    ) -> None:
        """``http`` and ``clock``: the seams the simulation runs this very code through.
        ``heard``: told the name of each node whose agent answers a request."""
        self.http = http if heard is None else heard_through(http, [head, *workers], heard)
        self.clock: Clock = clock or SystemClock()
        self.head = head
        self.workers = tuple(workers)
        self.order = order
        self._auth = {"Authorization": f"Bearer {token}"}
        self.timeout = timeout
        self.request_timeout = request_timeout
        # The head's rank before the stop (its start, the agent's clock): the
        # restart is judged only on reports about a rank started after it.
        self._head_started: float | None = None
        self._not_ready = "the head's agent did not answer"

    async def _post(self, node: ServingNode, what: str, body: Any = None) -> dict[str, Any]:
        answer = await self.http(
            f"{node.agent.rstrip('/')}/v1/serving/{what}",
            method="POST",
            body={} if body is None else body,
            headers=self._auth,
            timeout=self.request_timeout,
        )
        payload = answer.json() if answer.body else {}
        if answer.status != 200:
            error = payload.get("error") if isinstance(payload, dict) else None
            detail = repr(error) if error else redact_text(repr(answer.body[:200]))
            raise HttpError(f"{node.name}: {what} answered {answer.status}: {detail}")
        return payload if isinstance(payload, dict) else {}

    async def _timed(self, report: ServingRestartReport, label: str, coro: Any) -> Any:
        started = self.clock.monotonic()
        try:
            return await coro
        finally:
            report.step_durations[label] = round(self.clock.monotonic() - started, 3)

    async def preflight(self, profile: str) -> list[ServingOffer]:
        """Raise PreflightFailed unless every node's agent answers, has serving control
        on, and offers ``profile``; the offers, the head's first. Stops nothing."""
        offers = await serving_offers([self.head, *self.workers], self.request_timeout, self.http)
        problem = unknown_profile_problem(profile, offers)
        if problem is not None:
            raise PreflightFailed(f"{problem}; nothing was stopped", unknown_profile=True)
        silent = [f"{o.node}: {o.error}" for o in offers if not o.answered]
        if silent:
            raise PreflightFailed(f"{'; '.join(silent)}; nothing was stopped")
        off = [o.node for o in offers if not o.enabled]
        if off:
            raise PreflightFailed(
                f"serving control is off on {', '.join(off)} (serving.enabled: false in "
                "the agent's config); nothing was stopped"
            )
        self._head_started = offers[0].started_at
        return offers

    async def run(self, profile: str) -> ServingRestartReport:
        report = ServingRestartReport(profile)
        try:
            await self.preflight(profile)
        except PreflightFailed as exc:
            report.result, report.error = "failed", str(exc)
            return report
        try:
            for node in (self.head, *self.workers):
                stopped = await self._timed(report, f"stop {node.name}", self._post(node, "stop"))
                stacks = stopped.get("stacks")
                if isinstance(stacks, dict):
                    report.stacks[node.name] = stacks
            # vLLM's own multi-node: the head waits ~10 s for the workers, so they
            # go first. Ray: the head runs the Ray head the workers join.
            if self.order == "ray":
                starts = (self.head, *self.workers)
            else:
                starts = (*self.workers, self.head)
            for node in starts:
                await self._timed(
                    report,
                    f"start {node.name}",
                    self._post(node, "start", {"profile": profile}),
                )
            ready = await self._timed(report, "wait ready", self._wait_ready(report))
        except HttpError as exc:
            report.result, report.error = "failed", str(exc)
            return report
        if not ready:
            report.result = "timed_out"
            report.error = f"the head did not serve within {self.timeout:g}s ({self._not_ready})"
            return report
        return self._judge(report, profile)

    def _judge(
        self, report: ServingRestartReport, profile: str, asked: EffectiveConfig | None = None
    ) -> ServingRestartReport:
        """Serving again: with the profile's config, one as safe, or a mismatch."""
        unsafe = [n for n, e in report.effective.items() if _unsafe(e, asked)]
        if unsafe:
            report.result = "profile_mismatch"
            report.error = (
                f"effective config on {', '.join(unsafe)} is not profile {profile} "
                "(e.g. adaptive verification forcing FULL_AND_PIECEWISE, vllm #56626)"
            )
            return report
        differs = [
            n for n, e in report.effective.items() if e.get("effective_matches_profile") is False
        ]
        if differs:
            # As safe, not the same: a build that captures no CUDA graphs at all.
            report.note = (
                f"effective config on {', '.join(differs)} differs from profile {profile} "
                f"but is as safe ({_effective_text(report.effective[differs[0]])})"
            )
        report.result = "succeeded"
        head = report.effective.get(self.head.name) or {}
        requested = EffectiveConfig.from_json(head.get("requested"))
        seen = EffectiveConfig.from_json(head.get("effective"))
        if requested != EffectiveConfig() and effective_matches(requested, seen) is None:
            add_note(report, unconfirmed(profile))
        return report

    async def _wait_ready(self, report: ServingRestartReport, within: float | None = None) -> bool:
        """The head serving within the timeout, by a report taken after its new
        rank started (:func:`not_the_new_rank`): the old rank's last report, still
        held by the agent for a probe interval after the stop, never counts."""
        deadline = self.clock.monotonic() + (self.timeout if within is None else within)
        await self.clock.sleep(START_SETTLE_S)
        while self.clock.monotonic() < deadline:
            try:
                state = (
                    await self.http(
                        f"{self.head.agent.rstrip('/')}/v1/state", timeout=self.request_timeout
                    )
                ).json()
            except HttpError as exc:
                state, self._not_ready = None, f"the head's agent did not answer: {exc}"
            stale = not_the_new_rank(state, self._head_started) if isinstance(state, dict) else None
            if stale is not None:
                self._not_ready = stale
            elif isinstance(state, dict):
                vllm = vllm_status(state)
                serving = state.get("serving") or {}
                report.effective[self.head.name] = serving if isinstance(serving, dict) else {}
                self._not_ready = f"its new rank's vLLM is {str(vllm.get('state'))[:40]!r}"
                if vllm.get("state") == "progressing":
                    return True
                if vllm.get("state") == "idle" and vllm.get("health_status") == 200:
                    canary = await self._post(self.head, "canary")
                    if canary.get("outcome") == "ok":
                        return True
            await self.clock.sleep(1.0)
        return False


def unconfirmed(profile: str) -> str:
    """The note of a restart whose profile the head's engine did not show."""
    return (
        f"the head's engine did not show the values profile {profile} sets (is its "
        "startup line in the rank's log?): the profile is not confirmed"
    )


def add_note(report: ServingRestartReport, said: str) -> None:
    """``said`` added to the report's note, once."""
    if report.note is None or said not in report.note:
        report.note = f"{report.note}; {said}" if report.note else said
