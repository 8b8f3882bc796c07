"""The serving launcher: starts and stops this node's vLLM rank
(docs/design.md, "Serving restart").

The launch command is the operator's (``serving.command``: ``vllm serve ...``,
a script, ``docker run ...``) with a profile merged in
(:mod:`spark_watchdog.profiles`). It runs without a shell, in a session
and process group of its own, with stdout and stderr appended to
``serving.log_file``.

Why the process *group*: killing only vLLM's API server leaves the engine and
worker processes alive and holding the GPU (vllm #55510), and a rank cannot
rejoin a multi-node cluster alone, so a restart must leave nothing behind.
:meth:`ServingLauncher.stop` sends SIGTERM to the whole group, waits
``stop_timeout``, then SIGKILLs the group, and reports failure if anything in
it survives even that (a process stuck in the GPU driver cannot be killed).
:meth:`ServingLauncher.start` refuses while anything of the previous group, or
any process matching ``probes.vllm.process_match``, still lives
(docs/facts.md, "Multi-node serving"). Processes that leave the group on
purpose (``setsid``, containers started by a daemon) are out of reach of a
group signal: such commands need their own way down.

The exit code is reported but is not a health signal: after an illegal memory
access vLLM's API server can exit with code 0 (vllm #53726).

The *effective* ``cudagraph_mode`` and ``enable_adaptive_verification`` are
read from the rank's own startup line in the log, the one vLLM's engine core
prints as ``Initializing a V1 LLM engine (vX) with config: ...
speculative_config=..., compilation_config=...``. Some builds silently force
FULL_AND_PIECEWISE while adaptive verification is on (vllm #56626), so what
the argv asked for is not proof of what runs. Only the log written since the
start is read, incrementally and in bounded chunks.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psutil

from spark_watchdog.agent.probe_runner import iso_time
from spark_watchdog.agent.stacks import as_log_lines, dump_stacks
from spark_watchdog.config.agent import ServingConfig
from spark_watchdog.errors import WatchdogError
from spark_watchdog.probes.vllm import rank_process_alive
from spark_watchdog.profiles import (
    COMPILATION_FLAG,
    SPECULATIVE_FLAG,
    EffectiveConfig,
    ProfileError,
    apply_profile,
    effective_matches,
    effective_safe,
    flag_json,
)
from spark_watchdog.redact import redact_argv

log = logging.getLogger("spark_watchdog.agent.serving")

ServingState = Literal["not_started", "running", "exited", "stopped"]

# After SIGKILL the kernel needs a moment to tear processes down (and a process
# in uninterruptible sleep never goes): how long to wait before calling it failed.
KILL_GRACE = 10.0
_POLL = 0.05
# Bounds on reading the serving log: per status call, and for one line. vLLM's
# config line is a few KB; a rank that floods its log must not stall the agent.
LOG_READ_LIMIT = 256 * 1024
LOG_LINE_LIMIT = 1024 * 1024

# Variables systemd hands the agent that are about the agent, not the rank
# (sd_notify(3), sd_listen_fds(3), systemd.exec(5) $CREDENTIALS_DIRECTORY): a
# child that found NOTIFY_SOCKET could speak for the agent, and the agent's
# credentials (the serving token) are none of the rank's business.
_AGENT_ONLY_ENV = (
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "CREDENTIALS_DIRECTORY",
)


class ServingError(WatchdogError):
    """A serving request could not be carried out."""


class UnknownProfile(ServingError):
    def __init__(self, name: str, known: list[str]) -> None:
        self.name = name
        self.known = known
        super().__init__(f'unknown profile "{name}"; known profiles: {", ".join(known)}')


class ServingConflict(ServingError):
    """Refused because of the state things are in (old rank alive, busy)."""


class LaunchFailed(ServingError):
    """The command could not be started (not found, log not writable, ...)."""


class StopFailed(ServingError):
    """Processes of the rank's group survived SIGKILL."""


# --- the effective config, from the rank's startup line ------------------------

