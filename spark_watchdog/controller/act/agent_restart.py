"""agent_down: the host answers SSH but its agent does not. An alert, and a
restart of the agent over SSH in the background, at most once per
``AGENT_RESTART_COOLDOWN_S`` per node (docs/design.md, "Verdicts"): what
controller/decide/decisions.py decides from ``cooling`` and ``running``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from spark_watchdog.config.controller import ControllerConfig, SshDevice
from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.io import ControllerIO
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record.ledger import HistoryUnwritable, Ledger
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.errors import WatchdogError

log = logging.getLogger("spark_watchdog.controller")

AGENT_RESTART_COOLDOWN_S = 300.0


class AgentRestarts:
    """The agent restarts over SSH this controller process has under way."""

    def __init__(
        self,
        config: ControllerConfig,
        ledger: Ledger,
        notifier: Notifier,
        clock: Clock,
        io: ControllerIO,
        check_leading: Callable[[], None] = lambda: None,
    ) -> None:
        self.check_leading = check_leading
        self.config = config
        self.ledger = ledger
        self.notifier = notifier
        self.clock = clock
        self.io = io
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def cooling(self, watch: NodeWatch, now: float) -> bool:
        """The node's agent was restarted within the cooldown."""
        return now - watch.conduct.last_agent_restart < AGENT_RESTART_COOLDOWN_S

    def running(self, node: str) -> bool:
        task = self.tasks.get(node)
        return task is not None and not task.done()

    def restart(self, watch: NodeWatch) -> None:
        """Alert, and restart the node's agent over SSH in the background
        (controller/decide/decisions.py decided it may: no restart running, none cooling)."""
        watch.conduct.agent_restarted(self.clock.monotonic())
        self.notifier.send(
            Event("agent_down", f"{watch.name}: {watch.finding.summary}", watch.name)
        )
        ssh = next((d for d in watch.config.power if isinstance(d, SshDevice)), None)
        if ssh is None or self.config.guards.dry_run:
            return
        self.tasks[watch.name] = asyncio.get_running_loop().create_task(self._run(watch, ssh))

    async def _run(self, watch: NodeWatch, ssh: SshDevice) -> None:
        try:
            # Recorded first: the action is in the history whatever the command does.
            await self.ledger.write(
                self.ledger.store.record_action,
                watch.name,
                "agent_restart",
                device=f"ssh {ssh.host}:{ssh.port}",
            )
            self.check_leading()  # a controller of a pair that may not act: NotLeading
            outcome = await self.io.agent_restart(ssh)
            log.info("%s: agent restart over ssh: %s", watch.name, outcome)
        except (HistoryUnwritable, WatchdogError, OSError) as exc:
            log.warning("%s: agent restart over ssh failed: %s", watch.name, exc)
