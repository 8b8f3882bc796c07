"""When a peer's pulses show progress (docs/design.md, "Peers").

A pulse names its agent's run: the boot id and a run id the agent draws at
each start. Progress is only ever a ``seq`` rising within one run, by no
more than a loop can count in the time since that run's last sighting:

- a run's first pulse is a baseline, not progress: an agent restarted on the
  same boot (a new run, its ``seq`` from 0 again) shows progress at its next
  pulse; so does a rebooted node;
- a pulse of a run seen before, with a ``seq`` at or below the highest seen,
  is a stale or replayed pulse: nothing (pulses of two boots or two runs
  alternated never count); until a run has advanced, a ``seq`` further
  behind its first than a stale pulse can be is its baseline instead;
- a ``seq`` further ahead than a loop (one per :data:`MIN_LOOP_S`) can count
  since the run's last sighting, with :data:`STALE_S` of room for a pulse
  late in transit or taken late, plus one, is not a loop's count: a forged
  pulse far ahead is taken for nothing and never holds back the real ``seq``
  behind it (one within that reach blinds for as many loops, as a fabric
  that drops the pulses would).

A few runs are kept per peer; a new one replaces the run that has gone
longest without progress (of runs never advancing, the one whose seq was
taken longest ago).
So made-up runs never push out a run seen advancing unless they advance
themselves, which is progress of its own; before its first advance, the real
run is pushed out only by :data:`MAX_RUNS` runs new to the peer's record
(made up, or replayed from one it no longer keeps) between two of its pulses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from spark_watchdog.config.agent import MIN_LOOP_INTERVAL

# The agent's shortest loop (config ``loop_interval``'s minimum): a run's seq
# rises by at most one per loop.
MIN_LOOP_S = MIN_LOOP_INTERVAL
# A pulse is at most this late when taken: a carried one kept a pulse's length,
# an answer late by its timeout, with room.
STALE_S = 2.0
# Runs kept per peer.
MAX_RUNS = 8

RunKey = tuple[str | None, str | None]  # (boot id, run id)


@dataclass
class _Run:
    seq: int
    seen_at: float  # when ``seq`` was taken (not touched by a stale or replayed pulse)
    progress_at: float | None = None


@dataclass
class Sighting:
    """What one pulse was: ``progress``, a ``baseline``, ``stale`` or ``implausible``."""

    kind: str
    seq: int
    boot_id: str | None


class Sightings:
    """One peer's runs and the latest progress among them (not thread-safe:
    the caller holds its lock)."""

    def __init__(self) -> None:
        self._runs: dict[RunKey, _Run] = {}
        self.latest: RunKey | None = None  # the run of the last pulse taken

    def take(self, boot_id: str | None, run: str | None, seq: int, now: float) -> Sighting:
        """One well-formed pulse of this peer, received at ``now``."""
        # A run id is drawn at each start: it alone names the run (its first
        # pulses may name no boot yet); without one, the boot does.
        key = (None, run) if run is not None else (boot_id, None)
        known = self._runs.get(key)
        if known is None:
            self._make_room()
            self._runs[key] = _Run(seq, now)
            self.latest = key
            return Sighting("baseline", seq, boot_id)
        if seq <= known.seq:
            if known.progress_at is None and known.seq - seq > most_loops(STALE_S):
                # A run not seen advancing yet, its first pulse far ahead of
                # this one: a forged baseline holds nothing back (a stale pulse
                # is never that far behind).
                known.seq, known.seen_at = seq, now
                self.latest = key
                return Sighting("baseline", seq, boot_id)
            return Sighting("stale", seq, boot_id)
        # Measured between receipts, with room for one pulse's transit or wait.
        if seq - known.seq > most_loops(now - known.seen_at + STALE_S):
            return Sighting("implausible", seq, boot_id)
        known.seq = seq
        known.seen_at = max(known.seen_at, now)
        known.progress_at = max(known.progress_at or now, now)
        self.latest = key
        return Sighting("progress", seq, boot_id)

    def seq(self) -> int | None:
        """The seq of the run last taken."""
        run = None if self.latest is None else self._runs.get(self.latest)
        return None if run is None else run.seq

    def _make_room(self) -> None:
        if len(self._runs) < MAX_RUNS:
            return
        # The run longest without progress goes; of those never advancing, the
        # one whose seq was taken longest ago (a replay of a run's pulse does
        # not keep it: it is not taken).
        oldest = min(
            self._runs,
            key=lambda k: (self._runs[k].progress_at or -math.inf, self._runs[k].seen_at),
        )
        del self._runs[oldest]


def most_loops(elapsed: float) -> int:
    """The most a run's ``seq`` can rise in ``elapsed`` seconds."""
    return 1 + math.ceil(max(0.0, elapsed) / MIN_LOOP_S)
