"""Which product frames are steps of the freeze path, and which are the tick's
cluster-wide work (bench/freeze_path_trace.py counts by these).

A **step** is a plain ``def`` function or method of the product. Not a step,
and so transparent to the measure (what it calls counts from the nearest
step that called it):

- a property's getter, setter or deleter (``NodeWatch.last_life_at``): a
  read of a value, written as a function;
- a constructor (``__init__``): an object made, not a step taken;
- a default-value callable: a function a dataclass field or a parameter has
  as its default or default factory (``Fence.deposed``'s ``_never``);
- a clock read: a method of a clock class in spark_watchdog/clock.py or
  spark_watchdog/controller/clock.py (``monotonic``, ``time``, ``sleep``);
- a comprehension or generator expression (the trace counts them as the
  function they are written in already).

The **cluster-wide work** is what the tick does for the cluster as a whole,
whichever node froze: the holds read, the serving profile synced, the
breaker checked, the cluster's view built, the sweep's time noted, the doubt
about the watcher told. A frame is of it when it, or a frame it was called
from, is one of :data:`CLUSTER_WIDE`.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import typing
from collections.abc import Iterable, Iterator
from types import CodeType, FunctionType, ModuleType
from typing import Protocol, TypeVar

PRODUCT = "spark_watchdog."
# Not product code to this measure (as bench/freeze_path_trace.py's docstring says).
NOT_PRODUCT = ("spark_watchdog.simulation", "spark_watchdog.history")
CLOCKS = frozenset({"spark_watchdog.clock", "spark_watchdog.controller.clock"})
# The tick's work for the cluster as a whole (controller/daemon.py, Controller.tick).
CLUSTER_WIDE = frozenset(
    {
        "Holds.sync",
        "ServingRestarts.sync_profile",
        "Holds.note_breaker",
        "Holds.breaker_open_for",
        "plan_cluster",
        "Hands.carry_out_cluster",
        "cluster_view",
        "WatcherDoubt.sweep_took",
        "Controller._cluster_parts",
    }
)


class Link(Protocol):
    """A product frame's place in the trace: its code and the frame it was called
    from (for its task's first frame: the frame that created the task)."""

    @property
    def code(self) -> CodeType: ...

    @property
    def parent(self) -> Link | None: ...


L = TypeVar("L", bound=Link)


def qualname(code: CodeType) -> str:
    """The function's qualified name (``Class.method``; Python 3.10 has the bare name only)."""
    return str(getattr(code, "co_qualname", code.co_name))


def _functions(value: object) -> Iterator[FunctionType]:
    """The plain functions behind ``value``: itself, or what a static or class method wraps."""
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if isinstance(value, FunctionType):
        yield value


def _defaults(function: FunctionType) -> Iterator[object]:
    yield from function.__defaults__ or ()
    yield from (function.__kwdefaults__ or {}).values()


def _accessors(value: object) -> Iterator[object]:
    if isinstance(value, property):
        yield from (value.fget, value.fset, value.fdel)
    elif isinstance(value, functools.cached_property):
        yield value.func


def _classes(module: ModuleType) -> Iterator[type]:
    """The classes written in ``module``, nested ones too."""
    pending = [v for v in vars(module).values() if isinstance(v, type)]
    while pending:
        cls = pending.pop()
        if cls.__module__ != module.__name__:
            continue
        yield cls
        pending.extend(
            v
            for v in vars(cls).values()
            if isinstance(v, type) and v.__qualname__.startswith(f"{cls.__qualname__}.")
        )


class StepCodes:
    """The product's code objects that are not steps, read from its loaded modules."""

    def __init__(self, modules: Iterable[ModuleType]) -> None:
        self._kept: list[CodeType] = []  # ids stay theirs while kept
        self._not_steps: set[int] = set()
        for module in modules:
            self._read(module)

    @classmethod
    def loaded(cls) -> StepCodes:
        """From every product module loaded now (after a run: all it used)."""
        modules = [
            m
            for name, m in list(sys.modules.items())
            if name.startswith(PRODUCT) and not name.startswith(NOT_PRODUCT) and m is not None
        ]
        return cls(modules)

    def _not_step(self, values: Iterable[object]) -> None:
        for value in values:
            for function in _functions(value):
                self._kept.append(function.__code__)
                self._not_steps.add(id(function.__code__))

    def _read(self, module: ModuleType) -> None:
        for value in vars(module).values():
            for function in _functions(value):
                self._not_step(_defaults(function))
        for cls in _classes(module):
            members = vars(cls).values()
            for value in members:
                self._not_step(_accessors(value))
                for function in _functions(value):
                    self._not_step(_defaults(function))
                    if module.__name__ in CLOCKS:
                        self._not_step([function])
            if dataclasses.is_dataclass(cls):
                for f in dataclasses.fields(cls):
                    self._not_step([f.default, f.default_factory])

    def is_step(self, code: CodeType) -> bool:
        return code.co_name != "__init__" and id(code) not in self._not_steps

    def nearest(self, link: L | None) -> L | None:
        """``link`` if it is a step, else the nearest step it was called from."""
        while link is not None and not self.is_step(link.code):
            link = typing.cast("L | None", link.parent)  # a link's parent is of its kind
        return link


def cluster_wide(link: Link | None) -> bool:
    """The frame is of the tick's cluster-wide work (it or a caller is one of CLUSTER_WIDE)."""
    while link is not None:
        if qualname(link.code) in CLUSTER_WIDE:
            return True
        link = link.parent
    return False
