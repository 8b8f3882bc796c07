"""A serving restart through the cluster's own launcher (``serving.launcher:
command``; docs/serving.md, "a cluster launcher").

spark-vllm-docker, sparkrun and NVIDIA's ``run_cluster.sh`` start every
node's container from one place. For such a cluster the restart runs the
operator's stop command, then the start command with the profile handed
over (:func:`launcher_values`), and then verifies the result from the agents
exactly as after the agents' own restart: every rank running, the head
serving (progress, or a canary answered), and the head's engine reporting
the configuration of the profile asked for, judged against the profile
itself, not against whatever the launcher passed.

Before anything runs, every agent must answer and the head's agent must
offer the profile (its settings are what the launcher is given). A stop that
fails, times out or cannot be known to have ended starts nothing; nothing is
ever run twice. Which ranks were running before, after the stop and at the
end is recorded with each command's exit and output.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from spark_watchdog.config.controller import PLACEHOLDER, LauncherConfig
from spark_watchdog.controller.look.http_client import HttpError
from spark_watchdog.controller.serving.launcher_commands import CommandResult, CommandRunner
from spark_watchdog.controller.serving.serving_restart import (
    PreflightFailed,
    ServingNode,
    ServingOffer,
    ServingRestart,
    ServingRestartReport,
    add_note,
    unconfirmed,
)
from spark_watchdog.profiles import (
    COMPILATION_FLAG,
    SPECULATIVE_FLAG,
    EffectiveConfig,
    Profile,
    ProfileError,
    apply_profile,
    effective_matches,
    flag_json,
    normalise_cudagraph_mode,
)


def profile_from(settings: object, name: str) -> Profile | None:
    """A profile as an agent's ``profile_settings`` gives it; None when it is not there
    or is not the shape a profile has."""
    if not isinstance(settings, Mapping):
        return None
    entry = settings.get(name)
    if not isinstance(entry, Mapping):
        return None
    speculative = entry.get("speculative_config", {})
    compilation = entry.get("compilation_config", {})
    extra = entry.get("extra_args", [])
    if not isinstance(speculative, dict) or not isinstance(compilation, dict):
        return None
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        return None
    return Profile(name, speculative, compilation, tuple(extra))


def profile_requests(profile: Profile) -> EffectiveConfig:
    """The two values the profile sets, in the terms the head's engine reports."""
    mode = profile.compilation_config.get("cudagraph_mode")
    adaptive = profile.speculative_config.get("enable_adaptive_verification")
    return EffectiveConfig(
        normalise_cudagraph_mode(mode) if mode is not None else None,
        adaptive if isinstance(adaptive, bool) else None,
    )


def profile_flags(profile: Profile, running: Sequence[str] = ()) -> list[str]:
    """The vLLM flags that give a launcher's command the profile, to append to it
    (vLLM takes the last of a flag): each JSON flag the profile changes, merged
    into the value the ``running`` command has (the head's rank as its agent
    shows it), whole, since an appended ``--speculative-config`` replaces the
    recipe's; then the profile's extra arguments. Without a running command a
    speculative override has no method to apply to and is left out (profiles.py);
    the head's effective config then says whether the profile took."""
    merged = apply_profile(running, profile)
    flags: list[str] = []
    for flag, override in (
        (SPECULATIVE_FLAG, profile.speculative_config),
        (COMPILATION_FLAG, profile.compilation_config),
    ):
        value = flag_json(merged, flag) if override else None
        if value is not None:
            flags += [flag, json.dumps(value, separators=(",", ":"))]
    return [*flags, *profile.extra_args]


def launcher_values(profile: Profile, running: Sequence[str] = ()) -> dict[str, Any]:
    """What the launcher is given, by placeholder name (``{profile}`` ...): the
    profile's name, its vLLM flags merged into the ``running`` command (as a
    list, for ``{vllm_args}``; :func:`profile_flags`), the two JSON overrides
    and the extra arguments."""
    flags = profile_flags(profile, running)
    return {
        "profile": profile.name,
        "vllm_args": flags,
        "compilation_config": json.dumps(dict(profile.compilation_config), sort_keys=True),
        "speculative_config": json.dumps(dict(profile.speculative_config), sort_keys=True),
        "extra_args": shlex.join(profile.extra_args),
    }


