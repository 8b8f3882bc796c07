"""Chaos on a controller pair in the middle of a freeze recovery.

Two real controller processes on one real PostgreSQL server, each through a
TCP proxy of its own (tcp_proxy.py), the lab's SNMP PDU and cluster of real
processes. A node freezes; when the leader's recovery reaches a write-ahead
point (the incident opened, the off recorded, the hold begun, the on
recorded, the boot awaited), the leader meets one fault: SIGKILL; SIGSTOP
for half a lease, for a lease and a send deadline, for ten leases; its
database link blackholed, reset or slowed; the standby's link blackholed;
the server itself restarted with ``pg_ctl restart -m immediate``; or a
SIGKILL with every core kept busy while the standby takes over (it must
keep its lease).

Then the invariants, from the PDU's own command log and the history:

- every command has a recorded step before it (``off_requested`` before an
  off, ``on_requested`` before an on), written at the epoch that led when the
  command arrived, and arrived within the send deadline of it (plus what the
  write itself took) and before that epoch's lease ended;
- the history and the PDU log match one to one: no step stands for two
  commands, and a step without a command is explained (withdrawn, or its
  writer lost the lease and a later epoch took over); no command follows a
  step that says it was withdrawn; no command reaches a node that did not
  freeze;
- at most one off per try of an incident's rung (a rung is tried a second
  time only after a resumed off was never seen to land: the outlet read on,
  no new boot within the boot timeout); every on at least the off hold after
  the off before it;
- epochs strictly increase, and each incident's steps never go back to an
  older epoch;
- a leader woken deposed says nothing about nodes and resumes nothing;
- the node is recovered within lease + settle + off hold + boot timeout +
  detection, one boot timeout more where the rung needed a second try, and
  one lease, settle and restart more for each takeover past the first.

Each controller is started again 5 s after it exits, as its systemd unit
does (``Restart=always``): on a loaded machine the leader can lose its lease
before the fault, and the fault then meets the controller that took over;
someone must still be there to finish the recovery.

By default each fault meets one write-ahead point (they rotate, so every
point is met by some fault); SPARK_WATCHDOG_CHAOS=all runs every fault at
every point (50 runs).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.controller.pair.fence import Fence
from spark_watchdog.errors import StoreError
from spark_watchdog.history.leadership import current
from spark_watchdog.history.postgres import PostgresHistoryStore
from spark_watchdog.history.records import Incident, IncidentStep
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.cluster import LAB_POWER_OFF_S, LabCluster
from spark_watchdog.lab.controller_pair import (
    LEADERSHIP,
    RESTART_S,
    ControllerPair,
    wait_for,
)
from spark_watchdog.lab.hardware.tcp_proxy import TcpProxy
from spark_watchdog.lab.lab_controller import ControllerThread
from spark_watchdog.lab.node import LabNode

LEASE = LEADERSHIP["lease"]
DEADLINE = LEADERSHIP["send_deadline"]
DELAY_S = 0.25  # per chunk, each way, on the slowed link
# The lab's detection (freeze_after 3 s, polls and banner checks) and boot.
DETECTION_S = 3.0 + 5.0
BOOT_TIMEOUT_S = 30.0
RECOVERY_BOUND_S = LEASE + LEADERSHIP["settle"] + LAB_POWER_OFF_S + BOOT_TIMEOUT_S + DETECTION_S

POINTS = ["opened", "off_requested", "hold_started", "on_requested", "boot_wait_started"]
FAULTS = [
    "kill",
    "stop_half_lease",
    "stop_lease_and_deadline",
    "stop_ten_leases",
    "blackhole",
    "reset",
    "delay",
    "standby_blackhole",
    "pg_restart",
    "busy_cores",
]
LEADER_LINK_FAULTS = ("blackhole", "reset", "delay")


# Side by side (tests/support/suite_plan.py): the runs fall into this many
# groups, each on a pair lab of its own.
CHAOS_GROUPS = 3


def _cases() -> list[Any]:
    if os.environ.get("SPARK_WATCHDOG_CHAOS") == "all":
        cases = [(f, p) for f in FAULTS for p in POINTS]
    else:
        cases = [(f, POINTS[i % len(POINTS)]) for i, f in enumerate(FAULTS)]
    return [
        pytest.param(*case, marks=pytest.mark.xdist_group(f"pair-chaos-{i % CHAOS_GROUPS + 1}"))
        for i, case in enumerate(cases)
    ]


# -- what the test watches ------------------------------------------------------------


class EpochWatch:
    """Every epoch the leadership row shows, with when it was taken (the
    database's clock), read every 50 ms on a connection of the test's own."""

    def __init__(self, store: PostgresHistoryStore) -> None:
        self.store = store
        self.taken: list[tuple[int, float]] = []
        self.expires: dict[int, float] = {}  # each epoch's lease end, as last seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> EpochWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _watch(self) -> None:
        while not self._stop.wait(0.05):
            try:
                leader = current(self.store)
            except StoreError:
                continue  # the server restarting: the next read reconnects
            if leader is None:
                continue
            if not self.taken or self.taken[-1][0] != leader.epoch:
                self.taken.append((leader.epoch, leader.acquired_at))
            self.expires[leader.epoch] = leader.expires_at

    def epoch_at(self, wall: float) -> int | None:
        """The epoch that led at ``wall`` (None: none yet)."""
        led = [epoch for epoch, taken in self.taken if taken <= wall]
        return led[-1] if led else None


@dataclass(frozen=True)
class Command:
    target: int  # 2: off, 1: on (the lab PDU's values)
    at: float  # wall clock


@dataclass
class Evidence:
    commands: list[Command]
    incidents: list[Incident]
    steps: dict[int, list[IncidentStep]]
    epochs: list[tuple[int, float]]
    epoch_at: Callable[[float], int | None]
    frozen_at: float
    tolerance_s: float
    expires: dict[int, float] = field(default_factory=dict)  # each epoch's lease end
    # What reached the outlets of the nodes that did not freeze (must be nothing).
    elsewhere: list[Command] = field(default_factory=list)


_REQUESTED = {"off_requested": 2, "on_requested": 1}
_EXPLAINED = {"off_withdrawn", "on_withdrawn"}


Matched = dict[tuple[int, int], Command]  # (incident, seq) of a *_requested step


def violations(e: Evidence) -> list[str]:
    """Every invariant of the module's docstring that the evidence breaks."""
    problems: list[str] = [
        f"a command ({c.target}) at {c.at:.3f} to a node that did not freeze" for c in e.elsewhere
    ]
    problems += [
        f"a SET of {c.target} at {c.at:.3f}: neither an off (2) nor an on (1)"
        for c in e.commands
        if c.target not in (1, 2)
    ]
    matched: Matched = {}
    problems += _match_commands(e, matched)
    problems += _unexplained_steps(e, matched)
    problems += _offs_and_holds(e, matched)
    problems += _epochs(e)
    problems += _recovered(e)
    return problems


def _match_commands(e: Evidence, matched: Matched) -> list[str]:
    """Each command to its step: the latest unmatched one of its kind before it."""
    problems: list[str] = []
    requested = sorted(
        (s for steps in e.steps.values() for s in steps if s.step in _REQUESTED),
        key=lambda s: s.at,
    )
    for command in sorted(e.commands, key=lambda c: c.at):
        before = [
            s
            for s in requested
            if _REQUESTED[s.step] == command.target
            and s.at <= command.at
            and (s.incident_id, s.seq) not in matched
        ]
        what = "off" if command.target == 2 else "on"
        if not before:
            problems.append(f"an {what} at {command.at:.3f} with no recorded step before it")
            continue
        step = before[-1]
        matched[(step.incident_id, step.seq)] = command
        after = [x for x in e.steps[step.incident_id] if x.seq == step.seq + 1]
        if after and after[0].step in _EXPLAINED:
            problems.append(f"the {what} at {command.at:.3f} left although its step was withdrawn")
        waited = command.at - step.at
        if waited > DEADLINE + e.tolerance_s:
            problems.append(
                f"the {what} arrived {waited:.2f}s after its step, past the send deadline"
            )
        ended = e.expires.get(step.epoch or 0)
        if ended is not None and command.at > ended:
            problems.append(
                f"the {what} at {command.at:.3f} arrived after its epoch's lease ended "
                f"({ended:.3f})"
            )
        led = e.epoch_at(command.at)
        if step.epoch != led:
            problems.append(
                f"the {what} at {command.at:.3f} was written at epoch {step.epoch} "
                f"while epoch {led} led"
            )
    return problems


def _unexplained_steps(e: Evidence, matched: Matched) -> list[str]:
    """A *_requested step with no command: withdrawn, or its writer was deposed."""
    problems: list[str] = []
    for steps in e.steps.values():
        for index, s in enumerate(steps):
            if s.step not in _REQUESTED or (s.incident_id, s.seq) in matched:
                continue
            later = steps[index + 1 :]
            if not later or not (
                later[0].step in _EXPLAINED or any((x.epoch or 0) > (s.epoch or 0) for x in later)
            ):
                problems.append(
                    f"incident {s.incident_id} step {s.seq} {s.step} (epoch {s.epoch}) "
                    "has no command and nothing explains it"
                )
    return problems


def _offs_and_holds(e: Evidence, matched: Matched) -> list[str]:
    offs: dict[tuple[int, object, int], int] = {}
    for (incident_id, seq), command in matched.items():
        if command.target != 2:
            continue
        step = next(s for s in e.steps[incident_id] if s.seq == seq)
        started = [x for x in e.steps[incident_id] if x.seq < seq and x.step == "rung_started"]
        rung = (incident_id, step.detail.get("rung"), _try_of(started))
        offs[rung] = offs.get(rung, 0) + 1
    problems = [
        f"{n} offs for incident {i} rung {r} (try {t})" for (i, r, t), n in offs.items() if n > 1
    ]
    problems += [f"try {t} of incident {i} rung {r}" for (i, r, t) in offs if t > 2]
    ordered = sorted(e.commands, key=lambda c: c.at)
    for index, command in enumerate(ordered):
        if command.target != 1:
            continue
        off = next((c for c in reversed(ordered[:index]) if c.target == 2), None)
        if off is not None and command.at - off.at < LAB_POWER_OFF_S - 0.01:
            problems.append(f"an on {command.at - off.at:.2f}s after its off, inside the hold")
    return problems


def _epochs(e: Evidence) -> list[str]:
    problems: list[str] = []
    seen = [epoch for epoch, _ in e.epochs]
    if seen != sorted(set(seen)):
        problems.append(f"epochs did not strictly increase: {seen}")
    for incident_id, steps in e.steps.items():
        written = [s.epoch for s in steps]
        if None in written or written != sorted(written):  # type: ignore[type-var]
            problems.append(f"incident {incident_id} steps' epochs went back: {written}")
    return problems


def _try_of(started: list[IncidentStep]) -> int:
    """Which try of its rung the latest of these ``rung_started`` steps began."""
    attempt = started[-1].detail.get("attempt", 1) if started else 1
    return attempt if isinstance(attempt, int) else 1


def _recovered(e: Evidence) -> list[str]:
    frozen = [i for i in e.incidents if i.kind == "host_frozen"]
    if not frozen or frozen[0].status != "resolved" or frozen[0].resolution != "recovered":
        return [f"the freeze is not recovered: {frozen}"]
    tries = [_try_of([s]) for s in e.steps.get(frozen[0].id, []) if s.step == "rung_started"]
    # A second try comes after a whole boot wait for the first one's fate.
    bound = RECOVERY_BOUND_S + (BOOT_TIMEOUT_S if max(tries, default=1) > 1 else 0.0)
    # Each takeover past the first waits out one more lease, and where both
    # controllers had exited, one more start of the unit.
    bound += max(0, len(e.epochs) - 2) * (LEASE + LEADERSHIP["settle"] + RESTART_S)
    if frozen[0].resolved_at is not None:
        took = frozen[0].resolved_at - e.frozen_at
        if took > bound:
            return [f"recovered {took:.1f}s after the freeze, past {bound}s"]
    return []


# -- the faults ------------------------------------------------------------------------


@dataclass
class Chaos:
    pair: ControllerPair
    proxy: TcpProxy  # the first leader's link
    standby_proxy: TcpProxy  # the standby's
    wakers: list[threading.Thread] = field(default_factory=list)
    # Where a's log stood when it was woken (a paused leader; None: not paused).
    woke_at: int | None = None
    # One busy process per core (busy_cores), stopped by heal().
    spinners: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def inject(self, fault: str) -> None:
        a = self.pair.processes["a"]
        pauses = {
            "stop_half_lease": LEASE / 2,
            "stop_lease_and_deadline": LEASE + DEADLINE,
            "stop_ten_leases": 10 * LEASE,
        }
        if fault == "kill":
            a.kill()
        elif fault == "busy_cores":
            # Every core kept busy from here to the end: the standby takes over,
            # and must keep its lease, on a machine with no core to spare.
            self.spinners = [
                subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(os.cpu_count() or 2)
            ]
            a.kill()
        elif fault == "stop_ten_leases":
            # The long pause: the leader wakes to a later epoch that has finished
            # its recovery. It wakes one lease after the incident is resolved (ten
            # leases at most): the same branch as ten leases of sleep, without
            # waiting them all out when the new leader is done sooner.
            os.kill(a.pid, signal.SIGSTOP)
            waker = threading.Thread(target=self._wake_after_resolution, args=(a.pid,))
            waker.start()
            self.wakers.append(waker)
        elif fault in pauses:
            os.kill(a.pid, signal.SIGSTOP)
            timer = threading.Timer(pauses[fault], self._wake, (a.pid,))
            timer.start()
            self.wakers.append(timer)
        elif fault == "blackhole":
            self.proxy.blackhole()
        elif fault == "reset":
            assert self.proxy.reset() >= 1
        elif fault == "delay":
            self.proxy.delay(DELAY_S)
        elif fault == "standby_blackhole":
            self.standby_proxy.blackhole()
        elif fault == "pg_restart":
            self.pair.server.restart_immediate()
        else:
            raise AssertionError(fault)

    def _wake_after_resolution(self, pid: int) -> None:
        latest = time.monotonic() + 10 * LEASE
        resolved_at: float | None = None
        # A connection of its own: the test's thread reads through the pair's.
        store = PostgresHistoryStore(
            self.pair.url, password_file=str(self.pair.server.password_file)
        )
        try:
            while time.monotonic() < latest:
                if resolved_at is None and _resolved(store):
                    resolved_at = time.monotonic()
                if resolved_at is not None and time.monotonic() >= resolved_at + LEASE:
                    break
                time.sleep(0.2)
        finally:
            self._wake(pid)
            store.close()

    def _wake(self, pid: int) -> None:
        self.woke_at = len(self.pair.log("a"))
        os.kill(pid, signal.SIGCONT)

    def heal(self) -> None:
        for spinner in self.spinners:
            spinner.kill()
            spinner.wait(30)
        for waker in self.wakers:
            waker.join()
        self.proxy.heal()
        self.standby_proxy.heal()


def _resolved(store: PostgresHistoryStore) -> bool:
    try:
        return any(i.status == "resolved" for i in store.list_incidents())
    except StoreError:
        return False  # the server restarting: the next read reconnects


@pytest.fixture
def proxies(pair: ControllerPair) -> Iterator[tuple[TcpProxy, TcpProxy]]:
    with TcpProxy(pair.server.port) as a, TcpProxy(pair.server.port) as b:
        yield a, b


def _reached(pair: ControllerPair, node: LabNode, point: str) -> bool:
    found = [i for i in pair.store.list_incidents() if i.kind == "host_frozen"]
    if not found:
        return False
    return point == "opened" or point in {s.step for s in pair.store.steps(found[0].id)}


def _someone_leads(pair: ControllerPair) -> bool:
    leader = pair.leader()
    return leader is not None and not leader.expired


def _commands(lab: LabCluster, node: LabNode, before: int) -> list[Command]:
    """The SETs for ``node``'s outlet from the ``before``-th on, on the wall clock."""
    assert lab.pdu is not None
    offset = time.time() - time.monotonic()
    return [
        Command(int(str(s.value)), s.at + offset)
        for s in lab.pdu.standin.sets_for(node.outlet)[before:]
    ]


def _sets_so_far(lab: LabCluster) -> dict[str, int]:
    assert lab.pdu is not None
    return {n.name: len(lab.pdu.standin.sets_for(n.outlet)) for n in lab.nodes}


@pytest.mark.integration
@pytest.mark.parametrize(("fault", "point"), _cases())
def test_the_pair_keeps_its_invariants(
    pair: ControllerPair, proxies: tuple[TcpProxy, TcpProxy], fault: str, point: str
) -> None:
    lab = pair.lab
    proxy_a, proxy_b = proxies
    # Each history link goes through a proxy only where the fault is on it: a
    # relay a controller does not need is one more thing a loaded machine can
    # stall. Each controller is started again after it exits, as its unit would.
    a = pair.start("a", via=proxy_a if fault in LEADER_LINK_FAULTS else None, restart=True)
    wait_for(lambda: pair.leads("a", 1), 60, "controller a leading at epoch 1")
    # a knows every node's boot before the freeze: a takeover can tell the
    # frozen boot from the next one only by what the leader recorded.
    wait_for(lambda: pair.sees_every_node_healthy("a"), 60, "controller a seeing every node")
    pair.start("b", via=proxy_b if fault == "standby_blackhole" else None, restart=True)
    wait_for(lambda: pair.standing_by("b"), 60, "controller b standing by")
    node = lab.node("spark-2")
    assert lab.pdu is not None
    before = _sets_so_far(lab)
    boot_before = node.boot_id()
    chaos = Chaos(pair, proxy_a, proxy_b)
    watcher = PostgresHistoryStore(pair.url, password_file=str(pair.server.password_file))
    with EpochWatch(watcher) as epochs:
        frozen_at = time.time()
        lab.freeze(node)
        wait_for(lambda: _reached(pair, node, point), 60, f"the recovery at {point}")
        chaos.inject(fault)
        try:
            wait_for(
                lambda: any(i.status == "resolved" for i in pair.store.list_incidents()),
                RECOVERY_BOUND_S + 30 + LEASE + RESTART_S,
                "the freeze recovered",
            )
        except RuntimeError as late:
            raise AssertionError(f"{late}\n{_story_so_far(pair, lab, node, before)}") from None
        finally:
            chaos.heal()
        # Whoever leads now, the other is a standby or has exited: the deposed
        # one exits with an error once it wakes (and sends nothing, below).
        wait_for(lambda: _someone_leads(pair), 60, "a leader")
        if a.poll() is None and not pair.leads("a"):
            assert a.wait(60) == 1 or fault in ("kill", "busy_cores")
        time.sleep(4 * LEADERSHIP["renew_every"])  # anything late would have arrived
    if chaos.woke_at is not None and a.returncode == 1:
        # Woken deposed: no alert about a node, nothing resumed (the new leader's).
        said = pair.said_while_deposed("a", chaos.woke_at)
        assert said == [], "\n".join(said)
    if fault == "busy_cores":
        assert "leadership_lost" not in pair.log("b"), pair.log("b")[-3000:]
    watcher.close()
    incidents = pair.store.list_incidents()
    evidence = Evidence(
        commands=_commands(lab, node, before[node.name]),
        elsewhere=[
            c for n in lab.nodes if n is not node for c in _commands(lab, n, before[n.name])
        ],
        incidents=incidents,
        steps={i.id: pair.store.steps(i.id) for i in incidents if i.kind == "host_frozen"},
        epochs=epochs.taken,
        expires=dict(epochs.expires),
        epoch_at=epochs.epoch_at,
        frozen_at=frozen_at,
        # step.at is taken before the write waits for the store, its lock and the
        # fence; on a loaded machine that can be a second or more.
        tolerance_s=2.0 + (8 * DELAY_S if fault == "delay" else 0.0),
    )
    problems = violations(evidence)
    assert not problems, "\n".join(problems) + "\n" + _story(pair, evidence)
    assert node.boot_id() != boot_before
    assert [c.target for c in evidence.commands][-1] == 1  # the node ends powered


@pytest.mark.integration
def test_a_leader_whose_every_command_is_refused_holds_the_node_after_three(
    pair_lab: LabCluster, tmp_path: Path
) -> None:
    """A leader whose writes always take past the send deadline: each off is
    recorded, refused, recorded as withdrawn, retried; the third refusal holds
    the node for a person instead of retrying for ever. Nothing reaches the PDU."""
    lab = pair_lab
    gate = Fence(send_refusal=lambda: "past the send deadline (this test's gate)")
    thread = ControllerThread(lab.controller_config(tmp_path / "history.db"), fence=gate)
    node = lab.node("spark-2")
    assert lab.pdu is not None
    before = len(lab.pdu.standin.sets_for(node.outlet))
    store = HistoryStore(thread.config.history, read_only=True)
    thread.start()
    try:
        wait_for(lambda: _every_node_healthy(thread), 60, "the controller seeing every node")
        lab.freeze(node)
        held = wait_for(
            lambda: [h for h in store.active_holds() if h.node == node.name],
            120,
            "the node held",
        )
        assert held
        (hold,) = [h for h in store.active_holds() if h.node == node.name]
        assert "3 commands in a row not sent" in hold.reason
        assert "past the send deadline (this test's gate)" in hold.reason
        (incident,) = store.list_incidents()
        assert incident.status == "open"  # not a false alarm: whoever acts next resumes it
        steps = [s.step for s in store.steps(incident.id)]
        assert steps.count("off_requested") == 3 and steps.count("off_withdrawn") == 3
        assert lab.pdu.standin.sets_for(node.outlet)[before:] == []
    finally:
        thread.stop()
        store.close()
        lab.thaw(node)
        wait_for(lambda: all(lab.agent_state(n) for n in lab.nodes), 60, "agents back")


def _every_node_healthy(thread: ControllerThread) -> bool:
    nodes = (thread.status() or {}).get("nodes") or []
    return bool(nodes) and all(n.get("verdict") == "healthy" for n in nodes)


def _story_so_far(
    pair: ControllerPair, lab: LabCluster, node: LabNode, before: dict[str, int]
) -> str:
    """What the PDU, the history and both controllers say, for a recovery that did not end."""
    incidents = pair.store.list_incidents()
    lines = [f"now {time.time():.3f}", f"incidents {incidents}"]
    lines += [f"command {c.target} at {c.at:.3f}" for c in _commands(lab, node, before[node.name])]
    for incident in incidents:
        steps = pair.store.steps(incident.id)
        lines += [f"step {s.seq} {s.step} epoch {s.epoch} at {s.at:.3f} {s.detail}" for s in steps]
    for name in pair.processes:
        lines.append(f"--- {name}.log (last 40 lines)")
        lines += pair.log(name).splitlines()[-40:]
    return "\n".join(lines)


def _story(pair: ControllerPair, e: Evidence) -> str:
    lines = [f"epochs {e.epochs}"]
    lines += [f"command {'off' if c.target == 2 else 'on'} at {c.at:.3f}" for c in e.commands]
    for steps in e.steps.values():
        lines += [f"step {s.seq} {s.step} epoch {s.epoch} at {s.at:.3f}" for s in steps]
    for name in pair.processes:
        lines.append(f"--- {name}.log (last 30 lines)")
        lines += pair.log(name).splitlines()[-30:]
    return "\n".join(lines)


# -- the invariants themselves can fail -------------------------------------------------


def _step(seq: int, step: str, at: float, epoch: int, rung: int = 0) -> IncidentStep:
    return IncidentStep(1, seq, at, "spark-2", step, {"rung": rung}, epoch)


def _evidence(commands: list[Command], steps: list[IncidentStep]) -> Evidence:
    incident = Incident(
        id=1,
        kind="host_frozen",
        nodes=("spark-2",),
        opened_at=0.0,
        detected_at=0.0,
        fault_onset=None,
        evidence={},
        dry_run=False,
        status="resolved",
        resolution="recovered",
        resolved_at=30.0,
        time_to_detect_s=None,
        time_to_recover_s=30.0,
    )
    return Evidence(
        commands=commands,
        incidents=[incident],
        steps={1: steps},
        epochs=[(1, 0.0), (2, 20.0)],
        epoch_at=lambda t: 1 if t < 20.0 else 2,
        frozen_at=0.0,
        tolerance_s=0.0,
    )


def test_a_command_to_a_node_that_did_not_freeze_is_a_violation() -> None:
    steps = [_step(1, "off_requested", 10.0, 1), _step(2, "on_requested", 12.5, 1)]
    evidence = _evidence([Command(2, 10.1), Command(1, 12.6)], steps)
    evidence.elsewhere = [Command(2, 11.0)]
    assert any("did not freeze" in p for p in violations(evidence))


def test_a_command_after_its_lease_ended_is_a_violation() -> None:
    steps = [_step(1, "off_requested", 10.0, 1), _step(2, "on_requested", 12.5, 1)]
    evidence = _evidence([Command(2, 10.1), Command(1, 12.6)], steps)
    evidence.expires = {1: 12.55}
    assert any("after its epoch's lease ended" in p for p in violations(evidence))


def _started(seq: int, at: float, attempt: int) -> IncidentStep:
    return IncidentStep(1, seq, at, "spark-2", "rung_started", {"rung": 0, "attempt": attempt}, 2)


def test_a_second_try_of_a_rung_may_send_its_own_off_but_not_a_third() -> None:
    """Epoch 1's off never left; epoch 2 tried the rung again after the boot wait."""
    steps = [
        _step(1, "off_requested", 10.0, 1),
        _started(2, 60.0, 2),
        _step(3, "off_requested", 60.1, 2),
        _step(4, "on_requested", 62.6, 2),
    ]
    commands = [Command(2, 60.2), Command(1, 62.7)]
    assert violations(_evidence(commands, steps)) == []
    third = [*steps, _started(5, 63.0, 3), _step(6, "off_requested", 63.1, 2)]
    problems = violations(_evidence([*commands, Command(2, 63.2)], third))
    assert any("try 3 of incident 1 rung 0" in p for p in problems), problems


def test_a_clean_cycle_keeps_the_invariants() -> None:
    steps = [_step(1, "off_requested", 10.0, 1), _step(2, "on_requested", 12.5, 1)]
    assert violations(_evidence([Command(2, 10.1), Command(1, 12.6)], steps)) == []


@pytest.mark.parametrize(
    ("commands", "steps", "expected"),
    [
        # an off with nothing recorded before it
        ([Command(2, 9.0), Command(1, 12.6)], [_step(2, "on_requested", 12.5, 1)], "no recorded"),
        # an old epoch's on arriving after the new leader took over
        (
            [Command(2, 10.1), Command(1, 21.0)],
            [_step(1, "off_requested", 10.0, 1), _step(2, "on_requested", 19.5, 1)],
            "while epoch 2 led",
        ),
        # an on sent long after its step
        (
            [Command(2, 10.1), Command(1, 16.0)],
            [_step(1, "off_requested", 10.0, 1), _step(2, "on_requested", 12.5, 1)],
            "past the send deadline",
        ),
        # two offs on one rung
        (
            [Command(2, 10.1), Command(2, 11.1), Command(1, 13.6)],
            [
                _step(1, "off_requested", 10.0, 1),
                _step(2, "off_requested", 11.0, 1),
                _step(3, "on_requested", 13.5, 1),
            ],
            "2 offs for incident 1 rung 0 (try 1)",
        ),
        # an on inside the hold
        (
            [Command(2, 10.1), Command(1, 11.0)],
            [_step(1, "off_requested", 10.0, 1), _step(2, "on_requested", 10.9, 1)],
            "inside the hold",
        ),
        # a step that stands for no command, unexplained
        (
            [Command(2, 10.1)],
            [_step(1, "off_requested", 10.0, 1), _step(2, "on_requested", 12.5, 1)],
            "nothing explains it",
        ),
        # a command that left although its step was withdrawn
        (
            [Command(2, 10.1), Command(1, 12.6)],
            [
                _step(1, "off_requested", 10.0, 1),
                _step(2, "off_withdrawn", 10.05, 1),
                _step(3, "on_requested", 12.5, 1),
            ],
            "although its step was withdrawn",
        ),
        # a reboot SET, which this tier never sends
        (
            [Command(3, 10.1)],
            [_step(1, "off_requested", 10.0, 1)],
            "neither an off (2) nor an on (1)",
        ),
        # a step of an older epoch after a newer one
        (
            [Command(2, 21.1), Command(1, 23.6)],
            [_step(1, "off_requested", 21.0, 2), _step(2, "on_requested", 23.5, 1)],
            "went back",
        ),
    ],
)
def test_the_invariants_catch_what_they_name(
    commands: list[Command], steps: list[IncidentStep], expected: str
) -> None:
    problems = violations(_evidence(commands, steps))
    assert any(expected in p for p in problems), problems
