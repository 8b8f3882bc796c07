"""Watching the other nodes' agents over a second path (docs/design.md, "Peers").

One thread asks each configured peer's ``GET /v1/pulse`` every
``peering.interval``, one peer after the other, each with ``peering.timeout``;
it never touches the agent's event loop, so a dark fabric never delays the
heartbeat. Where the interval is a whole number of the agent's loops (the
defaults: both 1 s), the heartbeat decides each round as it goes to sleep
(:meth:`PeerWatch.beat`: no socket, no name lookup) and wakes the thread
only when some peer is to be asked; otherwise the thread keeps its own
clock. Per peer it keeps what the last pulse got and when, by this agent's
monotonic clock, it last saw the peer's ``seq`` advance within one run of
its agent (agent/peer_sightings.py) in a well-formed pulse of the right
node: the only thing the controller believes (``progress_ago_s`` in
``/v1/state``'s ``peers``). Garbage and another node's identity never move it.

Each request carries this agent's own pulse (probes/pulse.py), and a peer's
request carries the peer's: a well-formed pulse of a configured peer, from
an address that peer's URL names, is taken as if this agent had asked for
it (as of when it came, by the next round or ``/v1/state`` read: the answer
to the request waits for no parsing), and that peer is not asked in a round
that comes within ``HEARD_FRESH`` of an interval after it. So of each pair
of agents one asks and the other hears, and a pair makes one exchange a
second, not two. A peer that stops asking is asked again at the next round
after that.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from spark_watchdog.agent.peer_sightings import Sightings
from spark_watchdog.config.agent import PeerConfig, PeeringConfig
from spark_watchdog.probes.pulse import MAX_PULSE_BYTES, PulseAnswer, PulseClient, parse_pulse

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

log = logging.getLogger("spark_watchdog.agent.peers")

# A peer failing on every pulse logs at most one line this often.
LOG_EVERY_S = 60.0
# A peer whose own pulse was heard within this share of the interval is not
# asked this round. Above one half: of two agents on the same interval, at
# most one asks the other in each round (the other heard it within the share).
HEARD_FRESH = 0.75
# A heartbeat this share of an interval early still starts the round (paced).
BEAT_EARLY = 0.1
# A peer URL's host name is looked up again this often (the name may move).
RESOLVE_EVERY_S = 60.0
# Carried pulses that are taken for nothing are logged once per source, for
# this many sources at most.
MAX_LOGGED_SOURCES = 64
# Source addresses whose parsed form is kept; past this the memory starts over.
MAX_REMEMBERED_SOURCES = 256


@dataclass
class PeerView:
    """What this agent last saw of one peer."""

    name: str
    via: str
    state: str = "pending"
    seq: int | None = None
    boot_id: str | None = None
    progress_at: float | None = None  # monotonic: a run's seq advanced (peer_sightings.py)
    answer_at: float | None = None  # monotonic: the last well-formed answer (ok or wrong_node)
    heard_at: float | None = None  # monotonic: its own pulse last carried in its request
    addresses: frozenset[IPAddress] | None = None  # what ``via`` names (None: not resolved)
    error: str | None = None
    wrong_node_logged: bool = False
    logged_at: float | None = None
    sightings: Sightings = field(default_factory=Sightings)

    def note(self, answer: PulseAnswer, now: float) -> None:
        """Take one pulse's answer, received at ``now`` (peer_sightings.py says
        which pulses are progress)."""
        self.state = answer.state
        self.error = answer.error
        if answer.pulse is not None and (self.answer_at is None or now > self.answer_at):
            self.answer_at = now  # a carried pulse is taken after it came (PeerWatch.heard)
        if answer.state != "ok" or answer.pulse is None:
            return
        pulse = answer.pulse
        seen = self.sightings.take(pulse.boot_id, pulse.run, pulse.seq, now)
        if seen.kind == "progress" and (self.progress_at is None or now > self.progress_at):
            self.progress_at = now
        if seen.kind == "implausible":
            self.error = f"seq {seen.seq} is further ahead than its loop can count: not taken"
        elif seen.kind in ("progress", "baseline"):
            self.seq = seen.seq
            self.boot_id = seen.boot_id or self.boot_id

    def to_json(self, now: float) -> dict[str, Any]:
        return {
            "via": self.via,
            "state": self.state,
            "seq": self.seq,
            "boot_id": self.boot_id,
            "progress_ago_s": _ago(self.progress_at, now),
            "answer_ago_s": _ago(self.answer_at, now),
            "heard_ago_s": _ago(self.heard_at, now),
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
        carry: Callable[[], bytes] | None = None,
        resolve: Callable[[str], frozenset[IPAddress]] | None = None,
        beat: float | None = None,
    ) -> None:
        """``carry``: this agent's own pulse, sent with each request; ``resolve``:
        the addresses a peer URL's host names (default: the system's resolver);
        ``beat``: the agent's loop interval, whose heartbeat calls :meth:`beat`
        (None: the pulse thread keeps its own clock)."""
        self.interval = peering.interval
        self._clock = clock
        # Rounds on the heartbeat when the interval is a whole number of its loops.
        self.paced = beat is not None and _whole_multiple(peering.interval, beat)
        self._due = float("-inf")  # the next round's time, on the heartbeat (paced)
        self._clients = [PulseClient(p.name, p.url, peering.timeout, carry) for p in peers]
        self._views = {p.name: PeerView(p.name, p.url) for p in peers}
        self._asked = [(client, self._views[client.name]) for client in self._clients]
        self._hosts = {p.name: urlsplit(p.url).hostname or "" for p in peers}
        self._resolve = resolve or _resolve
        for name, host in self._hosts.items():
            # A name (None here) is resolved by the pulse thread.
            self._views[name].addresses = _literal(host)
        self._resolved_at: float | None = None
        self._logged_sources: set[str] = set()
        self._sources: dict[str, IPAddress | None] = {}  # _source's
        # Carried pulses not taken yet, by connection: (pulse, address, received at).
        self._carried: dict[Any, tuple[bytes, Any, float]] = {}
        self._lock = threading.Lock()
        self._stopping = False  # read before each ask: a plain flag, not an Event's call
        # Released to wake the pulse thread (a round to run, or stop()): it
        # sleeps in an acquire of it (one call, where Event.wait is a dozen steps).
        self._sleep = threading.Lock()
        self._sleep.acquire()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self._clients or self._thread is not None:
            return
        run = self._run_paced if self.paced else self._run
        self._due = self._next_round(self._clock())  # after the first round
        self._thread = threading.Thread(target=run, name="peer-pulse", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if not self._stopping:
            self._stopping = True
            self._wake()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        for client in self._clients:
            client.close()

    def _wake(self) -> None:
        # Released already: the thread goes on at its next acquire.
        with contextlib.suppress(RuntimeError):
            self._sleep.release()

    def _run(self) -> None:
        due = self._clock()
        while not self._stopping:
            self.pulse_all()
            # A fixed rate; a round slower than the interval starts the next at once.
            due = max(due + self.interval, self._clock())
            if self._sleep.acquire(timeout=max(0.0, due - self._clock())):
                return  # stopped

    def _run_paced(self) -> None:
        """The first round at once, then one each time :meth:`beat` or stop() wakes it."""
        while not self._stopping:
            self.pulse_all()
            self._sleep.acquire()

    def beat(self) -> None:
        """The heartbeat's turn, right after its work (paced only): when a round
        is due, take the carried pulses and wake the pulse thread only if a
        peer was not heard within the round's share. Never waits: no socket,
        no name lookup (the thread does those), a lock held for a few steps.
        An agent whose peers all ask it runs no pulse thread at all."""
        if not self.paced or self._thread is None:
            return
        now = self._clock()
        if now < self._due:
            return
        self._due = self._next_round(now)
        try:
            self._take_carried()
        except Exception:  # the heartbeat must go on: the thread's round takes them
            log.exception("taking the pulses peers' requests carried failed")
            self._wake()
            return
        fresh = HEARD_FRESH * self.interval
        for view in self._views.values():
            if view.heard_at is None or now - view.heard_at >= fresh:
                self._wake()
                return

    def _next_round(self, now: float) -> float:
        """When the next paced round is due: a beat a little early (a tenth of
        an interval) counts as on time."""
        return now + (1 - BEAT_EARLY) * self.interval

    def pulse_all(self) -> None:
        """Ask every peer once, one after the other, but those just heard."""
        self._resolve_peers()
        self._take_carried()
        fresh = HEARD_FRESH * self.interval
        for client, view in self._asked:
            if self._stopping:
                return
            heard_at = view.heard_at  # one attribute: no lock needed to read it
            if heard_at is not None and self._clock() - heard_at < fresh:
                continue  # it asked us: its own pulse came with that
            try:
                answer = client.ask()
            except Exception as exc:  # never let one odd answer end the thread
                log.exception("pulse to peer %s failed", client.name)
                answer = PulseAnswer("silent", error=f"{type(exc).__name__}: {exc}"[:200])
            now = self._clock()
            with self._lock:
                before = view.state
                view.note(answer, now)
            if answer.state != "ok" or before != "ok":
                _log_answer(view, before, now)

    def heard(self, carried: bytes, address: Any) -> None:
        """A peer's own pulse, carried in its request from ``address`` (the HTTP
        server's thread): kept as it came, the latest per connection, and taken by
        the next round or the next :meth:`to_json`, whichever comes first. The
        answer to the request waits for neither."""
        if len(carried) > MAX_PULSE_BYTES:
            carried = b""  # not a pulse (logged as such when taken); not kept whole
        # By connection (address and port): peers may share an address (a lab's loopback).
        if address in self._carried or len(self._carried) < MAX_REMEMBERED_SOURCES:
            self._carried[address] = (carried, address, self._clock())

    def _take_carried(self) -> None:
        """Take the carried pulses kept since the last time (any thread)."""
        while self._carried:
            try:
                _, (carried, address, at) = self._carried.popitem()
            except KeyError:  # another thread took the last one
                return
            self._take(carried, address, at)

    def _take(self, carried: bytes, address: Any, at: float) -> None:
        """A carried pulse, received at ``at``: an answer of the peer it names,
        if it is one, from an address that peer's URL names."""
        pulse = parse_pulse(carried)
        source = self._source(address)
        with self._lock:
            view = None if pulse is None else self._views.get(pulse.node)
            if pulse is None or view is None or source is None:
                why = "not a pulse" if pulse is None else f"node {pulse.node[:64]!r}"
                self._log_source(source, f"{why}: not a peer of this agent's")
                return
            if view.addresses is None:
                return  # its name not resolved yet: it is asked in turn meanwhile
            if source not in view.addresses:
                self._log_source(source, f"a pulse of {view.name}, not from its address {view.via}")
                return
            if view.heard_at is None or at > view.heard_at:
                view.heard_at = at
            view.note(PulseAnswer("ok", pulse), at)

    def _source(self, address: Any) -> IPAddress | None:
        """:func:`_ip`, remembered for the few addresses peers ask from."""
        host = address[0] if isinstance(address, tuple) and address else None
        if not isinstance(host, str):
            return _ip(address)
        try:
            return self._sources[host]
        except KeyError:
            pass
        if len(self._sources) >= MAX_REMEMBERED_SOURCES:
            self._sources.clear()
        ip = self._sources[host] = _ip(address)
        return ip

    def _log_source(self, source: IPAddress | None, why: str) -> None:
        key = str(source)
        if key in self._logged_sources or len(self._logged_sources) >= MAX_LOGGED_SOURCES:
            return
        self._logged_sources.add(key)
        log.warning("a request from %s carried %s; not evidence of anything", key, why)

    def _resolve_peers(self) -> None:
        """Each peer's addresses, once a minute (a name may move)."""
        now = self._clock()
        if self._resolved_at is not None and now - self._resolved_at < RESOLVE_EVERY_S:
            return
        self._resolved_at = now
        for name, host in self._hosts.items():
            addresses = self._resolve(host)
            with self._lock:
                self._views[name].addresses = addresses

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """``/v1/state``'s ``peers``: ages as of ``now`` (default: this moment)."""
        self._take_carried()
        at = self._clock() if now is None else now
        with self._lock:
            return {name: view.to_json(at) for name, view in self._views.items()}


def _whole_multiple(interval: float, beat: float) -> bool:
    """Whether ``interval`` is a whole number (one or more) of ``beat``."""
    loops = round(interval / beat)
    return loops >= 1 and abs(interval - loops * beat) < 1e-6 * interval


def _literal(host: str) -> frozenset[IPAddress] | None:
    """The address ``host`` is, if it is one (not a name)."""
    try:
        return frozenset({ipaddress.ip_address(host)})
    except ValueError:
        return None


def _resolve(host: str) -> frozenset[IPAddress]:
    """The addresses ``host`` names; none where it cannot be resolved now."""
    literal = _literal(host)
    if literal is not None:
        return literal
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return frozenset()
    return frozenset(a for a in (_ip(info[4]) for info in found) if a is not None)


def _ip(address: Any) -> IPAddress | None:
    """The IP address of a socket address, an IPv4-mapped IPv6 one as IPv4."""
    try:
        ip = ipaddress.ip_address(str(address[0]).split("%", 1)[0])
    except (ValueError, TypeError, IndexError):
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


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