def launcher_environment(values: Mapping[str, Any]) -> dict[str, str]:
    """The same values as ``SPARK_WATCHDOG_*`` environment variables."""
    return {
        f"SPARK_WATCHDOG_{name.upper()}": shlex.join(value) if isinstance(value, list) else value
        for name, value in values.items()
    }


def substitute(argv: Sequence[str], values: Mapping[str, Any]) -> list[str]:
    """``argv`` with its placeholders filled in one pass (a value that holds a
    placeholder's name is not filled again; checked at load: only known ones)."""
    out: list[str] = []
    for argument in argv:
        if argument == "{vllm_args}":
            out.extend(values["vllm_args"])
            continue
        out.append(
            PLACEHOLDER.sub(
                lambda m: (
                    str(values.get(m.group(1), m.group(0)))
                    if m.group(1) != "vllm_args"
                    else m.group(0)
                ),
                argument,
            )
        )
    return out


class LauncherRestart(ServingRestart):
    """Stop and start through the launcher; verify through the agents."""

    def __init__(
        self,
        head: ServingNode,
        workers: Sequence[ServingNode],
        token: str,
        *,
        launcher: LauncherConfig,
        runner: CommandRunner,
        timeout: float,
        request_timeout: float = 30.0,
        heard: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(
            head, workers, token, timeout=timeout, request_timeout=request_timeout, heard=heard
        )
        self.launcher = launcher
        self.runner = runner
        self._profile: Profile | None = None
        self._running: Sequence[str] = ()

    async def preflight(self, profile: str) -> list[ServingOffer]:
        offers = await super().preflight(profile)
        found = profile_from(offers[0].settings, profile)
        if found is None:
            raise PreflightFailed(
                f"the head's agent ({self.head.name}) did not give the settings of profile "
                f"{profile} (GET /v1/serving profile_settings; an agent older than the "
                "controller?); nothing was run"
            )
        self._profile = found
        self._running = offers[0].argv or ()
        return offers

    async def run(self, profile: str) -> ServingRestartReport:
        record: dict[str, Any] = {"type": "command", "commands": [], "ranks": {}}
        report = ServingRestartReport(profile, launcher=record)
        try:
            await self.preflight(profile)
        except PreflightFailed as exc:
            report.result, report.error = "failed", str(exc)
            return report
        assert self._profile is not None
        try:
            values = launcher_values(self._profile, self._running)
        except ProfileError as exc:
            report.result = "failed"
            report.error = f"profile {profile} cannot merge into the head's command: {exc}"
            return report
        record["merged_into"] = (
            "the head's rank command" if self._running else "nothing (the head shows no command)"
        )
        environment = {**self.launcher.environment, **launcher_environment(values)}
        record["ranks"]["before"] = await self._ranks()
        failed = await self._stop(report, record["ranks"], environment, values)
        if failed is None:
            failed = await self._start(report, record["ranks"], environment, values)
        if failed is not None:
            report.result, report.error = failed
            return report
        return self._confirm(report, profile)

    async def _stop(
        self,
        report: ServingRestartReport,
        ranks: dict[str, Any],
        environment: dict[str, str],
        values: dict[str, Any],
    ) -> tuple[str, str] | None:
        """The launcher's stop, and every rank down after it; else (result, error)."""
        stop = await self._command(report, "stop", self.launcher.stop, environment, values)
        after_stop = ranks["after_stop"] = await self._ranks()
        if not stop.ok:
            return "failed", f"{stop.detail}; nothing was started{_still(after_stop)}{_said(stop)}"
        # A stop that says it is done while a rank still runs (or cannot be asked)
        # would have the start and its checks meet the old ranks.
        if _still(after_stop):
            return "failed", (
                f"the launcher's stop ended, but not every rank is down{_still(after_stop)}; "
                "nothing was started"
            )
        return None

    async def _start(
        self,
        report: ServingRestartReport,
        ranks: dict[str, Any],
        environment: dict[str, str],
        values: dict[str, Any],
    ) -> tuple[str, str] | None:
        """The launcher's start, then every rank running and the head serving
        within the timeout; else (result, error)."""
        start = await self._command(report, "start", self.launcher.start, environment, values)
        if not start.ok:
            ranks["after_start"] = await self._ranks()
            return "failed", f"{start.detail}{_said(start)}"
        try:
            ready = await self._timed(report, "wait ready", self._wait_all_ready(report))
        except HttpError as exc:  # the head's agent refused or dropped the canary
            ranks["after_start"] = await self._ranks()
            return "failed", str(exc)
        after_start = ranks["after_start"] = await self._ranks()
        if ready:
            return None
        down = sorted(n for n, state in after_start.items() if state != "running")
        return "timed_out", f"the launcher's start ended, but within {self.timeout:g}s " + (
            f"ranks on {', '.join(down)} did not run" if down else "the head did not serve"
        )

    def _confirm(self, report: ServingRestartReport, profile: str) -> ServingRestartReport:
        """Serving is back: judge the profile in force from what the ranks show."""
        assert self._profile is not None
        asked = profile_requests(self._profile)
        report = self._judge(report, profile, asked)
        head = report.effective.get(self.head.name) or {}
        seen = EffectiveConfig.from_json(head.get("effective"))
        shows_none = asked != EffectiveConfig() and effective_matches(asked, seen) is None
        if report.result == "succeeded" and shows_none:
            add_note(report, unconfirmed(profile))
        return report

    async def _command(
        self,
        report: ServingRestartReport,
        which: str,
        argv: Sequence[str],
        environment: Mapping[str, str],
        values: Mapping[str, Any],
    ) -> CommandResult:
        timeout = self.launcher.stop_timeout if which == "stop" else self.launcher.start_timeout
        started = self.clock.monotonic()
        result = await self.runner.run(which, substitute(argv, values), environment, timeout)
        report.step_durations[f"launcher {which}"] = round(self.clock.monotonic() - started, 3)
        assert report.launcher is not None
        report.launcher["commands"].append(result.to_json())
        return result

    async def _ranks(self) -> dict[str, str]:
        """Each node's rank as its agent says now (``serving.state``), or why not known."""

        async def one(node: ServingNode) -> tuple[str, str]:
            try:
                answer = await self.http(
                    f"{node.agent.rstrip('/')}/v1/serving", timeout=self.request_timeout
                )
                body = answer.json()
            except HttpError as exc:
                return node.name, f"unknown: {exc}"
            state = body.get("state") if isinstance(body, dict) else None
            return node.name, str(state) if state else f"unknown: HTTP {answer.status}"

        found = await asyncio.gather(*(one(n) for n in (self.head, *self.workers)))
        return dict(found)

    async def _wait_all_ready(self, report: ServingRestartReport) -> bool:
        """Every rank running, then the head serving, within the start timeout."""
        deadline = self.clock.monotonic() + self.timeout
        while self.clock.monotonic() < deadline:
            ranks = await self._ranks()
            if all(state == "running" for state in ranks.values()):
                left = deadline - self.clock.monotonic()
                return left > 0 and await self._wait_ready(report, left)
            await self.clock.sleep(1.0)
        return False


def _still(ranks: Mapping[str, str]) -> str:
    """The ranks that are not known to be down, as a clause; "" when none."""
    up = sorted(
        n for n, state in ranks.items() if state == "running" or state.startswith("unknown")
    )
    return f" (still running or not known: {', '.join(up)})" if up else ""


def _said(result: CommandResult) -> str:
    return f"; it said: {result.output[-300:]}" if result.output else ""
