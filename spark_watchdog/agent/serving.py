"""The serving launcher: starts and stops this node's vLLM rank
(docs/design.md, "Serving restart").

The launch command is the operator's (``serving.command``: ``vllm serve ...``
or a script; in a container, the command inside it) with a profile merged in
(:mod:`spark_watchdog.profiles`). What holds the rank's processes is the
runtime's business (:mod:`spark_watchdog.agent.rank`): a process group the
agent forks (``serving.runtime: process``), or a container of the local
Docker Engine (``serving.runtime: docker``). Either way the rank's output is
appended to ``serving.log_file``, and the *effective* config is read from the
engine's own startup line there (:mod:`spark_watchdog.agent.effective_config`).

:meth:`ServingLauncher.stop` sends SIGTERM to all of the rank, waits
``stop_timeout``, then SIGKILLs it, and reports failure if anything survives
even that (a process stuck in the GPU driver cannot be killed), because a
rank cannot rejoin a multi-node cluster alone and a restart must leave
nothing behind. :meth:`ServingLauncher.start` refuses while anything of the
previous rank, or any process matching ``probes.vllm.process_match``, still
lives (docs/facts.md, "Multi-node serving").

The exit code is reported but is not a health signal: after an illegal memory
access vLLM's API server can exit with code 0 (vllm #53726).
"""

from __future__ import annotations

import logging
import shlex
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from spark_watchdog.agent.effective_config import LogScanner, requested_config
from spark_watchdog.agent.probe_runner import iso_time
from spark_watchdog.agent.rank import (
    LaunchFailed,
    Rank,
    RankRuntime,
    ServingConflict,
    ServingError,
    StopFailed,
    UnknownProfile,
)
from spark_watchdog.agent.rank_process import ProcessRuntime
from spark_watchdog.agent.stacks import as_log_lines, dump_stacks
from spark_watchdog.config.agent import ServingConfig
from spark_watchdog.profiles import (
    EffectiveConfig,
    ProfileError,
    apply_profile,
    effective_matches,
    effective_safe,
)
from spark_watchdog.redact import redact_argv

log = logging.getLogger("spark_watchdog.agent.serving")

ServingState = Literal["not_started", "running", "exited", "stopped"]

# After SIGKILL the kernel needs a moment to tear processes down (and a process
# in uninterruptible sleep never goes): how long to wait before calling it failed.
KILL_GRACE = 10.0
_POLL = 0.05

__all__ = [
    "LaunchFailed",
    "ServingConflict",
    "ServingLauncher",
    "StopFailed",
    "UnknownProfile",
    "disabled_status",
]


@dataclass
class _Run:
    argv: list[str]
    profile: str
    rank: Rank
    started_at: float
    scanner: LogScanner
    requested: EffectiveConfig
    stopping: bool = False
    stopped_by_us: bool = False
    stopped_at: float | None = None
    killed: bool = False
    # Who sent SIGKILL without a SIGTERM first ("memory_guard"), if anyone.
    killed_by: str | None = None
    # The processes' stacks, taken before the last stop (agent/stacks.py).
    stacks: dict[str, Any] | None = None


def default_runtime(
    config: ServingConfig, process_match: str | None, node: str | None = None
) -> RankRuntime:
    """The runtime ``serving.runtime`` names. The Docker SDK is imported only here."""
    if config.runtime == "docker":
        from spark_watchdog.agent.rank_container import ContainerRuntime

        return ContainerRuntime(config, process_match, node)
    return ProcessRuntime(config.working_directory, process_match)


# How long an arrival waits for a start or stop under way, and how often it looks.
ARRIVAL_WAIT_S = 120.0
ARRIVAL_POLL_S = 0.05


def _not_started_status() -> dict[str, Any]:
    """The status of a launcher that has no rank yet."""
    return {
        "state": "not_started",
        "stopping": False,
        "profile": None,
        "argv": None,
        "pid": None,
        "pgid": None,
        "started_at": None,
        "stopped_at": None,
        "ended_at": None,
        "exit_code": None,
        "exit_signal": None,
        "group_alive": False,
        "killed": False,
        "killed_by": None,
        "stacks": None,
        "requested": EffectiveConfig().to_json(),
        "effective": EffectiveConfig().to_json(),
        "effective_matches_profile": None,
        "effective_safe": None,
    }


