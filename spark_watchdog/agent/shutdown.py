"""Is the whole machine going down, or only the agent? Asked once, at SIGTERM.

The answer goes into ``stopping.system`` of ``/v1/state``, so the controller
never mistakes a planned reboot for a frozen host, and decides whether the
agent lingers a moment (``shutdown_linger``) before it exits.

How it is found out, and why this way:

- ``systemctl is-system-running`` prints the manager's SystemState, and
  ``stopping`` means "the manager is shutting down" (systemctl(1), table
  "Manager Operational States"). PID 1 derives it from its job queue on
  every request: ``manager_state()`` in systemd's src/core/manager.c returns
  ``MANAGER_STOPPING`` as soon as ``shutdown.target`` is active *or has a
  job queued*. And a system shutdown reaches the agent only through that
  job: the agent is stopped at reboot, poweroff, halt or kexec because of
  its default dependencies ``Conflicts=`` and ``Before=shutdown.target``
  (systemd.special(7) "shutdown.target", systemd.service(5) "Default
  Dependencies"), so when SIGTERM arrives the start job for shutdown.target
  is already queued and the state already says ``stopping``; a plain
  ``systemctl restart``/``stop`` of the agent leaves it ``running`` (or
  ``degraded``). No D-Bus library is needed here: systemctl speaks to the
  system bus itself; the unit is ordered ``After=dbus.service`` so that the
  bus is stopped after the agent at shutdown (systemd.unit(5) "Before=,
  After=": stop order is the reverse of start order).
- ``manager_state()`` answers ``initializing``/``starting`` until boot has
  finished, even with a shutdown queued; only then ``systemctl list-jobs
  shutdown.target`` is asked too, which lists that queued job.
- Rejected: ``/run/nologin`` is written by systemd-user-sessions.service's
  ExecStop (systemd-user-sessions.service(8)), a unit the agent is not
  ordered against, so it may not exist yet when SIGTERM arrives; it also
  exists during early boot (tmpfiles.d systemd-nologin.conf) and whenever an
  operator creates it. ``/run/systemd/shutdown/scheduled`` is written only by
  logind's ScheduleShutdown (``shutdown +N``), never by an immediate
  ``systemctl reboot``. The D-Bus property itself (org.freedesktop.systemd1
  Manager.SystemState) is the same answer systemctl prints, at the price of
  a D-Bus client in the agent.

It runs a subprocess with a short timeout, so it is called once, off the
event loop (:func:`asyncio.to_thread`), never in the heartbeat. Any failure
(no systemd, no systemctl, no bus, a timeout) answers False: the agent then
exits promptly, exactly as it did before this existed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence

from spark_watchdog.child_run import ChildNotStarted, run_child_blocking

log = logging.getLogger("spark_watchdog.agent.shutdown")

# Asked while systemd waits for the agent to exit (TimeoutStopSec=15s in the
# unit): at most two calls of this many seconds, then the linger.
SYSTEMCTL_TIMEOUT = 2.0
# sd_booted(3): this directory exists only when systemd is PID 1.
SYSTEMD_RUN_DIR = "/run/systemd/system"
SHUTDOWN_TARGET = "shutdown.target"

# The seam the agent takes: True when the whole system is going down.
SystemStopping = Callable[[], bool]


def _systemctl(systemctl: str, args: Sequence[str], timeout: float) -> str | None:
    """systemctl's stdout, stripped; None when it could not be run in time.
    is-system-running exits non-zero for every state but ``running``, so the
    exit status says nothing here: only the printed state counts."""
    try:
        ran = run_child_blocking(
            [systemctl, *args],
            timeout=timeout,
            environment={**os.environ, "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"},
            head_bytes=4096,
            tail_bytes=0,
        )
    except ChildNotStarted as exc:
        log.warning("%s %s: cannot run: %s", systemctl, " ".join(args), exc)
        return None
    if ran.timed_out:
        log.warning("%s %s: no answer within %.1f s", systemctl, " ".join(args), timeout)
        return None
    return ran.stdout.text().strip()


def system_shutting_down(
    *,
    systemctl: str = "systemctl",
    timeout: float = SYSTEMCTL_TIMEOUT,
    run_dir: str = SYSTEMD_RUN_DIR,
) -> bool:
    """True when systemd is taking the whole system down (reboot, poweroff, ...)."""
    if not os.path.isdir(run_dir):
        return False  # not booted with systemd: nobody to ask
    state = _systemctl(systemctl, ["is-system-running"], timeout)
    if state == "stopping":
        return True
    if state in ("initializing", "starting"):
        # Boot not finished: manager_state() says so even with a shutdown
        # queued. A queued shutdown.target job is listed by list-jobs.
        jobs = _systemctl(
            systemctl, ["list-jobs", "--no-legend", "--no-pager", SHUTDOWN_TARGET], timeout
        )
        return jobs is not None and any(
            SHUTDOWN_TARGET in line.split() for line in jobs.splitlines()
        )
    return False
