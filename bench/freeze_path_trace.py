"""The freeze path, poll to power: which product modules a frozen host's handling runs through.

One scripted freeze in the simulation (spark_watchdog/simulation: the real
controller on virtual time, docs/simulation.md), every Python call traced
(``sys.setprofile``) from the controller's poll of the frozen node that
yields the ``host_frozen`` verdict up to the first power command that cuts
the node's power. Prints the figures by both measures (below: by steps,
the headline, and by every product frame, the measure until 2026-12-07),
the modules one by one, and each task's module sequence; ``--json`` prints
the same as JSON, every move included. The figures recorded, and the goal:
docs/benchmarks.md, "The freeze path, poll to power".

    .venv/bin/python -m bench.freeze_path_trace
    .venv/bin/python -m bench.freeze_path_trace --json

The scenario: seed 1, four nodes, ``spark-3`` frozen at 30 s of virtual time,
no controller pair, no peers (``--peers``: agents pulsing over the fabric),
no dry run, outlets that cannot time their own on. A run takes about a second.

What is counted, precisely, so that the figures compare over time:

- **Product code**: a frame whose code file lies under spark_watchdog/, except
  spark_watchdog/simulation/ (the stand-in world) and spark_watchdog/history/
  (the storage behind controller/record/ledger.py, reached through the ledger as the
  agents and the outlet are through their seams): a history frame is not
  counted, nor anything it calls. Comprehensions and generator expressions
  count as the function they are written in (Python 3.12 inlines most).
  Other code (the standard library, dataclasses' generated methods, the
  simulation) is transparent: product A calling asyncio calling product B
  is a call from A to B.
- **The end**: the start of the first power command that cuts power: the
  ``PowerBackend`` call (power/base.py) that is the SNMP SET on a real PDU,
  here the simulated outlet's ``command(OFF)`` or ``command_timed_off``.
- **The tasks**: the asyncio task that makes that command, the task that
  created it, and so on up. The first of them created after the freeze is
  the freeze ladder's; the one that created it is the controller's loop (the
  tick). The tick's task counts until it creates the ladder's (then it goes
  on to other work, and to the next ticks), each later one until it creates
  the next, the last until the command. A task that a counted task creates
  while it counts counts too, if the product function that created it is
  still running when the task's own product code ends (it was awaited:
  ``gather``, ``wait_for``: the sweep's poll, the last look's agent and
  banner checks), and not otherwise (a banner check left running).
- **The start**: the latest request for the frozen node's ``/v1/state`` (the
  seam ``ControllerIO.agents.get``) before the ladder's task was created: the
  poll whose silence made the verdict ``host_frozen``. The window opens when
  the tick created the task that makes it (the sweep's ``gather``), or, were
  the poll made in the tick's own task, when the function asking starts.
- **Other nodes**: a product frame whose arguments name another node and not
  the frozen one is left out, with everything it calls: a node's name, a
  product object whose ``name`` is one (its ``NodeWatch``, its
  ``NodeConfig``), or a product object such a frame returned (another node's
  observation, its finding). The tick's loops over the other nodes are not
  the freeze path; what the tick does for the cluster as a whole is.
- **A move** is a call or a return in a counted task, within its stretch,
  between two different product modules: a function starting in another
  module than its caller's (a task's first product function: than its
  creator's), or ending into another module than its own (a task's first:
  back to its creator's). Awaiting is not a move: a coroutine suspended and
  resumed stays where it was called; a plain generator's each resumption is
  a call and each yield a return. A **re-entry** is a move into a module
  that an earlier move on the path left. **Modules**: those where counted
  product code ran; **functions**: the distinct product functions that
  started; **calls**: how many times one started.
- **By steps** (``steps``, the headline): the same, over the steps of the
  path alone: a step is a plain function or method; a property, a
  constructor (``__init__``), a default-value callable and a clock read are
  not (bench/freeze_path_steps.py says which exactly). What is not a step is
  transparent: what it calls counts from the nearest step that called it,
  and its own start and end are no move.
- **By every product frame** (``frames``): every product frame counts, a
  property's getter as much as a function; the figures recorded until
  2026-12-07 were counted so.
- **The parts**: the tick (its task and the tasks it awaited: the poll, the
  verdict, the decision, the incident opened, the ladder's task created) and
  the ladder (the rest, to the command). Of the tick, its **cluster-wide
  work** (the holds read, the serving profile synced, the breaker checked,
  the cluster's view built: what every tick does whichever node froze) is
  counted apart as well. Each part's figures are counted as the whole
  path's, over its tasks (or the cluster-wide work) alone.

Each task's module sequence lists its first module and then the module each
of its moves enters, in order (by steps); ``--json`` has every move of both
measures with its function.
"""

