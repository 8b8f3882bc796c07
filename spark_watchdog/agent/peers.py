"""Watching the other nodes' agents over a second path (docs/design.md, "Peers").

One thread asks each configured peer's ``GET /v1/pulse`` every
``peering.interval``, one peer after the other, each with ``peering.timeout``;
it never touches the agent's event loop, so a dark fabric never delays the
heartbeat. Per peer it keeps what the last pulse got and when, by this
agent's monotonic clock, it last saw the peer's ``seq`` advance (or its boot
id change) in a well-formed pulse of the right node: the only thing the
controller believes (``progress_ago_s`` in ``/v1/state``'s ``peers``).
Garbage and another node's identity never move it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from spark_watchdog.config.agent import PeerConfig, PeeringConfig
from spark_watchdog.probes.pulse import PulseAnswer, PulseClient

log = logging.getLogger("spark_watchdog.agent.peers")

# A peer failing on every pulse logs at most one line this often.
LOG_EVERY_S = 60.0


@dataclass
class PeerView:
    """What this agent last saw of one peer."""

    name: str
    via: str
    state: str = "pending"
    seq: int | None = None
    boot_id: str | None = None
    progress_at: float | None = None  # monotonic: seq advanced or boot id changed
    answer_at: float | None = None  # monotonic: the last well-formed answer (ok or wrong_node)
    error: str | None = None
    wrong_node_logged: bool = False
    logged_at: float | None = None

    def note(self, answer: PulseAnswer, now: float) -> None:
        """Take one pulse's answer, received at ``now``."""
        self.state = answer.state
        self.error = answer.error
        if answer.pulse is not None:
            self.answer_at = now
        if answer.state != "ok" or answer.pulse is None:
            return
        pulse = answer.pulse
        rebooted = (
            self.boot_id is not None and pulse.boot_id is not None and pulse.boot_id != self.boot_id
        )
        advanced = self.seq is not None and pulse.seq > self.seq
        if rebooted or advanced:
            self.progress_at = now
        self.seq = pulse.seq
        self.boot_id = pulse.boot_id or self.boot_id

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "via": self.via,
            "state": self.state,
            "seq": self.seq,
            "boot_id": self.boot_id,
            "progress_ago_s": _ago(self.progress_at, now),
            "answer_ago_s": _ago(self.answer_at, now),
            "error": self.error,
        }


def _ago(at: float | None, now: float) -> float | None:
    return None if at is None else round(max(0.0, now - at), 3)


class PeerWatch:
    """The pulse thread and what it saw; :meth:`to_json` is safe from any thread."""

    def __init__(
        self,
        peers: tuple[PeerConfig, ...],
        peering: PeeringConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = peering.interval
        self._clock = clock
        self._clients = [PulseClient(p.name, p.url, peering.timeout) for p in peers]
        self._views = {p.name: PeerView(p.name, p.url) for p in peers}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self._clients or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="peer-pulse", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        for client in self._clients:
            client.close()

    def _run(self) -> None:
        due = self._clock()
        while not self._stop.is_set():
            self.pulse_all()
            # A fixed rate; a round slower than the interval starts the next at once.
            due = max(due + self.interval, self._clock())
            self._stop.wait(max(0.0, due - self._clock()))

    def pulse_all(self) -> None:
        """Ask every peer once, one after the other."""
        for client in self._clients:
            if self._stop.is_set():
                return
            try:
                answer = client.ask()
            except Exception as exc:  # never let one odd answer end the thread
                log.exception("pulse to peer %s failed", client.name)
                answer = PulseAnswer("silent", error=f"{type(exc).__name__}: {exc}"[:200])
            now = self._clock()
            with self._lock:
                view = self._views[client.name]
                before = view.state
                view.note(answer, now)
            _log_answer(view, before, now)

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """``/v1/state``'s ``peers``: ages as of ``now`` (default: this moment)."""
        at = self._clock() if now is None else now
        with self._lock:
            return {name: view.to_json(at) for name, view in self._views.items()}


def _log_answer(view: PeerView, before: str, now: float) -> None:
    """Wrong identities once per peer; other failures at most once a minute per peer."""
    if view.state == "wrong_node":
        if not view.wrong_node_logged:
            view.wrong_node_logged = True
            log.warning(
                "peer %s at %s: %s; not evidence of anything",
                view.name,
                view.via,
                view.error,
                extra={"peer": view.name},
            )
        return
    if view.state == "ok":
        if before not in ("ok", "pending") and _may_log(view, now):
            log.info("peer %s answers its pulse again via %s", view.name, view.via)
        return
    if _may_log(view, now):
        log.warning(
            "peer %s at %s: %s (%s); at most one line a minute per peer",
            view.name,
            view.via,
            view.state,
            view.error,
            extra={"peer": view.name},
        )


def _may_log(view: PeerView, now: float) -> bool:
    if view.logged_at is not None and now - view.logged_at < LOG_EVERY_S:
        return False
    view.logged_at = now
    return True