class ServingLauncher:
    """Starts and stops the rank; every method is safe to call from any thread.

    One operation (start or stop) runs at a time; a second one meanwhile is
    refused as busy rather than queued, so requests never pile up behind a slow
    stop. :meth:`status` never waits for an operation.
    """

    def __init__(
        self,
        config: ServingConfig,
        *,
        process_match: str | None = None,
        runtime: RankRuntime | None = None,
        node: str | None = None,
    ) -> None:
        self.config = config
        self.process_match = process_match
        self.runtime = runtime or default_runtime(config, process_match, node)
        self.profiles = config.all_profiles()
        # Fixed with the config: built once, not on every status read.
        self._profile_settings = {n: self.profiles[n].to_json() for n in sorted(self.profiles)}
        self._operation = threading.Lock()
        self._state = threading.Lock()
        self._run: _Run | None = self._adopt()
        self.runtime.watch_arrivals(self._arrived)

    def _adopt(self) -> _Run | None:
        """A live rank found at start (a container of this node's name): watched,
        stopped and killed as if this agent had started it."""
        path = Path(self.config.log_file)
        try:
            found = self.runtime.adopt(path)
        except ServingError as exc:
            log.warning("serving: could not look for a running rank to adopt: %s", exc)
            return None
        if found is None:
            return None
        rank, argv, profile = found
        try:
            offset = path.stat().st_size
        except OSError:
            offset = 0
        self._note(f"adopted the running rank ({rank.describe()}), profile {profile or 'unknown'}")
        return _Run(
            argv=argv,
            profile=profile or "unknown",
            rank=rank,
            started_at=time.time(),
            scanner=LogScanner(path, offset),
            requested=requested_config(argv),
        )

    def _arrived(self) -> None:
        """A rank started outside this agent (the cluster's launcher): adopted
        while no rank of this agent's lives. It never takes the operation lock,
        so a start or stop is never refused as busy because of it: it lets one
        under way finish first (the start event of the agent's own container is
        that start's rank, not an arrival), then swaps under the state lock."""
        deadline = time.monotonic() + ARRIVAL_WAIT_S
        while self._operation.locked() and time.monotonic() < deadline:
            time.sleep(ARRIVAL_POLL_S)
        with self._state:
            run = self._run
        if run is not None and run.rank.alive():
            return
        found = self._adopt()
        if found is None:
            return
        with self._state:
            run = self._run
            taken = not self._operation.locked() and (run is None or not run.rank.alive())
            if taken:
                self._run = found
        if not taken:
            found.rank.close()  # a start or stop began meanwhile: it decides
        elif run is not None:
            run.rank.close()

    def close(self) -> None:
        """Let go of what watches the rank and the runtime; the rank keeps running."""
        self.runtime.close()
        with self._state:
            run = self._run
        if run is not None:
            run.rank.close()

    @property
    def profile_names(self) -> list[str]:
        return sorted(self.profiles)

    def shown_argv(self, argv: list[str]) -> list[str]:
        """The argv as shown and logged: secret values (``serving.secret_flags``
        and the built-in ones, :mod:`spark_watchdog.redact`) read ``***``. The
        rank itself is started with the real one."""
        return redact_argv(argv, self.config.secret_flags)

    # -- start ------------------------------------------------------------------

    def start(self, profile: str | None = None) -> dict[str, Any]:
        """Launch the rank with ``profile`` (default ``serving.default_profile``).

        :raises UnknownProfile: no such profile.
        :raises ServingConflict: busy, or something of an earlier rank lives.
        :raises LaunchFailed: the rank could not be started.
        """
        name = profile or self.config.default_profile
        if name not in self.profiles:
            raise UnknownProfile(name, self.profile_names)
        if not self._operation.acquire(blocking=False):
            raise ServingConflict("busy: another start or stop is in progress; retry")
        try:
            self._refuse_if_alive()
            try:
                argv = apply_profile(
                    self.runtime.base_command(list(self.config.command)), self.profiles[name]
                )
            except ProfileError as exc:  # checked at config load; kept for safety
                raise LaunchFailed(f"profile {name}: {exc}") from None
            run = self._launch(argv, name)
            with self._state:
                previous, self._run = self._run, run
            if previous is not None:
                previous.rank.close()
            log.info(
                "serving: started profile %s, pid %s: %s",
                name,
                run.rank.pid,
                shlex.join(self.shown_argv(argv)),
                extra={"profile": name, "pid": run.rank.pid},
            )
        finally:
            self._operation.release()
        return self.status()

    def _refuse_if_alive(self) -> None:
        with self._state:
            run = self._run
        if run is not None:
            members = run.rank.pids()
            if members:
                raise ServingConflict(
                    f"the previous rank ({self._what(run)}) still has live processes "
                    f"(pids {', '.join(map(str, members[:10]))}); stop it first"
                )
        why = self.runtime.leftover()
        if why is not None:
            raise ServingConflict(why)

    def _launch(self, argv: list[str], profile: str) -> _Run:
        path = Path(self.config.log_file)
        started_at = time.time()
        header = (
            f"--- spark-watchdog {iso_time(started_at)}: starting the rank with "
            f"profile {profile}: {shlex.join(self.shown_argv(argv))}\n"
        )
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("ab") as sink:
                sink.write(header.encode())
                offset = sink.tell()
        except OSError as exc:
            raise LaunchFailed(
                f"serving.log_file: cannot open {path} for appending: {exc.strerror or exc}"
            ) from None
        rank = self.runtime.launch(argv, dict(self.config.environment), path, profile)
        return _Run(
            argv=argv,
            profile=profile,
            rank=rank,
            started_at=started_at,
            scanner=LogScanner(path, offset),
            requested=requested_config(argv),
        )

    # -- stop -------------------------------------------------------------------

    def stop(self) -> dict[str, Any]:
        """SIGTERM the rank, SIGKILL it after ``stop_timeout``. Idempotent.

        :raises ServingConflict: busy with another start or stop.
        :raises StopFailed: something of the rank survived SIGKILL.
        """
        if not self._operation.acquire(blocking=False):
            raise ServingConflict("busy: another start or stop is in progress; retry")
        try:
            with self._state:
                run = self._run
            if run is None or not run.rank.alive():
                return self.status()  # nothing left to stop
            self._stop(run)
        finally:
            self._operation.release()
        return self.status()

    def _stop(self, run: _Run) -> None:
        self._dump_stacks(run)
        began = time.monotonic()
        with self._state:
            run.stopping = True
            # Ended by us only if it was still running; a rank that had exited on
            # its own stays "exited" even when we clear away its leftovers.
            run.stopped_by_us = run.rank.exit_code() is None
        try:
            run.rank.signal(signal.SIGTERM)
            gone = self._wait_gone(run, self.config.stop_timeout)
            if not gone:
                log.warning(
                    "serving: %s still alive %.0f s after SIGTERM; SIGKILL",
                    self._what(run),
                    self.config.stop_timeout,
                )
                run.killed = True
                run.rank.signal(signal.SIGKILL)
                gone = self._wait_gone(run, KILL_GRACE)
        finally:
            with self._state:
                run.stopping = False
                run.stopped_at = time.time()
        took = time.monotonic() - began
        how = "SIGKILL" if run.killed else "SIGTERM"
        self._note(f"stop: {how} to {self._what(run)}; after {took:.1f} s gone={gone}")
        if not gone:
            left = run.rank.pids()
            raise StopFailed(
                f"{self._what(run)} survived SIGKILL (pids {', '.join(map(str, left[:10]))}): "
                "uninterruptible sleep in the driver? a power cycle may be the only way out"
            )
        log.info("serving: stopped %s with %s in %.1f s", self._what(run), how, took)

    def _what(self, run: _Run) -> str:
        """The rank as the operator would name it: its process group or its container."""
        described = run.rank.describe()
        if "pgid" in described:
            return f"process group {described['pgid']}"
        container = described.get("container") or {}
        return f"container {container.get('name')}"

    def _dump_stacks(self, run: _Run) -> None:
        """Where the rank's processes are, before they are signalled (bounded)."""
        if not self.config.stack_dump:
            return
        pids = run.rank.pids()
        if not pids:
            return
        record = dump_stacks(
            pids, self.config.stack_dump_timeout, secret_flags=self.config.secret_flags
        )
        with self._state:
            run.stacks = record
        self._note(as_log_lines(record))

    def kill_now(self, by: str) -> dict[str, Any] | None:
        """SIGKILL all of the rank at once, without SIGTERM and without waiting
        for a start or stop in progress: the memory guard's way, when the host
        has seconds left. What was signalled (its process group or container)
        and the pids it had, or None when nothing of the rank lives. Never
        waits: the rank is reaped later."""
        with self._state:
            run = self._run
            if run is None:
                return None
            members = run.rank.pids()
            if not members:
                return None
            run.stopped_by_us = run.rank.exit_code() is None
            run.killed = True
            run.killed_by = by
            run.stopped_at = time.time()
            run.rank.signal(signal.SIGKILL)
        self._note(f"{by}: SIGKILL to {self._what(run)} (pids {members[:10]})")
        return {**run.rank.describe(), "pids": members}

    def _wait_gone(self, run: _Run, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            if not run.rank.alive():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)

    def _note(self, text: str) -> None:
        """One line in the serving log, so the operator reading it sees our part."""
        try:
            with open(self.config.log_file, "a", encoding="utf-8") as sink:
                sink.write(f"--- spark-watchdog {iso_time(time.time())}: {text}\n")
        except OSError:
            pass

    # -- status -----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The rank as far as this agent knows it; cheap, never blocks on start/stop."""
        base: dict[str, Any] = {
            "enabled": True,
            "runtime": self.runtime.kind,
            "default_profile": self.config.default_profile,
            "profiles": self.profile_names,
            "profile_settings": self._profile_settings,
            "log_file": self.config.log_file,
            "creates_from": self.runtime.creates_from(),
        }
        with self._state:
            run = self._run
            if run is None:
                return {**base, **_not_started_status()}
            return {**base, **self._run_status(run)}

    def _run_status(self, run: _Run) -> dict[str, Any]:
        """The status of the rank this agent started or adopted; under ``_state``."""
        code = run.rank.exit_code()
        ended = run.rank.ended_at() if code is not None else None
        group_alive = run.rank.alive() if not run.stopping else True
        run.scanner.poll()
        state: ServingState = "running"
        if code is not None:
            state = "stopped" if run.stopped_by_us else "exited"
        return {
            "state": state,
            "stopping": run.stopping,
            "profile": run.profile,
            "argv": self.shown_argv(run.argv),
            "pid": run.rank.pid,
            "pgid": None,
            **run.rank.describe(),
            "started_at": iso_time(run.started_at),
            "stopped_at": None if run.stopped_at is None else iso_time(run.stopped_at),
            # When its main process ended (Docker's die, or the agent's first sight):
            # the controller's time of death for a rank that exited on its own.
            "ended_at": None if ended is None else iso_time(ended),
            # Not a health signal: vLLM can exit 0 after an illegal memory
            # access (vllm #53726).
            "exit_code": code if code is not None and code >= 0 else None,
            "exit_signal": _signal_name(code),
            "group_alive": group_alive,
            "killed": run.killed,
            "killed_by": run.killed_by,
            "stacks": run.stacks,
            "requested": run.requested.to_json(),
            "effective": run.scanner.effective.to_json(),
            "effective_matches_profile": effective_matches(run.requested, run.scanner.effective),
            "effective_safe": effective_safe(run.requested, run.scanner.effective),
        }


def _signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def disabled_status() -> dict[str, Any]:
    """``serving`` in /v1/state on a node whose launcher is off."""
    return {"enabled": False, "state": "not_started"}
