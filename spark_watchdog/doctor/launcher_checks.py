"""Doctor's check of ``serving.launcher``: before an incident, the cluster
launcher's commands can be found where they will run (docs/serving.md)."""

from __future__ import annotations

import os
import shutil

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.serving.launcher_commands import SshRunner
from spark_watchdog.doctor.result import Finding, fail, ok
from spark_watchdog.errors import ConfigError

REMOTE_TIMEOUT_S = 20.0


def _local_program(program: str, working_directory: str | None) -> str | None:
    """Where ``program`` runs from on this host, or None where it cannot run."""
    if "/" in program:
        path = os.path.join(working_directory or os.getcwd(), program)
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return shutil.which(program)


async def check_launcher(config: ControllerConfig) -> Finding:
    launcher = config.serving.launcher
    if launcher.type == "agents":
        return ok(f"the agents stop and start the ranks ({launcher.order} order)")
    programs = {launcher.stop[0], launcher.start[0]}
    where = launcher.working_directory
    if launcher.run_on == "controller":
        missing = sorted(p for p in programs if _local_program(p, where) is None)
        if missing:
            return fail(
                f"serving.launcher: {', '.join(missing)} cannot run on this host"
                + (f" (from {where})" if where else ""),
                "install the launcher here, give its absolute path, or set "
                "serving.launcher.working_directory to where it lives",
            )
        return ok(f"the launcher's stop and start run here ({', '.join(sorted(programs))})")
    node = config.node(launcher.run_on)
    assert launcher.ssh is not None and node.ssh_host is not None  # checked at load
    try:
        runner = SshRunner(node.ssh_host, node.ssh_port, launcher.ssh, where)
    except (ConfigError, ValueError) as exc:
        return fail(f"serving.launcher.ssh: {exc}", "correct serving.launcher.ssh")
    missing = []
    for program in sorted(programs):
        # POSIX sh's own lookup, as the remote shell will do it: nothing is started.
        probe = ["sh", "-c", 'command -v "$1" >/dev/null', "sh", program]
        result = await runner.run("check", probe, {}, REMOTE_TIMEOUT_S)
        if result.end != "exited":
            return fail(
                f"serving.launcher on {launcher.run_on}: {result.detail}",
                "make the node reachable over SSH with serving.launcher.ssh's key and host key",
            )
        if result.exit_code != 0:
            missing.append(program)
    if missing:
        return fail(
            f"serving.launcher: {', '.join(missing)} cannot run on {launcher.run_on}"
            + (f" (from {where})" if where else ""),
            f"install the launcher on {launcher.run_on} or correct its path",
        )
    return ok(
        f"the launcher's stop and start run on {launcher.run_on} over SSH "
        f"({', '.join(sorted(programs))})"
    )