from __future__ import annotations

import argparse
import asyncio
import dis
import enum
import inspect
import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import spark_watchdog
from bench.freeze_path_steps import StepCodes, cluster_wide, qualname
from spark_watchdog.simulation.run import simulate

PACKAGE = Path(spark_watchdog.__file__).resolve().parent
SIMULATION = PACKAGE / "simulation"
SIMULATION_CODE = "simulation/"
HISTORY = "history/"
# Inlined by Python 3.12 (PEP 709): counted as the function they are written in.
COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"})
CREATE_TASK = asyncio.base_events.BaseEventLoop.create_task.__code__
YIELD_VALUE = dis.opmap["YIELD_VALUE"]
POWER_COMMANDS = frozenset({"command", "command_timed_off"})
AWAITABLE = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE
GENERATOR = inspect.CO_GENERATOR | inspect.CO_ASYNC_GENERATOR


class TraceError(RuntimeError):
    """The run did not have the shape this measurement reads (no power command, no poll)."""


@dataclass(frozen=True)
class _Link:
    """A product frame's place: its code and the frame it was called from (for its
    task's first frame: the one that created the task). A generator resumed
    elsewhere gets a new link."""

    serial: int
    task: int
    module: str
    code: CodeType
    parent: _Link | None


@dataclass
class _Frame:
    """A product frame that started and has not ended."""

    frame: FrameType
    link: _Link
    excluded: bool  # not counted: another node's, or the history's
    elsewhere: bool  # another node's (and what it calls)

    @property
    def serial(self) -> int:
        return self.link.serial

    @property
    def task(self) -> int:
        return self.link.task

    @property
    def module(self) -> str:
        return self.link.module


@dataclass
class _Task:
    creator: int | None
    created_at: int  # event number
    created_s: float  # virtual time
    creator_frame: _Link | None  # the product frame that created it
    elsewhere: bool  # created by another node's function
    label: str | None = None  # its first product function
    end: int | None = None  # when its first product frame ended


@dataclass(frozen=True)
class _Event:
    at: int
    task: int
    start: bool  # a start (or a generator's resumption), else an end
    fresh: bool  # a start that is a new call, not a resumption
    module: str
    function: str
    excluded: bool
    link: _Link  # the frame starting or ending
    caller: _Link | None  # the frame called from (start), the one returned into (end)


@dataclass(frozen=True)
class Move:
    at: int  # the event's number in the trace
    task: str  # the task's first product function
    part: str  # "tick" or "ladder"
    kind: str  # "call" or "return"
    source: str
    target: str
    function: str  # the function starting, or ending
    cluster_wide: bool = False  # of the tick's work for the cluster as a whole


@dataclass(frozen=True)
class Figures:
    """One stretch of the path: the module docstring defines each figure."""

    modules: tuple[str, ...]
    functions: int
    calls: int
    moves: int
    reentries: int
    tasks: int


