"""What this controller hears of the other controllers on the Sparks.

Each sweep asks every other controller's ``/v1/status`` on each of its URLs
(its management address and, where cabled, its fabric one). A controller is
*heard* when an answer names the node it runs on and shows its loop moved
on since the last one (a hung loop behind a live HTTP thread is silence).
What it claims (the nodes it has an incident or a ladder for) and its order
are kept from that answer. A gap in this controller's own sweeps of half
``takeover_after`` or more (it was paused, or its host was) starts a new
listening spell, as a start does (docs/design.md, "Controllers on the Sparks").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any

from spark_watchdog.config.colocated import controller_urls
from spark_watchdog.config.controller import ControllerConfig, PolicyConfig
from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.decide.colocation import (
    PeerHeard,
    Placement,
    Standing,
    claimed_elsewhere,
    refusal,
    serving_refusal,
    tells_of,
)
from spark_watchdog.controller.look.http_client import HttpAnswer, HttpError
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.terminal import escape

log = logging.getLogger("spark_watchdog.controller")

# Asks one URL for a controller's status (ControllerIO.controllers).
StatusGet = Callable[[str, float], Awaitable[HttpAnswer]]

MAX_CLAIMS = 1024  # more nodes than any cluster: an answer beyond it is not believed


def off_seconds_at_most(policy: PolicyConfig) -> float:
    """The longest off hold a controller's cycle may have (a clock latch's long cut)."""
    return max(policy.power_off_seconds, policy.clock_latch_off_seconds)


class BadAnswer(ValueError):
    """A controller's status answer that says nothing this controller can trust."""


def read_answer(answer: HttpAnswer, expected: str) -> tuple[tuple[Any, int], PeerHeard]:
    """(its loop's mark, what it says) from a controller's ``/v1/status`` answer.

    :raises BadAnswer: not a 200, not JSON, or not the controller on ``expected``.
    """
    if answer.status != 200:
        raise BadAnswer(f"status {answer.status}")
    try:
        body = answer.json()
    except HttpError as exc:
        raise BadAnswer(str(exc)) from None
    if not isinstance(body, dict):
        raise BadAnswer("not a JSON object")
    placed, ticks, started = body.get("colocated"), body.get("ticks"), body.get("started_at")
    if not isinstance(placed, dict) or not isinstance(ticks, int) or isinstance(ticks, bool):
        raise BadAnswer("no colocated section or no ticks: not a controller on a Spark")
    if placed.get("node") != expected:
        said = escape(str(placed.get("node"))[:64])
        raise BadAnswer(f'it says it runs on "{said}", not {expected}')
    order, claims, holds = placed.get("order"), placed.get("claims"), placed.get("holds")
    lists = (order, claims, holds)
    if not all(isinstance(v, list) for v in lists):
        raise BadAnswer("its order, claims or holds are not lists")
    if not all(_names(v) for v in lists if isinstance(v, list)):
        raise BadAnswer("its order, claims or holds are not lists of node names")
    assert isinstance(order, list) and isinstance(claims, list) and isinstance(holds, list)
    mark = (started if isinstance(started, (int, float, str)) else None, ticks)
    heard = PeerHeard(claims=frozenset(claims), order=tuple(order), holds=frozenset(holds))
    return mark, heard


def _names(values: list[Any]) -> bool:
    return len(values) <= MAX_CLAIMS and all(isinstance(v, str) and v for v in values)


