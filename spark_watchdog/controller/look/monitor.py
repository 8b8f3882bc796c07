"""The controller's eyes: it looks at every node and writes what it sees; it decides nothing.

Each sweep asks the witness and every agent at once, starts the SSH banner
checks that are due (in the background: a silent host holds one for
``banner_timeout``), takes what each agent says it saw of its peers
(controller/look/peer_evidence.py), and gives each node the detector's verdict
(controller/decide/detector.py). What it learns goes into the node's ``NodeWatch``
and the flight recorder, never into the history: the controller's act side
(controller/daemon.py) decides on it. ``still_frozen`` is the last look
before a cut, ``boots`` a node's own account of how its boots ended.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.decide.detector import DetectionPolicy, Verdict, classify
from spark_watchdog.controller.io import ControllerIO
from spark_watchdog.controller.look.flight_recorder import FlightRecorder
from spark_watchdog.controller.look.http_client import ANSWERED, HttpError
from spark_watchdog.controller.look.node_watch import (
    BLIND_BANNER_OUTCOMES,
    LIVE_BANNER_OUTCOMES,
    NodeWatch,
)
from spark_watchdog.controller.look.peer_evidence import group_sightings, sightings

log = logging.getLogger("spark_watchdog.controller")

# A late agent's host gets a banner check this often (OpenSSH >= 9.8 penalises
# clients that connect without authenticating: PerSourcePenalties).
LATE_BANNER_INTERVAL_S = 2.0


class Monitor:
    def __init__(
        self,
        config: ControllerConfig,
        io: ControllerIO,
        watches: dict[str, NodeWatch],
        policy: DetectionPolicy,
    ) -> None:
        self.config = config
        self.io = io
        self.clock = io.clock
        self.watches = watches
        self.policy = policy
        self.recorder = FlightRecorder(config.detection.flight_recorder_seconds)
        self.witness_ok = True
        self.witness_detail = "not checked yet"
        self._banner_checks: dict[str, asyncio.Task[None]] = {}

    def tasks(self) -> list[asyncio.Task[None]]:
        """The banner checks in flight."""
        return list(self._banner_checks.values())

    async def sweep(self) -> list[tuple[NodeWatch, Verdict]]:
        """Look at every node once; the nodes whose verdict changed, each with the one before."""
        witness, _ = await asyncio.gather(
            self.io.witness(self.config.witness, 1.0),
            asyncio.gather(*(self._poll_agent(w) for w in self.watches.values())),
        )
        self.witness_ok = witness.ok
        self.witness_detail = "ok" if witness.ok else f"unreachable: {', '.join(witness.missed)}"
        now = self.clock.monotonic()
        for watch in self.watches.values():
            self._check_banner(watch, now)
        head = self.config.serving.head
        changed: list[tuple[NodeWatch, Verdict]] = []
        for watch in self.watches.values():
            judges = head is None or watch.name == head
            before = watch.finding.verdict
            watch.finding = classify(watch.observation(now, witness.ok, judges), self.policy)
            if watch.finding.verdict is not before:
                changed.append((watch, before))
        return changed

    async def still_frozen(self, watch: NodeWatch) -> tuple[bool, str]:
        """Right before cutting power: the witness, the agent and the banner, all at once.

        Any HTTP answer from the agent and any SSH answer (banner, refusal,
        close) mean a live host; a witness that does not answer or a host the
        controller cannot look at means no fencing now.
        """
        node = watch.config
        timeout = self.config.detection

        async def agent() -> str | None:
            try:
                answer = await self.io.agents.get(node, "/v1/state", timeout.agent_timeout)
            except HttpError as exc:
                watch.note_answer_error(exc.kind, str(exc), self.clock.monotonic())
                return "the agent answered" if exc.kind == ANSWERED else None
            self._note_agent_answer(watch, answer.status, answer.body)
            return f"the agent answered (HTTP {answer.status})"

        async def banner() -> str | None:
            result = await self.io.banner(node.banner_host, node.ssh_port, timeout.banner_timeout)
            watch.note_banner(
                result.outcome, result.banner or result.outcome, self.clock.monotonic()
            )
            if result.outcome in LIVE_BANNER_OUTCOMES:
                return f"ssh {result.outcome}" + (f" ({result.banner})" if result.banner else "")
            if result.outcome in BLIND_BANNER_OUTCOMES:
                return f"cannot look: ssh {result.outcome}"
            return None

        witness, alive_agent, alive_ssh = await asyncio.gather(
            self.io.witness(self.config.witness, 1.0), agent(), banner()
        )
        if not witness.ok:
            return False, f"witness unreachable ({', '.join(witness.missed)}): no fencing"
        for why in (alive_agent, alive_ssh):
            if why is not None:
                return False, why
        if watch.agent_blind is not None:
            return False, f"cannot look: {watch.agent_blind}"
        now, seen = self.clock.monotonic(), watch.peer_seen
        if seen is not None and now - seen.at < self.policy.freeze_after:
            return False, f"alive to its peers: {seen.describe(now)}"
        return True, f"agent silent, ssh {watch.banner_detail}"

    async def boots(self, watch: NodeWatch) -> list[dict[str, Any]]:
        """The agent's journal analysis of the node's boots ([]: it could not be read)."""
        try:
            answer = await self.io.agents.get(watch.config, "/v1/boots", 5.0)
            boots = answer.json().get("boots", [])
        except (HttpError, AttributeError) as exc:
            log.warning("%s: could not read /v1/boots: %s", watch.name, exc)
            return []
        return [b for b in boots if isinstance(b, dict)] if isinstance(boots, list) else []

    def _note_agent_answer(self, watch: NodeWatch, status: int, body: bytes) -> None:
        """An HTTP answer: life in any case; a snapshot when it is a 200 with a JSON object."""
        before, dropped = watch.snapshot, watch.intake_dropped
        wall, now = self.clock.time(), self.clock.monotonic()
        watch.note_http_answer(status, body, now, wall)
        if watch.intake_dropped and watch.intake_dropped != dropped:
            # What the intake left out (controller/look/intake.py), once per change.
            log.warning(
                "%s: /v1/state taken without: %s", watch.name, "; ".join(watch.intake_dropped)
            )
        if watch.snapshot is not None and watch.snapshot is not before:
            self.recorder.note(watch.name, watch.snapshot, wall)
            # What it saw of its peers counts from now, before anything else runs.
            seen = sightings([watch], self.watches, now, self.policy.freeze_after)
            if watch.name == self.config.serving.head:
                # The head's engine steps: every rank of its step group was alive.
                group = self.config.serving.step_nodes()
                seen.update(
                    (name, sighting)
                    for name, sighting in group_sightings(
                        watch, group, now, self.policy.freeze_after
                    ).items()
                    if name not in seen or sighting.at > seen[name].at
                )
            for name, sighting in seen.items():
                self.watches[name].note_sighting(sighting)

    async def _poll_agent(self, watch: NodeWatch) -> None:
        try:
            answer = await self.io.agents.get(
                watch.config, "/v1/state", self.config.detection.agent_timeout
            )
        except HttpError as exc:
            watch.note_answer_error(exc.kind, str(exc), self.clock.monotonic())
            return
        self._note_agent_answer(watch, answer.status, answer.body)

    def _check_banner(self, watch: NodeWatch, now: float) -> None:
        node = watch.config
        late = watch.agent_silent_s(now) >= watch.late_after
        since = None if watch.banner_checked_at is None else now - watch.banner_checked_at
        # A late agent gets a banner check every LATE_BANNER_INTERVAL_S, not
        # every poll: a 1 s poller would be penalised as a scanner.
        due = since is None or since >= (
            LATE_BANNER_INTERVAL_S if late else self.config.detection.banner_interval
        )
        if not due or watch.name in self._banner_checks:
            return
        # In the background: a silent host holds a check for banner_timeout,
        # which must not stretch the poll of every other node.
        watch.banner_checked_at = now

        async def check() -> None:
            try:
                result = await self.io.banner(
                    node.banner_host, node.ssh_port, self.config.detection.banner_timeout
                )
                watch.note_banner(
                    result.outcome, result.banner or result.outcome, self.clock.monotonic()
                )
            finally:
                self._banner_checks.pop(watch.name, None)

        self._banner_checks[watch.name] = asyncio.get_running_loop().create_task(check())