@dataclass(frozen=True)
class Measure:
    """The path counted one way: the whole, its parts, and what it went through."""

    whole: Figures
    tick: Figures  # the poll, the verdict and the decision, in the controller's loop
    cluster_wide: Figures  # of the tick: its work for the cluster as a whole
    ladder: Figures  # the freeze ladder's task(s), up to the command
    moves: list[Move]
    sequence: list[str]
    tasks: dict[str, list[str]] = field(default_factory=dict)
    per_module: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass
class FreezePath:
    """One trace, counted by steps (the headline) and by every product frame."""

    seed: int
    node: str
    frozen_at_s: float  # virtual time
    poll_sent_s: float
    ladder_created_s: float
    power_off_s: float
    steps: Measure  # a move enters or leaves a step: a plain function (freeze_path_steps.py)
    frames: Measure  # a move enters or leaves any product frame (the measure until 2026-12-07)
    # Frames that ended while not on top of their task's stack: 0, or the figures are off.
    out_of_order: int = 0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def module_of(code: CodeType) -> str | None:
    """The product module a code object is of (its path under the package), SIMULATION_CODE
    for the simulation's, None for any other."""
    if not os.path.isabs(code.co_filename):  # "<string>": generated code
        return None
    path = Path(os.path.realpath(code.co_filename))
    if not path.is_relative_to(PACKAGE):
        return None
    if path.is_relative_to(SIMULATION):
        return SIMULATION_CODE
    return path.relative_to(PACKAGE).as_posix()


def _product_object(value: object) -> bool:
    """An object of a product class (not an enumeration's member: those are shared)."""
    module = str(getattr(type(value), "__module__", ""))
    return (
        module.startswith("spark_watchdog.")
        and not module.startswith("spark_watchdog.simulation")
        and not isinstance(value, enum.Enum)
    )


def _current_task() -> int:
    loop = asyncio._get_running_loop()
    task = None if loop is None else asyncio.current_task(loop)
    return 0 if task is None else id(task)


def _now() -> float:
    loop = asyncio._get_running_loop()
    return -1.0 if loop is None else loop.time()


@dataclass(frozen=True)
class _Seen:
    at: int
    task: int
    frame: int | None  # serial of the product frame that called it
    time_s: float