class ControllerPeers:
    """The other controllers of the order, as heard; this controller's own listening."""

    def __init__(
        self,
        config: ControllerConfig,
        me: str,
        get: StatusGet,
        clock: Clock,
        tell: Callable[[str], None] | None = None,
    ) -> None:
        now = clock.monotonic()
        self.clock = clock
        colocated = config.colocated
        assert colocated is not None
        self.placement = Placement(
            me=me,
            order=colocated.order,
            takeover_after=colocated.takeover_after,
            fence_delay=colocated.fence_delay,
            freeze_after=config.detection.freeze_after,
            claim_grace=config.guards.boot_timeout + off_seconds_at_most(config.policy),
        )
        port = config.listen.port
        self.urls = {
            p.node: controller_urls(p, config.node(p.node).agent, port)
            for p in colocated.controllers
            if p.node != me
        }
        self._get = get
        self._timeout = config.detection.agent_timeout
        self.heard: dict[str, PeerHeard] = {name: PeerHeard() for name in self.urls}
        self.detail: dict[str, str] = {name: "not asked yet" for name in self.urls}
        self._marks: dict[str, tuple[Any, int]] = {}
        self.observing_until = now + colocated.takeover_after
        self._last_sweep: float | None = None
        self._started = now
        # An alert, once while it lasts: a heard controller keeps another order.
        self._tell = tell or (lambda summary: None)
        self._disagreeing: set[str] = set()

    async def sweep(self, now: float) -> None:
        """Ask every other controller once; a long gap since the last sweep starts listening."""
        gap = None if self._last_sweep is None else now - self._last_sweep
        if gap is not None and gap >= self.placement.takeover_after / 2:
            self.observing_until = max(self.observing_until, now + self.placement.takeover_after)
            log.warning(
                "this controller's loop stood still %.0fs: listening to the others before acting",
                gap,
            )
        self._last_sweep = now
        await self.listen(now)

    async def listen(self, now: float) -> None:
        """Ask every other controller once, now (a sweep, or a ladder's last look)."""
        await asyncio.gather(*(self._ask(name, now) for name in self.urls))
        self._tell_disagreement()

    def _tell_disagreement(self) -> None:
        """One alert when a controller is heard with another order (every action
        stops while it is heard: decide/colocation.py), again only after it agreed."""
        mine = self.placement.order
        now_disagreeing = {n for n, p in self.heard.items() if p.order not in (None, mine)}
        for name in sorted(now_disagreeing - self._disagreeing):
            theirs = self.heard[name].order or ()
            self._tell(
                f"the controller on {name} keeps the order {', '.join(theirs)}, this one "
                f"{', '.join(mine)}: no controller acts until the configs agree "
                "(spark-watchdog doctor names both)"
            )
        self._disagreeing = now_disagreeing

    async def _ask(self, name: str, now: float) -> None:
        """Every URL of the controller at once (a frozen host's paths all take the
        whole timeout); the first in order that answers well counts."""
        urls = self.urls[name]
        tried = await asyncio.gather(*(self._ask_one(url, name) for url in urls))
        problems = [t for t in tried if isinstance(t, str)]
        for result in tried:
            if isinstance(result, str):
                continue
            mark, said = result
            before = self.heard[name]
            moved = self._marks.get(name) != mark
            self._marks[name] = mark
            self.heard[name] = replace(said, heard_at=now if moved else before.heard_at)
            self.detail[name] = "heard" if moved else "answered, but its loop has not moved on"
            return
        self.detail[name] = "; ".join(problems)

    async def _ask_one(self, url: str, name: str) -> tuple[tuple[Any, int], PeerHeard] | str:
        """What the controller said at ``url``, or why it said nothing usable."""
        try:
            return read_answer(await self._get(url, self._timeout), name)
        except (HttpError, BadAnswer) as exc:
            return f"{url}: {exc}"

    def standing(self, now: float) -> Standing:
        return Standing(
            now=now,
            observing_until=self.observing_until,
            peers=dict(self.heard),
            last_sweep=self._last_sweep,
        )

    def tells_of(self, watch: NodeWatch) -> bool:
        """Whether this controller alerts about the node (its first heard actor)."""
        return tells_of(watch.name, self.placement, self.standing(self.clock.monotonic()))

    def refusal_for(self, node: str, last_life_at: float | None, now: float) -> str | None:
        """Why another controller acts for ``node`` now (None: this one does)."""
        silent_for = now - (self._started if last_life_at is None else last_life_at)
        return refusal(node, self.placement, self.standing(now), silent_for)

    def not_mine(self, watch: NodeWatch) -> str | None:
        """Why another controller acts for the node now (None: this one does)."""
        return self.refusal_for(watch.name, watch.last_life_at, self.clock.monotonic())

    async def claimed_elsewhere(self, watch: NodeWatch) -> str | None:
        """Which other controller is recovering the node, asked afresh (None: none)."""
        now = self.clock.monotonic()
        await self.listen(now)
        return claimed_elsewhere(watch.name, self.placement, self.standing(now))

    def serving_not_mine(self) -> str | None:
        """Why another controller restarts serving now (None: this one does)."""
        return serving_refusal(self.placement, self.standing(self.clock.monotonic()))

    def status_json(
        self,
        now: float,
        claims: list[str],
        holds: list[str],
        lives: Mapping[str, float | None],
    ) -> dict[str, Any]:
        """The ``colocated`` section of ``/v1/status``: what the others read of this
        one (its claims and holds), and for a person which nodes it acts for now and
        whether it restarts serving (``lives``: each node's last life on any path)."""
        return {
            "node": self.placement.me,
            "order": list(self.placement.order),
            "claims": claims,
            "holds": holds,
            "observing": now < self.observing_until,
            "acts_for": [n for n, life in lives.items() if self.refusal_for(n, life, now) is None],
            "restarts_serving": serving_refusal(self.placement, self.standing(now)) is None,
            "peers": {
                name: {
                    "heard_s_ago": None if p.heard_at is None else round(now - p.heard_at, 1),
                    "order_matches": None if p.order is None else p.order == self.placement.order,
                    "detail": self.detail[name],
                }
                for name, p in sorted(self.heard.items())
            },
        }


class Alone:
    """A controller with no others on the Sparks (a management host, or a pair):
    it acts for every node and restarts serving itself."""

    placement: Placement | None = None

    def not_mine(self, watch: NodeWatch) -> str | None:
        return None

    async def claimed_elsewhere(self, watch: NodeWatch) -> str | None:
        return None

    def serving_not_mine(self) -> str | None:
        return None

    def tells_of(self, watch: NodeWatch) -> bool:
        return True

    async def sweep(self, now: float) -> None:
        return None

    def status_json(
        self,
        now: float,
        claims: list[str],
        holds: list[str],
        lives: Mapping[str, float | None],
    ) -> None:
        return None


ALONE = Alone()
