"""Restart serving on every node, in vLLM's order (DESIGN §5, FACTS "vLLM").

A rank cannot rejoin alone: every rank restarts. Down: the head first, then
the workers. Up: the workers first, then the head, promptly (the head waits
~10 s for the master port). Done when the head's vLLM answers /health 200
*and* makes progress, or a 1-token canary answers, within start_timeout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from spark_watchdog.controller.http_client import HttpError, request

START_SETTLE_S = 1.0


@dataclass
class ServingRestartReport:
    profile: str
    result: str = "running"  # succeeded | failed | timed_out | profile_mismatch
    error: str | None = None
    step_durations: dict[str, float] = field(default_factory=dict)
    effective: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ServingNode:
    name: str
    agent: str  # base URL


class ServingRestart:
    def __init__(
        self,
        head: ServingNode,
        workers: Sequence[ServingNode],
        token: str,
        *,
        timeout: float,
        request_timeout: float = 30.0,
    ) -> None:
        self.head = head
        self.workers = tuple(workers)
        self._auth = {"Authorization": f"Bearer {token}"}
        self.timeout = timeout
        self.request_timeout = request_timeout

    async def _post(self, node: ServingNode, what: str, body: Any = None) -> dict[str, Any]:
        answer = await request(
            f"{node.agent.rstrip('/')}/v1/serving/{what}",
            method="POST",
            body={} if body is None else body,
            headers=self._auth,
            timeout=self.request_timeout,
        )
        payload = answer.json() if answer.body else {}
        if answer.status != 200:
            error = payload.get("error") if isinstance(payload, dict) else None
            raise HttpError(
                f"{node.name}: {what} answered {answer.status}: {error or answer.body[:200]!r}"
            )
        return payload if isinstance(payload, dict) else {}

    async def _timed(self, report: ServingRestartReport, label: str, coro: Any) -> Any:
        started = time.monotonic()
        try:
            return await coro
        finally:
            report.step_durations[label] = round(time.monotonic() - started, 3)

    async def run(self, profile: str) -> ServingRestartReport:
        report = ServingRestartReport(profile)
        try:
            await self._timed(report, f"stop {self.head.name}", self._post(self.head, "stop"))
            for worker in self.workers:
                await self._timed(report, f"stop {worker.name}", self._post(worker, "stop"))
            for worker in self.workers:
                await self._timed(
                    report,
                    f"start {worker.name}",
                    self._post(worker, "start", {"profile": profile}),
                )
            await self._timed(
                report,
                f"start {self.head.name}",
                self._post(self.head, "start", {"profile": profile}),
            )
            ready = await self._timed(report, "wait ready", self._wait_ready(report))
        except HttpError as exc:
            report.result, report.error = "failed", str(exc)
            return report
        if not ready:
            report.result = "timed_out"
            report.error = f"the head did not serve within {self.timeout:g}s"
            return report
        mismatch = [
            n for n, e in report.effective.items() if e.get("effective_matches_profile") is False
        ]
        if mismatch:
            report.result = "profile_mismatch"
            report.error = (
                f"effective config on {', '.join(mismatch)} is not profile {profile} "
                "(e.g. adaptive verification forcing FULL_AND_PIECEWISE, vllm #56626)"
            )
            return report
        report.result = "succeeded"
        return report

    async def _wait_ready(self, report: ServingRestartReport) -> bool:
        deadline = time.monotonic() + self.timeout
        await asyncio.sleep(START_SETTLE_S)
        while time.monotonic() < deadline:
            try:
                state = (
                    await request(
                        f"{self.head.agent.rstrip('/')}/v1/state", timeout=self.request_timeout
                    )
                ).json()
            except HttpError:
                state = None
            if isinstance(state, dict):
                vllm = (state.get("probes") or {}).get("vllm") or {}
                serving = state.get("serving") or {}
                report.effective[self.head.name] = serving if isinstance(serving, dict) else {}
                if vllm.get("state") == "progressing":
                    return True
                if vllm.get("state") == "idle" and vllm.get("health_status") == 200:
                    canary = await self._post(self.head, "canary")
                    if canary.get("outcome") == "ok":
                        return True
            await asyncio.sleep(1.0)
        return False