class Tracer:
    """The profile function: product frames' starts and ends, by task, as they happen."""

    def __init__(self, node: str, nodes: frozenset[str]) -> None:
        self.node = node
        self.others = nodes - {node}
        self.events: list[_Event] = []
        self.tasks: dict[int, _Task] = {}
        self.polls: list[_Seen] = []
        self.power_off: _Seen | None = None
        self.frame_start: dict[int, int] = {}
        self.frame_end: dict[int, int] = {}
        self._keep: list[object] = []  # tasks seen: their ids stay theirs
        self._stacks: dict[int, list[_Frame]] = {}
        self._live: dict[int, _Frame] = {}
        self._foreign: dict[int, object] = {}
        self.out_of_order = 0  # ends of frames not on top of their task's stack
        self._modules: dict[int, tuple[CodeType, str | None]] = {}
        self._count = 0
        self._serial = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            self._call(frame)
        elif event == "return":
            self._return(frame, arg)

    def _next(self) -> int:
        self._count += 1
        return self._count

    def _module(self, code: CodeType) -> str | None:
        known = self._modules.get(id(code))
        if known is None:
            # By identity, the code kept (equal code objects of two files compare equal).
            known = self._modules[id(code)] = (code, module_of(code))
        return known[1]

    # -- starts -------------------------------------------------------------

    def _call(self, frame: FrameType) -> None:
        code = frame.f_code
        module = self._module(code)
        if module is None or module == SIMULATION_CODE:
            if module is not None:
                self._seam(frame, code)
            return
        live = self._live.get(id(frame))
        if live is not None and live.frame is frame:
            if not code.co_flags & AWAITABLE:  # a generator resumed: a call again
                self._push(frame, live, fresh=False)
            return  # a coroutine resumed stays where it was called
        task = _current_task()
        stack = self._stacks.setdefault(task, [])
        top = stack[-1] if stack else None
        if code.co_name in COMPREHENSIONS:
            return  # counted as the function it runs in
        info = self.tasks.get(task)
        excluded = top.excluded if top else bool(info and info.elsewhere)
        elsewhere = top.elsewhere if top else bool(info and info.elsewhere)
        elsewhere = elsewhere or self._elsewhere(frame)
        excluded = excluded or elsewhere or module.startswith(HISTORY)
        self._serial += 1
        link = _Link(self._serial, task, module, code, None)
        entry = _Frame(frame, link, excluded, elsewhere)
        self._live[id(frame)] = entry
        if info is not None and info.label is None:
            info.label = qualname(code)
        self._push(frame, entry, fresh=True)

    def _push(self, frame: FrameType, entry: _Frame, fresh: bool) -> None:
        stack = self._stacks.setdefault(entry.task, [])
        caller = self._below(entry.task, stack)
        entry.link = replace(entry.link, parent=caller)  # where it was called from, this time
        stack.append(entry)
        at = self._next()
        if fresh:
            self.frame_start[entry.serial] = at
        self.events.append(
            _Event(
                at,
                entry.task,
                True,
                fresh,
                entry.module,
                qualname(frame.f_code),
                entry.excluded,
                entry.link,
                caller,
            )
        )

    def _below(self, task: int, stack: list[_Frame]) -> _Link | None:
        """The frame on top of the task's stack, or the one that created the task."""
        if stack:
            return stack[-1].link
        info = self.tasks.get(task)
        return None if info is None else info.creator_frame

    def _elsewhere(self, frame: FrameType) -> bool:
        """Its arguments name another node, and not the frozen one, or came from
        a function that did (the observation of another node, its finding)."""
        named: set[str] = set()
        foreign = False
        for value in frame.f_locals.values():
            if id(value) in self._foreign:
                foreign = True
            elif isinstance(value, str):
                named.add(value)
            elif _product_object(value):
                try:
                    name = getattr(value, "name", None)
                except Exception:  # a property that cannot answer here
                    continue
                if isinstance(name, str):
                    named.add(name)
        return (foreign or bool(named & self.others)) and self.node not in named

    def _seam(self, frame: FrameType, code: CodeType) -> None:
        """The simulated world's seams: the agents' get and the outlet's command."""
        values = frame.f_locals
        if code.co_name == "get" and values.get("path") == "/v1/state":
            if getattr(values.get("node"), "name", None) == self.node:
                self.polls.append(self._seen())
        elif code.co_name in POWER_COMMANDS and self.power_off is None:
            target = getattr(values.get("target"), "value", None)
            if code.co_name == "command_timed_off" or target == "off":
                self.power_off = self._seen()
                sys.setprofile(None)  # the rest of the run is not measured

    def _seen(self) -> _Seen:
        task = _current_task()
        stack = self._stacks.get(task)
        return _Seen(self._next(), task, stack[-1].serial if stack else None, _now())

    # -- ends ---------------------------------------------------------------

    def _return(self, frame: FrameType, arg: Any) -> None:
        code = frame.f_code
        if code is CREATE_TASK:
            self._created(arg)
            return
        entry = self._live.get(id(frame))
        if entry is None or entry.frame is not frame:
            return
        suspended = bool(code.co_flags & (AWAITABLE | GENERATOR)) and (
            code.co_code[frame.f_lasti] == YIELD_VALUE
        )
        if suspended and code.co_flags & AWAITABLE:
            return  # awaiting: it stays where it was called
        stack = self._stacks[entry.task]
        place = next((i for i in range(len(stack) - 1, -1, -1) if stack[i] is entry), None)
        if place is None or place != len(stack) - 1:
            self.out_of_order += 1  # the stack model does not hold: the figures are off
        if place is not None:
            del stack[place:]
        at = self._next()
        if not suspended:
            del self._live[id(frame)]
            self.frame_end[entry.serial] = at
            info = self.tasks.get(entry.task)
            if info is not None and not stack and info.end is None:
                info.end = at
        back = self._below(entry.task, stack)
        if entry.elsewhere and not (stack and stack[-1].elsewhere) and _product_object(arg):
            self._foreign[id(arg)] = arg  # what another node's function gave back
        self.events.append(
            _Event(
                at,
                entry.task,
                False,
                False,
                entry.module,
                qualname(code),
                entry.excluded,
                entry.link,
                back,
            )
        )

    def _created(self, task: object) -> None:
        creator = _current_task()
        stack = self._stacks.get(creator)
        top = stack[-1] if stack else None
        parent = self.tasks.get(creator)
        self._keep.append(task)
        self.tasks[id(task)] = _Task(
            creator=creator or None,
            created_at=self._next(),
            created_s=_now(),
            creator_frame=None if top is None else top.link,
            elsewhere=top.elsewhere if top else bool(parent and parent.elsewhere),
        )