# vLLM's CUDAGraphMode (vllm/config/compilation.py): NONE=0, PIECEWISE=1, FULL=2,
# FULL_DECODE_ONLY=(FULL, NONE), FULL_AND_PIECEWISE=(FULL, PIECEWISE).
_MODE_BY_VALUE = {
    "0": "NONE",
    "1": "PIECEWISE",
    "2": "FULL",
    "2,0": "FULL_DECODE_ONLY",
    "2,1": "FULL_AND_PIECEWISE",
}
# The line that carries the engine's resolved config. V1 prints "Initializing a
# V1 LLM engine (v0.10.0) with config: ...", V0 "Initializing an LLM engine ...".
_CONFIG_LINE = "with config:"
# The key on its own: not the tail of another (draft_cudagraph_mode, a.cudagraph_mode).
_KEY = r"""(?<![\w.])['"]?{}['"]?\s*[:=]\s*"""
# The mode is read from the compilation config when the line names one: another
# part of the line (a draft model's own config) may carry a mode of its own.
_COMPILATION_SECTION = re.compile(r"""['"]?compilation_config['"]?\s*[:=]""")
# Three shapes seen in vLLM's config line across versions:
#   'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>   (repr, v0.11+)
#   "cudagraph_mode":[2,1]                                          (JSON, v0.10)
#   cudagraph_mode=CUDAGraphMode.PIECEWISE / "cudagraph_mode":"FULL"
_MODE_NAME = re.compile(
    _KEY.format("cudagraph_mode") + r"""['"]?<?(?:CUDAGraphMode\.)?([A-Z][A-Z_]+)\b"""
)
_MODE_VALUE = re.compile(
    _KEY.format("cudagraph_mode") + r"(\[\s*\d\s*,\s*\d\s*\]|\(\s*\d\s*,\s*\d\s*\)|\d)(?!\d)"
)
_ADAPTIVE = re.compile(_KEY.format("enable_adaptive_verification") + r"(True|False|true|false)\b")


