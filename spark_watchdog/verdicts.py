"""Every verdict a node can show, in one table: what it means and what follows.

The detector (controller/decide/detector.py) decides which verdict a node has; this
table says everything else about each one, and every list of verdicts in the
product is derived from it: the labels of the verdict metric
(controller/page/status_api.py), what the controller acts on and which faults a
serving restart answers (controller/decide/planner.py), the faults that count
against the serving restart budget (controller/serving/serving_policy.py), the
incident kinds the history counts from the start (history/records.py), the
page's colours and words (served with ``GET /v1/nodes``), the exit status of
``spark-watchdog status``, and what the lab expects.
See docs/design.md, "Verdicts". Two of the names are node states shown in a
verdict's place: ``booting`` and ``held``.

A row has every column and none has a default, so a new verdict cannot
leave one out; a test checks the detector's ``Verdict`` and this table
name the same verdicts. Imports nothing of ours: the history, the CLI, the
lab and the controller all read it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Severity(enum.Enum):
    """How bad a verdict is for the cluster."""

    OK = "ok"  # well, or not known yet: ``spark-watchdog status`` exits 0
    WARN = "warn"  # a person may want to look; the node is alive
    BAD = "bad"  # serving is down, a node is lost, or the controller cannot protect it


class Answer(enum.Enum):
    """What the controller's planner does about a verdict (controller/decide/planner.py)."""

    NOTHING = "nothing"  # it watches (an alert may go: controller/daemon.py)
    POWER = "power"  # the escalation ladder (docs/design.md, "The escalation ladder")
    RESTART_AGENT = "restart_agent"  # the agent restarts over SSH; never power
    UNWEDGE = "unwedge"  # the wedged-but-alive ladder (docs/design.md, "Wedged but alive")
    RESTART_SERVING = "restart_serving"  # every rank restarts, with the safe profile


class Colour(enum.Enum):
    """The page's colour for a verdict: a variable of controller/web/page.css."""

    OK = "ok"
    INFO = "info"  # waiting for something that is under way
    WARN = "warn"
    BAD = "bad"
    HELD = "held"


_NAME = re.compile(r"[a-z][a-z_]{1,39}")


@dataclass(frozen=True)
class VerdictRow:
    """One verdict. No column has a default: every row says every one."""

    name: str
    # A node state shown in the verdict's place (controller/look/node_watch.py), not
    # a verdict of the detector.
    node_state: bool
    severity: Severity
    answer: Answer
    # Its serving restart counts against serving.restart_budget.
    serving_fault: bool
    # The controller opens an incident of this kind for it.
    incident: bool
    # The controller took the node for frozen, fences it or stopped after it
    # did: a node that is alive and reachable must never show it (the lab checks).
    took_for_frozen: bool
    # spark_watchdog_node_verdict has a series for it (docs/observability.md).
    metric: bool
    colour: Colour
    # What it means, for an operator: one short sentence.
    words: str

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"verdict {self.name!r}: expected a snake_case name")
        if not (self.words.endswith(".") and 10 <= len(self.words) <= 90) or "\n" in self.words:
            raise ValueError(f"verdict {self.name}: words must be one short sentence")
        if self.node_state and (self.answer is not Answer.NOTHING or self.incident):
            raise ValueError(f"{self.name}: a node state is no verdict the controller answers")

    @property
    def acted_on(self) -> bool:
        """Whether the planner decides something for it (else it skips the history's guards)."""
        return self.answer is not Answer.NOTHING


_S, _A, _C = Severity, Answer, Colour