# -- what the trace says ------------------------------------------------------


def _chain(tracer: Tracer, last: int) -> list[int]:
    """The task that sent the command, and every task above it by creation, root first."""
    chain: list[int] = []
    task: int | None = last
    while task is not None and task not in chain:
        chain.append(task)
        info = tracer.tasks.get(task)
        task = None if info is None else info.creator
    return chain[::-1]


@dataclass
class _Path:
    """The counted tasks, each with its stretch of events and its part."""

    segments: dict[int, tuple[int, int]]
    parts: dict[int, str]
    poll: _Seen
    ladder: int


def _find_path(tracer: Tracer, frozen_at: float) -> _Path:
    off = tracer.power_off
    if off is None:
        raise TraceError("no power command cut the frozen node's power")
    chain = _chain(tracer, off.task)
    later = [t for t in chain if t in tracer.tasks and tracer.tasks[t].created_s >= frozen_at]
    if not later or chain.index(later[0]) == 0:
        raise TraceError("no task created after the freeze leads to the power command")
    ladder = later[0]
    tick = chain[chain.index(ladder) - 1]
    polls = [p for p in tracer.polls if p.at < tracer.tasks[ladder].created_at]
    asker = polls[-1].frame if polls else None
    if asker is None:
        raise TraceError("no poll of the frozen node from product code before the ladder")
    poll = polls[-1]
    start = tracer.frame_start.get(asker, poll.at)
    task = poll.task
    while task != tick and task in tracer.tasks:  # opened when the tick created its task
        start = min(start, tracer.tasks[task].created_at)
        creator = tracer.tasks[task].creator
        if creator is None:
            break
        task = creator
    on_chain = chain[chain.index(tick) :]
    path = _Path({}, {}, poll, ladder)
    for this, following in zip(on_chain, [*on_chain[1:], None], strict=True):
        until = off.at if following is None else tracer.tasks[following].created_at
        path.segments[this] = (start, until)
        path.parts[this] = "tick" if this == tick else "ladder"
    _add_awaited(tracer, path, off.at)
    return path


def _add_awaited(tracer: Tracer, path: _Path, end: int) -> None:
    """The tasks a counted task created while it counted and awaited (see the docstring)."""
    for task, info in sorted(tracer.tasks.items(), key=lambda item: item[1].created_at):
        if task in path.segments or info.creator not in path.segments or info.elsewhere:
            continue
        begin, until = path.segments[info.creator]
        if not begin <= info.created_at <= until or info.end is None or info.end > end:
            continue
        made_by = info.creator_frame
        creator_end = None if made_by is None else tracer.frame_end.get(made_by.serial)
        if creator_end is None or creator_end > info.end:
            path.segments[task] = (info.created_at, info.end)
            path.parts[task] = path.parts[info.creator]


