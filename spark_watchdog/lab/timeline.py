"""A live, readable timeline of what the controller does, told as it happens.

Nothing here is scripted: :class:`TimelineWatcher` polls the controller's
own records, the history database (each incident's write-ahead steps,
actions, serving restarts and boots) and ``GET /v1/status`` (each node's
verdict), and turns what is new into one line each::

    t=+ 9.4s spark-3 host_frozen (agent silent 3.0s, no ssh banner x2): incident #1 opened
    t=+ 9.7s PDU outlet 3 off (verified 0.2s)
    t=+14.6s serving restarted with profile safe (adaptive verification off) in 4.1s
    t=+14.6s incident #1 recovered: detected in 3.4s, recovered in 5.2s

It needs only the controller's config (node names, power devices, the head's
agent), so it would narrate a real cluster's controller just as well.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from spark_watchdog.config.controller import ControllerConfig, SnmpDevice
from spark_watchdog.errors import StoreError
from spark_watchdog.history.records import Incident, IncidentStep
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.verdicts import INCIDENT_KINDS

# policy.power_off_seconds' default: a GB10 "clock latch" clears after 30-60 s off.
PRODUCTION_OFF_S = 60.0
# Verdicts an incident line already announces, with its reasons: those that open one.
_ANNOUNCED_BY_INCIDENT = frozenset(INCIDENT_KINDS)
# Steps that only repeat what the next line says (the verified step has the timing).
_QUIET_STEPS = frozenset(
    {"off_requested", "on_requested", "power_restored", "hold_done", "incident_opened"}
)

# The wedged-but-alive ladder's steps (controller/act/wedged.py), as people read them.
_WEDGED_STEPS = {
    "still_wedged": "the GPU still does not answer",
    "reboot_requested": "forced reboot over ssh (recorded before it is sent)",
    "reboot_sent": "the forced reboot left",
    "reboot_not_sent": "the forced reboot could not be sent",
    "handed_to_power_path": "silent after the reboot: the freeze path takes over",
}


@dataclass
class Clock:
    """Seconds since the story began; wall-clock times of records map onto it."""

    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    last: float = 0.0

    def now(self) -> float:
        return time.monotonic() - self.started

    def at_wall(self, wall: float) -> float:
        return wall - self.started_wall


class Narrator:
    """Prints ``t=+S.Ss text`` lines (monotonic in t) and keeps them."""

    def __init__(
        self, clock: Clock | None = None, echo: Callable[[str], None] | None = None
    ) -> None:
        self.clock = clock or Clock()
        # Flushed: the story is read as it happens, also through a pipe.
        self.echo = echo if echo is not None else lambda line: print(line, flush=True)
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def say(self, text: str, wall: float | None = None) -> None:
        with self._lock:
            t = self.clock.now() if wall is None else self.clock.at_wall(wall)
            # Records are read a moment after they were written: keep lines in order.
            t = max(t, self.clock.last)
            self.clock.last = t
            line = f"t=+{t:5.1f}s {text}"
            self.lines.append(line)
            if self.echo is not None:
                self.echo(line)


@dataclass
class _IncidentView:
    incident: Incident
    seen_seq: int = 0
    times: dict[str, float] = field(default_factory=dict)
    device: str | None = None  # the power device the last rung used
    boots_told: bool = False
    done: bool = False


class TimelineWatcher:
    """Polls the history and the controller's status in a thread; narrates news."""

    def __init__(
        self,
        config: ControllerConfig,
        status_url: str,
        narrator: Narrator,
        *,
        interval: float = 0.25,
    ) -> None:
        self.config = config
        self.status_url = status_url.rstrip("/")
        self.narrator = narrator
        self.interval = interval
        self.verdicts: dict[str, str] = {}
        self.all_healthy_seen = False
        self._incidents: dict[int, _IncidentView] = {}
        self._store: HistoryStore | None = None
        self._stop = threading.Event()
        self._polling = threading.Lock()  # the thread, or a caller catching up
        self._thread = threading.Thread(target=self._run, name="lab-timeline", daemon=True)

    def start(self) -> TimelineWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if self._store is not None:
            self._store.close()
            self._store = None

    def poll(self) -> None:
        """One look at the status and the history (the thread calls this)."""
        with self._polling:
            self._poll_history()
            self._poll_status()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as exc:  # a narrator must never take the lab down
                self.narrator.say(f"(timeline: {type(exc).__name__}: {exc})")
            self._stop.wait(self.interval)
        with contextlib.suppress(Exception):
            self.poll()  # what happened since the last look

    # -- status ---------------------------------------------------------------

    def _poll_status(self) -> None:
        try:
            status = requests.get(f"{self.status_url}/v1/status", timeout=1).json()
        except (requests.RequestException, ValueError):
            return
        nodes = status.get("nodes") if isinstance(status, dict) else None
        if not isinstance(nodes, list):
            return
        for node in nodes:
            name, verdict = str(node.get("name")), str(node.get("verdict"))
            before = self.verdicts.get(name)
            self.verdicts[name] = verdict
            if before == verdict or not self.all_healthy_seen:
                continue
            if verdict in _ANNOUNCED_BY_INCIDENT:
                continue
            reasons = ", ".join(node.get("reasons") or [])
            if verdict == "held":
                reasons = str(node.get("held_reason") or reasons)
            if verdict == "healthy":
                self.narrator.say(f"{name} healthy again")
            elif verdict == "booting":
                self.narrator.say(f"{name} booting (the controller waits for a new boot id)")
            else:
                self.narrator.say(f"{name} {verdict}" + (f" ({reasons})" if reasons else ""))
        if (
            not self.all_healthy_seen
            and self.verdicts
            and all(v == "healthy" for v in self.verdicts.values())
        ):
            self.all_healthy_seen = True
            self.narrator.say(f"controller: every node healthy ({', '.join(self.verdicts)})")

    # -- history --------------------------------------------------------------

    def _open_store(self) -> HistoryStore | None:
        if self._store is None and Path(self.config.history).exists():
            with contextlib.suppress(StoreError):
                self._store = HistoryStore(self.config.history, read_only=True)
        return self._store

    def _poll_history(self) -> None:
        store = self._open_store()
        if store is None:
            return
        try:
            incidents = store.list_incidents(limit=100)
        except StoreError:
            return
        for incident in sorted(incidents, key=lambda i: i.id):
            view = self._incidents.get(incident.id)
            if view is None:
                view = self._incidents[incident.id] = _IncidentView(incident)
            view.incident = incident
            if view.done:
                continue
            try:
                steps = store.steps(incident.id)
            except StoreError:
                continue
            for step in steps:
                if step.seq <= view.seen_seq:
                    continue
                view.seen_seq = step.seq
                view.times[step.step] = step.at
                text = self._describe(store, view, step)
                if text:
                    self.narrator.say(text, wall=step.at)
            if not view.boots_told and "new_boot_seen" in view.times:
                self._tell_boots(store, view)
            if incident.status == "resolved" and view.seen_seq and "resolved" in view.times:
                view.done = True

    def _device(self, key_path: Any) -> str:
        """``nodes[2].power[0]`` as people say it: PDU outlet 3."""
        for node_index, node in enumerate(self.config.nodes):
            for path_index, device in enumerate(node.power):
                if key_path == f"nodes[{node_index}].power[{path_index}]":
                    if isinstance(device, SnmpDevice):
                        outlet = device.outlet if device.outlet is not None else device.outlets
                        return f"PDU outlet {outlet}"
                    return f"{device.type} power path of {node.name}"
        return str(key_path)

    def _describe(self, store: HistoryStore, view: _IncidentView, step: IncidentStep) -> str | None:
        incident, detail, name = view.incident, dict(step.detail), step.step
        if detail.get("device") is not None:
            view.device = self._device(detail.get("device"))
        device = view.device or "the power path"
        if name == "incident_opened":
            reasons = incident.evidence.get("reasons") if incident.evidence else None
            why = f" ({', '.join(map(str, reasons))})" if reasons else ""
            dry = " (dry run)" if incident.dry_run else ""
            return (
                f"{', '.join(incident.nodes)} {incident.kind}{why}: "
                f"incident #{incident.id} opened{dry}"
            )
        if name in _QUIET_STEPS:
            return None
        if name in _POWER_LINES:
            return _power_line(name, step, detail, device, view.times)
        if name == "boot_wait_started":
            after = "forced reboot sent" if incident.kind == "gpu_wedged" else "power restored"
            return f"{after}; waiting for {step.node} to boot with a new boot id"
        if name == "new_boot_seen":
            new, old = str(detail.get("boot_id")), str(detail.get("boot_id_before"))
            return f"{step.node} booted: new boot id {new[:8]} (was {old[:8]})"
        if name == "serving_restart_deferred":
            waiting = ", ".join(map(str, detail.get("waiting_for") or []))
            return f"serving restart deferred: {waiting} still recovering (every rank restarts)"
        if name == "serving_restart_started":
            return (
                f"serving restart on every node with profile {detail.get('profile')} "
                "(head stops first, workers start first)"
            )
        if name == "serving_restart_done":
            return self._serving_done(store, incident.id, detail)
        if name == "resolved":
            return self._resolved(store, incident)
        if name == "preflight_answered":
            return f"{step.node} answered before any power command ({detail.get('why')})"
        if name == "boot_timeout":
            return f"{step.node}: no new boot within {detail.get('timeout_s')}s"
        if name == "resumed":
            return (
                f"controller restarted: resuming incident #{incident.id} after "
                f"{detail.get('last_step')} (outlet reads {detail.get('state')})"
            )
        if name == "dry_run":
            return f"dry run: {detail.get('decision') or detail.get('would') or 'recorded only'}"
        if name in _WEDGED_STEPS:
            return f"{step.node}: {_WEDGED_STEPS[name]}"
        return f"{step.node + ' ' if step.node else ''}{name}"

    def _serving_done(self, store: HistoryStore, incident_id: int, detail: dict[str, Any]) -> str:
        restarts = [r for r in store.serving_restarts(limit=20) if r.incident_id == incident_id]
        if not restarts:
            return f"serving restart: {detail.get('result')}"
        restart = restarts[0]
        took = f" in {restart.duration_s:.1f}s" if restart.duration_s is not None else ""
        if restart.result != "succeeded":
            return f"serving restart with profile {restart.profile} {restart.result}{took}: " + (
                restart.error or ""
            )
        note = f"; {detail['note']}" if detail.get("note") else ""
        return f"serving restarted with profile {restart.profile}{self._effective()}{took}{note}"

    def _effective(self) -> str:
        """What the head's rank runs now, as its agent reports it."""
        head = self.config.serving.head
        node = next((n for n in self.config.nodes if n.name == head), None)
        if node is None:
            return ""
        try:
            serving = requests.get(f"{node.agent.rstrip('/')}/v1/serving", timeout=2).json()
        except (requests.RequestException, ValueError):
            return ""
        if not isinstance(serving, dict):
            return ""
        requested = serving.get("requested") or {}
        effective = serving.get("effective") or {}
        parts = []
        adaptive = effective.get("enable_adaptive_verification")
        if adaptive is None:
            adaptive = requested.get("enable_adaptive_verification")
        if adaptive is not None:
            parts.append(f"adaptive verification {'on' if adaptive else 'off'}")
        mode = effective.get("cudagraph_mode") or requested.get("cudagraph_mode")
        if mode:
            parts.append(f"cudagraph_mode {mode}")
        if serving.get("effective_matches_profile") is True:
            parts.append("confirmed by the engine's log")
        return f" ({', '.join(parts)})" if parts else ""

    def _resolved(self, store: HistoryStore, incident: Incident) -> str:
        with contextlib.suppress(StoreError):
            incident = store.get_incident(incident.id)
        what = incident.resolution or "resolved"
        if incident.resolution == "recovered":
            detect = incident.time_to_detect_s
            recover = incident.time_to_recover_s
            timing = []
            if detect is not None:
                timing.append(f"detected in {detect:.1f}s")
            if recover is not None:
                timing.append(f"recovered in {recover:.1f}s")
            return f"incident #{incident.id} recovered" + (
                f": {', '.join(timing)}" if timing else ""
            )
        steps = [s for s in store.steps(incident.id) if s.step == "resolved"]
        why = steps[-1].detail.get("why") if steps else None
        return f"incident #{incident.id} {what}" + (f": {why}" if why else "")

    def _tell_boots(self, store: HistoryStore, view: _IncidentView) -> None:
        """The journal's account of the boot that froze, once the agent sent it."""
        for node in view.incident.nodes:
            try:
                boots = [b for b in store.boots(node) if b.incident_id == view.incident.id]
            except StoreError:
                return
            for boot in boots:
                view.boots_told = True
                end = {True: "cleanly", False: "UNCLEANLY (no 'Journal stopped')", None: "?"}
                counts = boot.evidence.get("evidence_counts") or {}
                found = ", ".join(f"{k} x{v}" for k, v in counts.items() if v)
                lines = [
                    str(e.get("message"))
                    for e in boot.evidence.get("evidence") or []
                    if isinstance(e, dict) and e.get("kind") != "tail"
                ]
                self.narrator.say(
                    f"{node}'s previous boot {boot.boot_id[:8]} ended "
                    f"{end[boot.clean_shutdown]}" + (f"; kernel evidence: {found}" if found else "")
                )
                if lines:
                    last = lines[-1]
                    self.narrator.say(
                        f"  its last kernel line: {last[:72]}" + "..." * (len(last) > 72)
                    )


