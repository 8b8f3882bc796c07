"""Controllers on the Sparks: does each one of the order answer, where it is placed, in this order?

Each controller of ``colocated.controllers`` is asked for its ``/v1/status``
on every URL it is heard on, as the other controllers ask it. What makes the
order fail is named: a controller no URL reaches (the others would take it for
gone and act in its place), one whose order differs from this config's (a
copy of the config that differs: while they hear each other neither acts),
one that says it runs on another node than its place (a URL that reaches
another Spark, or a controller started with the wrong ``--node``), one that
runs without ``colocated:`` (it would act alone), and one still listening
after its start (docs/design.md, "Controllers on the Sparks").
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spark_watchdog.config.colocated import PlacedController, controller_urls
from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.look.http_client import HttpError, request
from spark_watchdog.doctor.controller_checks import AGENT_PATIENCE_S
from spark_watchdog.doctor.result import Finding, fail, ok, warn
from spark_watchdog.terminal import escape

# Per URL, all of a controller's URLs at once: as long as doctor waits for an agent.
ASK_TIMEOUT_S = AGENT_PATIENCE_S
# What of an answer is shown: a name this long, an order this many names long.
_NAME_CHARS, _ORDER_NAMES = 64, 16


@dataclass(frozen=True)
class ControllerSays:
    """What one URL's ``/v1/status`` says of the controller behind it, escaped for a report."""

    node: str
    order: tuple[str, ...]
    observing: bool


@dataclass(frozen=True)
class Unusable:
    """An answer that says nothing of the order, and why."""

    why: str


# One URL and what came back: what the controller says, an answer that says
# nothing of the order, or why no answer came (a str).
Answer = tuple[str, ControllerSays | Unusable | str]
# A finding's sentence and its fix.
Problem = tuple[str, str]


def _name(value: Any) -> str:
    return escape(str(value)[:_NAME_CHARS])


def read_status(body: Any) -> ControllerSays | Unusable:
    """A controller's status document, or why it says nothing of the order."""
    if not isinstance(body, dict):
        return Unusable("not with a status document")
    placed = body.get("colocated")
    if placed is None:
        return Unusable(
            "runs without colocated: (a config that is not this one, or a release from "
            "before controllers on the Sparks), so it acts alone, for its own host too"
        )
    if not isinstance(placed, dict):
        return Unusable("with a colocated section that is not an object")
    order = placed.get("order")
    if not isinstance(order, list) or not all(isinstance(n, str) for n in order):
        return Unusable("with a colocated.order that is not a list of node names")
    shown = tuple(_name(n) for n in order[:_ORDER_NAMES])
    if len(order) > _ORDER_NAMES:
        shown += (f"... ({len(order)} names)",)
    return ControllerSays(_name(placed.get("node")), shown, placed.get("observing") is True)


async def ask(url: str, timeout: float = ASK_TIMEOUT_S) -> ControllerSays | Unusable | str:
    """One URL's ``/v1/status``, within ``timeout`` (a str: why no answer came)."""
    try:
        answer = await request(f"{url.rstrip('/')}/v1/status", timeout=timeout)
    except HttpError as exc:
        return escape(str(exc))
    if answer.status != 200:
        return Unusable(f"with HTTP {answer.status}")
    try:
        return read_status(answer.json())
    except HttpError as exc:
        return Unusable(f"not as a controller: {escape(str(exc))}")


async def check_controller(
    config: ControllerConfig, placed: PlacedController, timeout: float = ASK_TIMEOUT_S
) -> Finding:
    """Ask the controller on ``placed.node`` on each of its URLs, then judge what came back."""
    assert config.colocated is not None
    urls = controller_urls(placed, config.node(placed.node).agent, config.listen.port)
    said = await asyncio.gather(*(ask(url, timeout) for url in urls))
    return judge_controller(
        placed.node,
        config.colocated.order,
        config.colocated.takeover_after,
        list(zip(urls, said, strict=True)),
    )


def judge_controller(
    node: str, order: Sequence[str], takeover_after: float, answers: Sequence[Answer]
) -> Finding:
    """One controller of the order, from what each of its URLs answered."""
    place = f"place {list(order).index(node) + 1} of {len(order)}"
    elsewhere = [(u, s) for u, s in answers if isinstance(s, ControllerSays) and s.node != node]
    reached = [(u, s) for u, s in answers if isinstance(s, ControllerSays) and s.node == node]
    missed = [s for _, s in answers if isinstance(s, str)]
    failures = [
        (
            f'{url} answers as the controller on "{says.node}", not on {node}, whose place '
            f"({place}) it is",
            f"correct colocated.controllers' urls of {node} (each must reach {node}'s "
            f"controller), or start the controller there with --node {node}",
        )
        for url, says in elsewhere
    ]
    failures += [_unusable(node, u, s) for u, s in answers if isinstance(s, Unusable)]
    warnings: list[tuple[str, str]] = []
    if not reached:
        if missed or not failures:
            failures.append(_unreached(node, missed))
    else:
        url, says = reached[0]
        if says.order != tuple(order):
            failures.append(_other_order(node, url, says.order, order))
        if missed:
            warnings.append(_paths_missed(node, missed))
        if says.observing:
            warnings.append(_listening(node, takeover_after))
    if failures or warnings:
        found = failures + warnings
        detail = "; ".join(d for d, _ in found)
        fix = "; ".join(dict.fromkeys(f for _, f in found))
        return fail(detail, fix) if failures else warn(detail, fix)
    heard = ", ".join(u for u, _ in reached)
    return ok(f"the controller on {node} answers at {heard}: {place}, this order, listening done")


def _other_order(node: str, url: str, theirs: Sequence[str], ours: Sequence[str]) -> Problem:
    return (
        f"the controller on {node} ({url}) has the order {', '.join(theirs)}; this "
        f"config's is {', '.join(ours)}: while the two hear each other, neither acts for "
        "any node",
        f"copy this controller.yaml, unchanged, to {node} (one file for every Spark), then "
        "restart its controller: sudo systemctl restart spark-watchdog-controller",
    )


def _unusable(node: str, url: str, answer: Unusable) -> Problem:
    return (
        f"{url} answers, but {answer.why}",
        f"give the controller on {node} this controller.yaml (one file for every Spark) "
        "and this release, then restart it",
    )


def _paths_missed(node: str, missed: Sequence[str]) -> Problem:
    return (
        f"the controller on {node} does not answer on every path ({'; '.join(missed)}): "
        "the others hear it on fewer, and take it for gone when the last one fails",
        f"open TCP to {node}'s controller on every one of its urls (firewall), or correct "
        "its urls in colocated.controllers",
    )


def _listening(node: str, takeover_after: float) -> Problem:
    return (
        f"the controller on {node} is still listening: it acts on nothing until "
        f"takeover_after ({takeover_after:g} s) has passed since its start or a stall",
        f"run doctor again in {takeover_after:g} s; if it is still listening, its loop "
        f"stalls: journalctl -u spark-watchdog-controller on {node}",
    )


def _unreached(node: str, missed: Sequence[str]) -> Problem:
    return (
        f"no answer from the controller on {node}: {'; '.join(missed)}. The others take it "
        "for gone and act in its place",
        f"on {node}: systemctl status spark-watchdog-controller; its listen.address must be "
        "one the other Sparks reach, and TCP to its port open between them (firewall)",
    )