def _counted(tracer: Tracer, path: _Path) -> list[_Event]:
    return [
        e
        for e in tracer.events
        if e.task in path.segments
        and path.segments[e.task][0] <= e.at <= path.segments[e.task][1]
        and not e.excluded
    ]


def _moves(
    tracer: Tracer,
    path: _Path,
    counted: list[_Event],
    caller_of: Callable[[_Event], _Link | None],
) -> list[Move]:
    moves: list[Move] = []
    for e in counted:
        caller = caller_of(e)
        if caller is None or caller.module == e.module:
            continue
        source, target = (caller.module, e.module) if e.start else (e.module, caller.module)
        label = tracer.tasks[e.task].label if e.task in tracer.tasks else None
        moves.append(
            Move(
                e.at,
                label or "?",
                path.parts[e.task],
                "call" if e.start else "return",
                source,
                target,
                e.function,
                cluster_wide(e.link),
            )
        )
    return moves


def _figures(counted: list[_Event], moves: list[Move]) -> Figures:
    left: set[str] = set()
    reentries = 0
    for move in moves:
        reentries += move.target in left
        left.add(move.source)
    starts = [e for e in counted if e.start and e.fresh]
    modules = {e.module for e in counted if e.start}
    modules |= {m.source for m in moves} | {m.target for m in moves}
    return Figures(
        modules=tuple(sorted(modules)),
        functions=len({(e.module, e.function) for e in starts}),
        calls=len(starts),
        moves=len(moves),
        reentries=reentries,
        tasks=len({e.task for e in counted}),
    )


def _per_module(counted: list[_Event], moves: list[Move]) -> dict[str, dict[str, int]]:
    starts = [e for e in counted if e.start and e.fresh]
    modules = sorted({e.module for e in counted if e.start} | {m.target for m in moves})
    table = {m: {"functions": 0, "calls": 0, "entries": 0} for m in modules}
    for module, _ in {(e.module, e.function) for e in starts}:
        table[module]["functions"] += 1
    for e in starts:
        table[e.module]["calls"] += 1
    for move in moves:
        table.setdefault(move.source, {"functions": 0, "calls": 0, "entries": 0})
        table[move.target]["entries"] += 1
    return dict(sorted(table.items()))


def _measure(
    tracer: Tracer,
    path: _Path,
    counted: list[_Event],
    caller_of: Callable[[_Event], _Link | None],
) -> Measure:
    """The path counted over ``counted``, each event's move from ``caller_of`` it."""
    moves = _moves(tracer, path, counted, caller_of)
    wide = {id(e) for e in counted if cluster_wide(e.link)}
    parts = {
        part: _figures(
            [e for e in counted if path.parts[e.task] == part],
            [m for m in moves if m.part == part],
        )
        for part in ("tick", "ladder")
    }
    tasks: dict[str, list[str]] = {}
    for move in moves:
        tasks.setdefault(move.task, [move.source]).append(move.target)
    return Measure(
        whole=_figures(counted, moves),
        tick=parts["tick"],
        cluster_wide=_figures(
            [e for e in counted if id(e) in wide], [m for m in moves if m.cluster_wide]
        ),
        ladder=parts["ladder"],
        moves=moves,
        sequence=[moves[0].source if moves else "", *(m.target for m in moves)],
        tasks=tasks,
        per_module=_per_module(counted, moves),
    )


def read_path(tracer: Tracer, seed: int, frozen_at: float) -> FreezePath:
    """The figures of a finished trace (the module docstring defines them)."""
    path = _find_path(tracer, frozen_at)
    assert tracer.power_off is not None
    counted = _counted(tracer, path)
    codes = StepCodes.loaded()
    steps = [e for e in counted if codes.is_step(e.link.code)]
    return FreezePath(
        seed=seed,
        node=tracer.node,
        frozen_at_s=frozen_at,
        poll_sent_s=path.poll.time_s,
        ladder_created_s=tracer.tasks[path.ladder].created_s,
        power_off_s=tracer.power_off.time_s,
        steps=_measure(tracer, path, steps, lambda e: codes.nearest(e.caller)),
        frames=_measure(tracer, path, counted, lambda e: e.caller),
        out_of_order=tracer.out_of_order,
    )