def normalise_cudagraph_mode(value: object) -> str | None:
    """A cudagraph_mode as vLLM accepts it (name in any case, value, [2, 0]) → its name."""
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return _MODE_BY_VALUE.get(text)
        return text.upper() or None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return _MODE_BY_VALUE.get(str(value))
    if isinstance(value, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return _MODE_BY_VALUE.get(",".join(str(v) for v in value))
    return None


def parse_effective(line: str) -> EffectiveConfig | None:
    """The effective config in one log line, or None if it is not a config line."""
    if _CONFIG_LINE not in line:
        return None
    mode: str | None = None
    section = _COMPILATION_SECTION.search(line)
    where = line[section.end() :] if section is not None else line
    named = _MODE_NAME.search(where)
    if named is not None:
        mode = named.group(1)
    else:
        valued = _MODE_VALUE.search(where)
        if valued is not None:
            mode = _MODE_BY_VALUE.get(re.sub(r"[\s\[\]()]", "", valued.group(1)))
    adaptive_match = _ADAPTIVE.search(line)
    adaptive = None if adaptive_match is None else adaptive_match.group(1).lower() == "true"
    return EffectiveConfig(mode, adaptive)


def requested_config(argv: list[str]) -> EffectiveConfig:
    """What ``argv`` asks vLLM for, in the terms :func:`parse_effective` reports."""
    compilation = flag_json(argv, COMPILATION_FLAG) or {}
    speculative = flag_json(argv, SPECULATIVE_FLAG) or {}
    mode = compilation.get("cudagraph_mode")
    adaptive = speculative.get("enable_adaptive_verification")
    return EffectiveConfig(
        normalise_cudagraph_mode(mode) if mode is not None else None,
        adaptive if isinstance(adaptive, bool) else None,
    )


class LogScanner:
    """Reads a log from ``offset`` on, a bounded chunk per :meth:`poll`, and keeps
    the last effective config line seen. A log that shrank was rotated or
    truncated: reading starts again at its beginning."""

    def __init__(
        self,
        path: Path,
        offset: int,
        read_limit: int = LOG_READ_LIMIT,
        line_limit: int = LOG_LINE_LIMIT,
    ) -> None:
        self.path = path
        self.offset = offset
        self.read_limit = read_limit
        self.line_limit = line_limit
        self.effective = EffectiveConfig()
        self._partial = b""
        self._skipping = False  # inside a line longer than line_limit

    def poll(self) -> None:
        try:
            with self.path.open("rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size < self.offset:
                    self.offset, self._partial, self._skipping = 0, b"", False
                handle.seek(self.offset)
                chunk = handle.read(self.read_limit)
        except OSError:
            return  # gone or unreadable: status says what it knew
        self.offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            if self._skipping:
                self._skipping = False
                continue
            self._scan(raw)
        if len(self._partial) > self.line_limit:
            self._partial, self._skipping = b"", True

    def _scan(self, raw: bytes) -> None:
        if _CONFIG_LINE.encode() not in raw:
            return
        found = parse_effective(raw.decode("utf-8", "replace"))
        if found is not None:
            self.effective = found


# --- the launcher ----------------------------------------------------------------


@dataclass
class _Run:
    argv: list[str]
    profile: str
    process: subprocess.Popen[bytes]
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
    # Once the group is seen empty its id may be reused: never signal it again.
    group_gone: bool = False

    @property
    def pgid(self) -> int:
        return self.process.pid  # start_new_session: the child leads its own group


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in group ``pgid``. kill(pgid, 0) alone also
    counts zombies, which hold nothing and may linger where no init reaps."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass  # someone else's process in it: look closer
    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.info["pid"]) == pgid:
                members.append(int(proc.info["pid"]))
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


class ServingLauncher:
    """Starts and stops the rank; every method is safe to call from any thread.

    One operation (start or stop) runs at a time; a second one meanwhile is
    refused as busy rather than queued, so requests never pile up behind a slow
    stop. :meth:`status` never waits for an operation.
    """

    def __init__(self, config: ServingConfig, *, process_match: str | None = None) -> None:
        self.config = config
        self.process_match = process_match
        self.profiles = config.all_profiles()
        self._operation = threading.Lock()
        self._state = threading.Lock()
        self._run: _Run | None = None

    @property
    def profile_names(self) -> list[str]:
        return sorted(self.profiles)

    def shown_argv(self, argv: list[str]) -> list[str]:
        """The argv as shown and logged: secret values (``serving.secret_flags``
        and the built-in ones, :mod:`spark_watchdog.redact`) read ``***``. The
        process itself is started with the real one."""
        return redact_argv(argv, self.config.secret_flags)

    # -- start ------------------------------------------------------------------

    def start(self, profile: str | None = None) -> dict[str, Any]:
        """Launch the rank with ``profile`` (default ``serving.default_profile``)."""
        name = profile or self.config.default_profile
        if name not in self.profiles:
            raise UnknownProfile(name, self.profile_names)
        if not self._operation.acquire(blocking=False):
            raise ServingConflict("busy: another start or stop is in progress; retry")
        try:
            self._refuse_if_alive()
            try:
                argv = apply_profile(self.config.command, self.profiles[name])
            except ProfileError as exc:  # checked at config load; kept for safety
                raise LaunchFailed(f"profile {name}: {exc}") from None
            run = self._spawn(argv, name)
            with self._state:
                self._run = run
            log.info(
                "serving: started profile %s, pid %d: %s",
                name,
                run.process.pid,
                shlex.join(self.shown_argv(argv)),
                extra={"profile": name, "pid": run.process.pid},
            )
        finally:
            self._operation.release()
        return self.status()

    def _refuse_if_alive(self) -> None:
        with self._state:
            run = self._run
        if run is not None:
            members = self._members(run)
            if members:
                raise ServingConflict(
                    f"the previous rank's process group {run.pgid} still has live "
                    f"processes (pids {', '.join(map(str, members[:10]))}); stop it first"
                )
        if self.process_match and rank_process_alive(self.process_match):
            raise ServingConflict(
                f'a process matching probes.vllm.process_match "{self.process_match}" '
                "still runs (an old rank not started by this agent?); stop it first"
            )

    def _spawn(self, argv: list[str], profile: str) -> _Run:
        path = Path(self.config.log_file)
        env = {k: v for k, v in os.environ.items() if k not in _AGENT_ONLY_ENV}
        env.update(self.config.environment)
        started_at = time.time()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o640)
        except OSError as exc:
            raise LaunchFailed(
                f"serving.log_file: cannot open {path} for appending: {exc.strerror or exc}"
            ) from None
        with os.fdopen(fd, "ab") as sink:
            header = (
                f"--- spark-watchdog {iso_time(started_at)}: starting the rank with "
                f"profile {profile}: {shlex.join(self.shown_argv(argv))}\n"
            )
            sink.write(header.encode())
            sink.flush()
            offset = os.fstat(sink.fileno()).st_size
            try:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    cwd=self.config.working_directory,
                    env=env,
                    close_fds=True,
                    start_new_session=True,
                )
            except OSError as exc:
                sink.write(f"--- spark-watchdog: launch failed: {exc}\n".encode())
                raise LaunchFailed(
                    f"serving.command: cannot start {argv[0]!r}: {exc.strerror or exc}"
                ) from None
        return _Run(
            argv=argv,
            profile=profile,
            process=process,
            started_at=started_at,
            scanner=LogScanner(path, offset),
            requested=requested_config(argv),
        )

    # -- stop -------------------------------------------------------------------

    def stop(self) -> dict[str, Any]:
        """SIGTERM the rank's group, SIGKILL it after ``stop_timeout``. Idempotent."""
        if not self._operation.acquire(blocking=False):
            raise ServingConflict("busy: another start or stop is in progress; retry")
        try:
            with self._state:
                run = self._run
            if run is None or not self._members(run):
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
            run.stopped_by_us = run.process.poll() is None
        try:
            self._signal(run, signal.SIGTERM)
            gone = self._wait_gone(run, self.config.stop_timeout)
            if not gone:
                log.warning(
                    "serving: group %d still alive %.0f s after SIGTERM; SIGKILL",
                    run.pgid,
                    self.config.stop_timeout,
                )
                run.killed = True
                self._signal(run, signal.SIGKILL)
                gone = self._wait_gone(run, KILL_GRACE)
        finally:
            with self._state:
                run.stopping = False
                run.stopped_at = time.time()
        took = time.monotonic() - began
        how = "SIGKILL" if run.killed else "SIGTERM"
        self._note(f"stop: {how} to process group {run.pgid}; after {took:.1f} s gone={gone}")
        if not gone:
            left = self._members(run)
            raise StopFailed(
                f"process group {run.pgid} survived SIGKILL (pids "
                f"{', '.join(map(str, left[:10]))}): uninterruptible sleep in the driver? "
                "a power cycle may be the only way out"
            )
        log.info("serving: stopped group %d with %s in %.1f s", run.pgid, how, took)

    def _dump_stacks(self, run: _Run) -> None:
        """Where the rank's processes are, before they are signalled (bounded)."""
        if not self.config.stack_dump or run.group_gone:
            return
        pids = _group_members(run.pgid) or [run.pgid]
        record = dump_stacks(
            pids, self.config.stack_dump_timeout, secret_flags=self.config.secret_flags
        )
        with self._state:
            run.stacks = record
        self._note(as_log_lines(record))

    def kill_now(self, by: str) -> dict[str, Any] | None:
        """SIGKILL the rank's whole group at once, without SIGTERM and without
        waiting for a start or stop in progress: the memory guard's way, when
        the host has seconds left. The group and the pids it had, or None when
        nothing of the rank lives. Never waits: the rank is reaped later."""
        with self._state:
            run = self._run
            if run is None:
                return None
            members = self._members(run)
            if not members:
                return None
            run.stopped_by_us = run.process.poll() is None
            run.killed = True
            run.killed_by = by
            run.stopped_at = time.time()
            self._signal(run, signal.SIGKILL)
        self._note(f"{by}: SIGKILL to process group {run.pgid} (pids {members[:10]})")
        return {"pgid": run.pgid, "pids": members}

    def _signal(self, run: _Run, signum: signal.Signals) -> None:
        if run.group_gone:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pgid, signum)

    def _wait_gone(self, run: _Run, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            if not self._members(run):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)

    def _members(self, run: _Run) -> list[int]:
        """Live processes of the run's group; reaps the leader as a side effect."""
        if run.group_gone:
            return []
        if run.process.poll() is None:
            return [run.pgid]  # the leader itself is alive: no need to look further
        members = _group_members(run.pgid)
        if not members:
            run.group_gone = True
        return members

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
            "default_profile": self.config.default_profile,
            "profiles": self.profile_names,
            "log_file": self.config.log_file,
        }
        with self._state:
            run = self._run
            if run is None:
                return {
                    **base,
                    "state": "not_started",
                    "stopping": False,
                    "profile": None,
                    "argv": None,
                    "pid": None,
                    "pgid": None,
                    "started_at": None,
                    "stopped_at": None,
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
            code = run.process.poll()
            group_alive = bool(self._members(run)) if not run.stopping else True
            run.scanner.poll()
            state: ServingState = "running"
            if code is not None:
                state = "stopped" if run.stopped_by_us else "exited"
            return {
                **base,
                "state": state,
                "stopping": run.stopping,
                "profile": run.profile,
                "argv": self.shown_argv(run.argv),
                "pid": run.process.pid,
                "pgid": run.pgid,
                "started_at": iso_time(run.started_at),
                "stopped_at": None if run.stopped_at is None else iso_time(run.stopped_at),
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
                "effective_matches_profile": effective_matches(
                    run.requested, run.scanner.effective
                ),
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
