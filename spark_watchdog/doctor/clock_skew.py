"""Controller: how far apart are the controller's and each node's clocks?

Detection never compares clocks: silence is measured on the controller's own
monotonic clock, so skew cannot cause or delay a power cycle. It corrupts
the record instead. An incident's detection time, power steps and fault
onset are controller time; the journal's boot ends and Xid lines, and the
agent snapshot kept as evidence, are node time. Detection takes seconds
(``freeze_after`` 8 s by default, one poll a second): a skew of the same
size reorders cause and effect in the history. Hence warn above 1 s (one
poll interval, the history's own resolution) and fail above 5 s (most of a
detection delay; also a sign that no NTP client runs).

How it is measured, without trusting either clock: the agent's ``/v1/state``
carries ``observed_at`` (the node's time when that snapshot was published:
at most now, maybe a loop older) and its HTTP ``Date`` header (the node's
time while answering, whole seconds). With the controller's times ``sent``
and ``received``, skew = node - controller satisfies::

    skew ≥ observed_at - received
    skew ≥ Date - received
    skew < Date + 1 - sent

Several samples narrow the interval; the verdict uses the smallest skew the
interval allows, so a slow network never reads as skew.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from email.utils import parsedate_to_datetime

from spark_watchdog.config.controller import NodeConfig
from spark_watchdog.controller.look.http_client import HttpError, request
from spark_watchdog.doctor.controller_checks import AGENT_PATIENCE_S, state_url
from spark_watchdog.doctor.result import Finding, fail, ok, skip, warn

WARN_ABOVE_S = 1.0
FAIL_ABOVE_S = 5.0
SAMPLES = 3
SAMPLE_GAP_S = 0.35  # spreads the samples across a Date second boundary


@dataclass(frozen=True)
class SkewSample:
    """One exchange: the controller's wall times around it, and the node's two clocks."""

    sent: float
    received: float
    date_header: str | None
    observed_at: str | None


@dataclass(frozen=True)
class SkewBounds:
    """node clock - controller clock lies in [low, high] (seconds)."""

    low: float
    high: float

    @property
    def least(self) -> float:
        """The smallest skew the evidence allows (0 when it allows none)."""
        if self.low <= 0 <= self.high:
            return 0.0
        return self.low if self.low > 0 else self.high

    def describe(self) -> str:
        if math.isinf(self.high) and math.isinf(self.low):
            return "unbounded"
        if math.isinf(self.high):
            return f"at least {self.low:+.2f} s"
        if math.isinf(self.low):
            return f"at most {self.high:+.2f} s"
        return f"between {self.low:+.2f} s and {self.high:+.2f} s"


def _unix(text: str | None, parse: str) -> float | None:
    if not text:
        return None
    try:
        moment = parsedate_to_datetime(text) if parse == "http" else datetime.fromisoformat(text)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp()


def skew_bounds(samples: Sequence[SkewSample]) -> SkewBounds | None:
    """The interval every sample allows; None when no sample carried a node time."""
    low, high, seen = -math.inf, math.inf, False
    for sample in samples:
        observed = _unix(sample.observed_at, "iso")
        date = _unix(sample.date_header, "http")
        if observed is not None:
            low = max(low, observed - sample.received)
            seen = True
        if date is not None:
            low = max(low, date - sample.received)
            high = min(high, date + 1.0 - sample.sent)
            seen = True
    return SkewBounds(low, high) if seen else None


def judge_skew(node: str, bounds: SkewBounds | None) -> Finding:
    if bounds is None:
        return skip(
            f"the agent of {node} sent neither observed_at nor a Date header: nothing to compare"
        )
    if bounds.low > bounds.high:
        return warn(
            f"the answers of {node} disagree about its time ({bounds.low:+.2f} s > "
            f"{bounds.high:+.2f} s): its clock probably stepped while doctor measured",
            "run doctor again; if it repeats, check the NTP client on both hosts",
        )
    least = bounds.least
    ahead = "ahead of" if least > 0 else "behind"
    detail = f"{node}'s clock is {abs(least):.1f} s or more {ahead} the controller's " + (
        f"({bounds.describe()})"
    )
    fix = (
        f"run an NTP client on {node} and on the controller (`timedatectl` should say "
        "'System clock synchronized: yes'; chrony or systemd-timesyncd)"
    )
    if abs(least) > FAIL_ABOVE_S:
        return fail(f"{detail}: the history would put node events in the wrong order", fix)
    if abs(least) > WARN_ABOVE_S:
        return warn(f"{detail}: timelines mixing node and controller times blur", fix)
    return ok(f"{node} and the controller agree within {WARN_ABOVE_S:g} s ({bounds.describe()})")


async def sample_skew(url: str, timeout: float) -> SkewSample:
    sent = time.time()
    answer = await request(url, timeout=timeout)
    received = time.time()
    observed: str | None = None
    try:
        body = answer.json()
    except HttpError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("observed_at"), str):
        observed = body["observed_at"]
    return SkewSample(sent, received, answer.headers.get("date"), observed)


async def check_clock_skew(node: NodeConfig, samples: int = SAMPLES) -> Finding:
    taken: list[SkewSample] = []
    for n in range(samples):
        if n:
            await asyncio.sleep(SAMPLE_GAP_S)
        try:
            taken.append(await sample_skew(state_url(node), AGENT_PATIENCE_S))
        except HttpError as exc:
            if not taken:
                return skip(f"cannot measure: the agent of {node.name} does not answer ({exc})")
            break
    return judge_skew(node.name, skew_bounds(taken))