@contextmanager
def _profiling(tracer: Tracer) -> Iterator[None]:
    previous = sys.getprofile()
    sys.setprofile(tracer)
    try:
        yield
    finally:
        sys.setprofile(previous)


def trace_freeze(
    seed: int = 1, node: str = "spark-3", at: float = 30.0, peers: bool = False
) -> FreezePath:
    """Freeze ``node`` at ``at`` s in a simulated run and trace its path to the power off."""
    tracer = Tracer(node, frozenset(f"spark-{i}" for i in range(1, 5)))  # the simulation's
    with _profiling(tracer):
        report = simulate(
            seed,
            (at + 30.0) / 60.0,
            script=[(at, "freeze", node)],
            overrides={"guards": {"dry_run": False}},
            self_timed="never",
            pair=False,
            peers=peers,
        )
    if report.violations:
        raise TraceError(f"the run broke an invariant: {report.violations[0]}")
    return read_path(tracer, seed, at)


_ROWS: tuple[tuple[str, Callable[[Figures], int]], ...] = (
    ("product modules", lambda f: len(f.modules)),
    ("functions (distinct)", lambda f: f.functions),
    ("calls", lambda f: f.calls),
    ("moves between modules", lambda f: f.moves),
    ("  of which re-entries", lambda f: f.reentries),
    ("tasks", lambda f: f.tasks),
)


def _table(measure: Measure) -> list[str]:
    parts = (measure.whole, measure.tick, measure.cluster_wide, measure.ladder)
    lines = [f"{'':24}{'whole path':>12}{'tick':>8}{'of it cluster-wide':>20}{'ladder':>8}"]
    for name, read in _ROWS:
        a, b, c, d = (read(f) for f in parts)
        lines.append(f"{name:24}{a:>12}{b:>8}{c:>20}{d:>8}")
    return lines


def render(path: FreezePath) -> str:
    """The figures as tables, then each task's module sequence."""
    steps, frames = path.steps, path.frames
    lines = [
        f"The freeze path, poll to power: seed {path.seed}, {path.node} frozen at "
        f"{path.frozen_at_s:g} s (virtual time)",
        f"poll of the frozen node sent at {path.poll_sent_s:g} s, ladder's task created at "
        f"{path.ladder_created_s:g} s, power off sent at {path.power_off_s:g} s",
        "",
        "By steps (plain functions; properties, constructors, default callables and clock "
        "reads are not steps):",
        *_table(steps),
        "",
        "By every product frame (the measure until 2026-12-07):",
        *_table(frames),
        "",
        f"{'module':36}{'functions':>10}{'calls':>7}{'entries':>9}{'entries (frames)':>18}",
    ]
    for module in sorted({*steps.per_module, *frames.per_module}):
        row = steps.per_module.get(module, {"functions": 0, "calls": 0, "entries": 0})
        every = frames.per_module.get(module, {}).get("entries", 0)
        lines.append(
            f"{module:36}{row['functions']:>10}{row['calls']:>7}{row['entries']:>9}{every:>18}"
        )
    lines += ["", "module sequence by steps, each task as it ran (task: its first step):"]
    for task, sequence in steps.tasks.items():
        lines.append(f"  {task}: " + " > ".join(m.removesuffix(".py") for m in sequence))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--node", default="spark-3", help="the node that freezes")
    parser.add_argument("--at", type=float, default=30.0, help="when it freezes (virtual s)")
    parser.add_argument("--peers", action="store_true", help="agents pulse their peers")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    path = trace_freeze(args.seed, args.node, args.at, args.peers)
    print(json.dumps(path.as_json(), indent=2) if args.json else render(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