TABLE: tuple[VerdictRow, ...] = (
    VerdictRow(
        name="healthy",
        node_state=False,
        severity=_S.OK,
        answer=_A.NOTHING,
        serving_fault=False,
        incident=False,
        took_for_frozen=False,
        metric=True,
        colour=_C.OK,
        words="The agent makes progress and serving is fine.",
    ),
    VerdictRow(
        name="pending",
        node_state=False,
        severity=_S.OK,
        answer=_A.NOTHING,
        serving_fault=False,
        incident=False,
        took_for_frozen=False,
        metric=True,
        colour=_C.INFO,
        words="Watching, not sure of anything yet.",
    ),
    VerdictRow(
        name="serving_stalled",
        node_state=False,
        severity=_S.WARN,
        answer=_A.RESTART_SERVING,
        serving_fault=True,
        incident=True,
        took_for_frozen=False,
        metric=True,
        colour=_C.WARN,
        words="vLLM has requests but makes no progress: serving restarts.",
    ),
    VerdictRow(
        name="serving_dead",
        node_state=False,
        severity=_S.BAD,
        answer=_A.RESTART_SERVING,
        serving_fault=True,
        incident=True,
        took_for_frozen=False,
        metric=True,
        colour=_C.BAD,
        words="The rank is dead: serving restarts on every node.",
    ),
    VerdictRow(
        name="memory_exhausted",
        node_state=False,
        severity=_S.BAD,
        answer=_A.RESTART_SERVING,
        serving_fault=True,
        incident=True,
        took_for_frozen=False,
        metric=True,
        colour=_C.BAD,
        words="The memory guard killed the rank: serving restarts with the safe profile.",
    ),
    VerdictRow(
        name="gpu_wedged",
        node_state=False,
        severity=_S.BAD,
        answer=_A.UNWEDGE,
        serving_fault=True,
        incident=True,
        took_for_frozen=False,
        metric=True,
        colour=_C.BAD,
        words="The host answers but its GPU does not: the gentle ladder runs, no power.",
    ),
    VerdictRow(
        name="gpu_fault",
        node_state=False,
        severity=_S.BAD,
        answer=_A.RESTART_SERVING,
        serving_fault=True,
        incident=True,
        took_for_frozen=False,
        metric=True,
        colour=_C.BAD,
        words="A GPU fault ended the rank: serving restarts with the safe profile.",
    ),
    VerdictRow(
        name="agent_down",
        node_state=False,
        severity=_S.WARN,
        answer=_A.RESTART_AGENT,
        serving_fault=False,
        incident=False,
        took_for_frozen=False,
        metric=True,
        colour=_C.WARN,
        words="The host answers but its agent is stuck: the agent restarts over SSH.",
    ),
    VerdictRow(
        name="host_frozen",
        node_state=False,
        severity=_S.BAD,
        answer=_A.POWER,
        serving_fault=False,
        incident=True,
        took_for_frozen=True,
        metric=True,
        colour=_C.BAD,
        words="No sign of life on any path: the power ladder runs.",
    ),
    VerdictRow(
        name="isolated",
        node_state=False,
        severity=_S.BAD,
        answer=_A.NOTHING,
        serving_fault=False,
        incident=False,
        took_for_frozen=True,
        metric=True,
        colour=_C.BAD,
        words="It looks frozen, but the witness does not answer: nothing is fenced.",
    ),
    VerdictRow(
        name="rebooting",
        node_state=False,
        severity=_S.WARN,
        answer=_A.NOTHING,
        serving_fault=False,
        incident=False,
        took_for_frozen=False,
        metric=True,
        colour=_C.INFO,
        words="It is going down in order: waiting for a new boot.",
    ),
    VerdictRow(
        name="unobservable",
        node_state=False,
        severity=_S.BAD,
        answer=_A.NOTHING,
        serving_fault=False,
        incident=False,
        took_for_frozen=False,
        metric=True,
        colour=_C.BAD,
        words="The controller cannot look (its DNS or network): nothing is fenced.",
    ),
    VerdictRow(
        name="unreachable",
        node_state=False,
        severity=_S.WARN,
        answer=_A.NOTHING,
        serving_fault=False,
        incident=False,
        took_for_frozen=False,
        metric=True,
        colour=_C.WARN,
        words="Its peers see it alive, the controller cannot reach it: nothing is fenced.",
    ),
    VerdictRow(
        name="booting",
        node_state=True,
        severity=_S.WARN,
        answer=_A.NOTHING,
        serving_fault=False,
        incident=False,
        took_for_frozen=True,
        metric=True,
        colour=_C.INFO,
        words="Power is back: waiting for the node to boot.",
    ),
    VerdictRow(
        name="held",
        node_state=True,
        severity=_S.BAD,
        answer=_A.NOTHING,
        serving_fault=False,
        incident=False,
        took_for_frozen=True,
        metric=True,
        colour=_C.HELD,
        words="Nothing automatic happens until a person releases it.",
    ),
)

BY_NAME: dict[str, VerdictRow] = {r.name: r for r in TABLE}
if len(BY_NAME) != len(TABLE):
    raise ValueError("spark_watchdog/verdicts.py: a verdict named twice")


def row(name: str) -> VerdictRow:
    """The row of ``name``; KeyError for a name the table does not know."""
    return BY_NAME[name]


# The detector's verdicts (controller/decide/detector.py, Verdict), without the node states.
DETECTED = tuple(r.name for r in TABLE if not r.node_state)
# The labels of spark_watchdog_node_verdict, in this order (controller/page/status_api.py).
METRIC_LABELS = tuple(r.name for r in TABLE if r.metric)
# Incident kinds whose serving restart counts against serving.restart_budget.
SERVING_FAULT_KINDS = tuple(r.name for r in TABLE if r.serving_fault)
# The incident kinds a verdict opens (history/records.py adds the others).
INCIDENT_KINDS = tuple(r.name for r in TABLE if r.incident)
# A node that is alive and reachable must never show one of these.
TAKEN_FOR_FROZEN = frozenset(r.name for r in TABLE if r.took_for_frozen)
# Verdicts after which ``spark-watchdog status`` exits 0.
FINE = frozenset(r.name for r in TABLE if r.severity is Severity.OK)


def for_the_page() -> dict[str, dict[str, str]]:
    """What the page needs of each verdict: its colour and its words (GET /v1/nodes)."""
    return {r.name: {"colour": r.colour.value, "words": r.words} for r in TABLE}