# The steps of a power path, as one line each.
_POWER_LINES = frozenset(
    {
        "rung_started",
        "off_verified",
        "on_verified",
        "already_off",
        "already_on",
        "hold_started",
        "off_ambiguous",
        "on_ambiguous",
        "rung_failed",
    }
)


def _power_line(
    name: str, step: IncidentStep, detail: dict[str, Any], device: str, times: dict[str, float]
) -> str:
    inner = detail.get("detail")
    if name == "rung_started":
        return f"fencing {step.node}: power path {int(detail.get('rung', 0)) + 1}, {device}"
    if name in ("off_verified", "on_verified"):
        word = name.split("_")[0]
        asked = times.get(f"{word}_requested")
        took = f" (verified {step.at - asked:.1f}s)" if asked is not None else " (verified)"
        return f"{device} {word}{took}"
    if name in ("already_off", "already_on"):
        return f"{device} read back {name.split('_')[1]} already: no command sent"
    if name == "hold_started":
        held = inner if isinstance(inner, str) and inner else f"{detail.get('remaining_s')}s"
        return (
            f"{device} held off {held} "
            f"(production default {PRODUCTION_OFF_S:g}s: GB10's clock latch)"
        )
    if name in ("off_ambiguous", "on_ambiguous"):
        return f"{device}: {name.replace('_', ' ')}: {inner}"
    assert name == "rung_failed", f"{name} is not in _POWER_LINES"
    return f"{device} failed: {detail.get('error')}"
