"""The controller pair's lease and the fence on its writes (history/leadership.py):
one contract, which the PostgreSQL history (a real server) and the SQLite
history (a real file; the simulation's pair runs on it) both pass.

Expiry is the database's clock, so the tests that need a lease to run out
use leases of a second or two and wait for them with margins of their own.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.errors import NotLeader
from spark_watchdog.history.database_time import DatabaseTime
from spark_watchdog.history.leadership import Lease, current, end_lease, standbys
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.hardware.postgres_server import PostgresServer


class Stores:
    """Stores on one database, each with a lease of its own, closed at the end."""

    def __init__(self, engine: str, open_store: Callable[[], HistoryStore]) -> None:
        self.engine = engine
        self._open = open_store
        self.server: PostgresServer | None = None  # PostgreSQL's: the server and its URL
        self.url = ""
        self.opened: list[HistoryStore] = []

    def candidate(self, lease_s: float = 30.0, send_deadline_s: float = 1.0, **kw: Any) -> Lease:
        store = self._open()
        self.opened.append(store)
        lease = Lease(store, lease_s=lease_s, send_deadline_s=send_deadline_s, **kw)
        store.set_fence(lease)
        return lease


def _postgres(request: pytest.FixtureRequest) -> Stores:
    from spark_watchdog.history.postgres import PostgresHistoryStore

    server: PostgresServer = request.getfixturevalue("postgres_server")
    url: str = request.getfixturevalue("postgres_url")
    made = Stores(
        "postgres", lambda: PostgresHistoryStore(url, password_file=str(server.password_file))
    )
    made.server, made.url = server, url
    return made


@pytest.fixture(params=["sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    if request.param == "sqlite":
        path = tmp_path / "history.db"
        made = Stores("sqlite", lambda: HistoryStore(path))
    else:
        made = _postgres(request)
    yield made
    for store in made.opened:
        store.close()


@pytest.fixture
def postgres_stores(request: pytest.FixtureRequest) -> Iterator[Stores]:
    made = _postgres(request)
    yield made
    for store in made.opened:
        store.close()


def open_frozen(lease: Lease) -> int:
    incident = lease.store.open_incident(
        "host_frozen", ["spark-1"], detected_at=time.time(), evidence={}
    )
    return incident.id


def steps_of(lease: Lease, incident_id: int) -> list[tuple[str, int | None]]:
    return [(s.step, s.epoch) for s in lease.store.steps(incident_id)]


def test_the_first_candidate_leads_and_the_second_stands_by(stores: Stores) -> None:
    a, b = stores.candidate(), stores.candidate()
    taken = a.acquire()
    assert a.epoch == 1 and taken.holder == a.holder and taken.left > 29
    seen = b.acquire()
    assert b.epoch is None and seen.holder == a.holder and seen.epoch == 1
    assert a.acquire().epoch == 1 and a.epoch == 1  # taking it again keeps the epoch


def test_standbys_are_listed_as_they_last_tried_and_leave_the_list_when_they_lead(
    stores: Stores,
) -> None:
    a, b, c = (
        stores.candidate(lease_s=2.0, send_deadline_s=0.2),
        stores.candidate(),
        stores.candidate(),
    )
    assert standbys(a.store, 60) == []
    a.acquire()
    b.acquire()
    time.sleep(0.3)
    c.acquire()
    seen = standbys(a.store, 60)
    assert [s.holder for s in seen] == [c.holder, b.holder]  # the latest first
    assert 0 <= seen[0].ago < seen[1].ago < 30
    assert [s.holder for s in standbys(a.store, 0.2)] == [c.holder]  # b not within 0.2 s
    time.sleep(2.3)  # a's lease runs out
    assert b.acquire().holder == b.holder and b.epoch == 2
    assert [s.holder for s in standbys(a.store, 60)] == [c.holder]


def test_only_the_leader_writes_and_its_steps_carry_its_epoch(stores: Stores) -> None:
    a, b = stores.candidate(), stores.candidate()
    a.acquire()
    b.acquire()
    incident_id = open_frozen(a)
    a.store.add_step(incident_id, "off_requested", node="spark-1")
    with pytest.raises(NotLeader, match="does not lead"):
        b.store.add_step(incident_id, "off_requested", node="spark-1")
    with pytest.raises(NotLeader):
        b.store.hold("spark-1", "from the standby", by="controller")
    assert steps_of(a, incident_id) == [("incident_opened", 1), ("off_requested", 1)]
    assert a.store.active_holds() == []


def test_an_expired_lease_moves_to_a_new_epoch_and_the_old_leader_writes_nothing(
    stores: Stores,
) -> None:
    a = stores.candidate(lease_s=2.0, send_deadline_s=0.1)  # a write needs 1.2 s left
    b = stores.candidate(lease_s=30.0, send_deadline_s=0.1)
    a.acquire()
    incident_id = open_frozen(a)
    deadline = time.monotonic() + 30
    while b.epoch is None:  # the database's clock decides; wait for it
        assert time.monotonic() < deadline, "the lease never expired"
        b.acquire()
        time.sleep(0.1)
    assert b.epoch == 2
    with pytest.raises(NotLeader, match=r"moved to .* at epoch 2"):
        a.store.add_step(incident_id, "off_requested", node="spark-1")
    assert a.epoch is None  # it knows now
    assert a.renew() is False
    b.store.add_step(incident_id, "off_verified", node="spark-1")
    assert steps_of(b, incident_id) == [("incident_opened", 1), ("off_verified", 2)]
    assert a.send_refusal() is not None


def test_a_write_needs_two_send_deadlines_of_lease_left(stores: Stores) -> None:
    a = stores.candidate(lease_s=4.0, send_deadline_s=1.0)  # a write needs 2 + 1 s left
    a.acquire()
    incident_id = open_frozen(a)  # about 4 s left
    time.sleep(1.5)  # now about 2.5 s left
    with pytest.raises(NotLeader, match="less than two send deadlines and a margin"):
        a.store.add_step(incident_id, "off_requested", node="spark-1")
    assert [s for s, _ in steps_of(a, incident_id)] == ["incident_opened"]
    assert a.renew() is True  # still ours: renewed, writes go through again
    a.store.add_step(incident_id, "off_requested", node="spark-1")


def test_a_record_that_nothing_left_needs_only_an_unexpired_lease_and_opens_no_window(
    stores: Stores,
) -> None:
    a = stores.candidate(lease_s=4.0, send_deadline_s=1.0, monotonic=time.monotonic)
    a.acquire()
    incident_id = open_frozen(a)
    a.store.add_step(incident_id, "off_requested", node="spark-1")
    time.sleep(1.5)  # about 2.5 s left: too little for a command's write
    assert a.send_refusal() is not None  # 1.5 s since the off's check: past the deadline
    with pytest.raises(NotLeader, match="less than two send deadlines"):
        a.store.add_step(incident_id, "off_verified", node="spark-1")
    withdraw = a.recording_only(a.store.add_step)
    withdraw(incident_id, "off_withdrawn", node="spark-1")
    assert [s for s, _ in steps_of(a, incident_id)][-2:] == ["off_requested", "off_withdrawn"]
    assert a.send_refusal() is not None  # the withdrawn record opened no send window
    with pytest.raises(NotLeader, match="less than two send deadlines"):
        a.store.add_step(incident_id, "on_requested", node="spark-1")  # not relaxed after it
    time.sleep(3.0)  # the lease has run out
    with pytest.raises(NotLeader, match="run out"):
        withdraw(incident_id, "on_withdrawn", node="spark-1")


def test_a_command_may_leave_only_within_the_send_deadline_of_a_checked_write(
    stores: Stores,
) -> None:
    now = [100.0]
    a = stores.candidate(send_deadline_s=2.0, monotonic=lambda: now[0])
    a.acquire()
    assert a.send_refusal() == "no step of this leadership is recorded yet: nothing is sent"
    incident_id = open_frozen(a)
    now[0] += 1.9
    assert a.send_refusal() is None
    now[0] += 0.2
    refusal = a.send_refusal()
    assert refusal is not None and "past the send deadline" in refusal
    a.store.add_step(incident_id, "on_requested", node="spark-1")  # a new check
    assert a.send_refusal() is None
    a.lost()
    assert a.send_refusal() == "this controller does not lead any more: nothing is sent"


def test_stepping_down_hands_over_once_its_promise_ran_out(stores: Stores) -> None:
    """A leader that stops cleanly ends its lease: a standby takes it two send
    deadlines later (1 s each here), not after the whole lease (30 s)."""
    a, b = stores.candidate(), stores.candidate()
    a.acquire()
    assert a.step_down() is True and a.epoch is None
    b.acquire()
    assert b.epoch is None  # a command a's last write let out may still be leaving
    time.sleep(2.2)
    b.acquire()
    assert b.epoch == 2
    leader = current(b.store)
    assert leader is not None and leader.holder == b.holder and not leader.expired


def test_a_restarted_controller_is_a_new_holder_and_waits_for_the_lease(stores: Stores) -> None:
    first = stores.candidate()
    first.acquire()
    again = stores.candidate()  # the same host and pid, but a new start
    assert again.holder != first.holder
    assert again.acquire().holder == first.holder and again.epoch is None


def test_candidates_racing_for_an_expired_lease_make_one_leader(stores: Stores) -> None:
    old = stores.candidate(lease_s=0.5)
    old.acquire()
    time.sleep(1.0)
    racers = [stores.candidate() for _ in range(4)]
    barrier = threading.Barrier(len(racers))

    def race(lease: Lease) -> None:
        barrier.wait()
        lease.acquire()

    threads = [threading.Thread(target=race, args=(r,)) for r in racers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    leaders = [r for r in racers if r.epoch is not None]
    assert len(leaders) == 1 and leaders[0].epoch == 2
    leader = current(old.store)
    assert leader is not None and leader.holder == leaders[0].holder and leader.epoch == 2


def test_an_ended_lease_stops_the_leader_now_and_frees_after_its_promise(stores: Stores) -> None:
    """ha step-down: no write or renewal from the leader from now, but no
    standby before two send deadlines, what its last checked write was promised."""
    a = stores.candidate(send_deadline_s=1.0)
    b = stores.candidate()
    a.acquire()
    incident_id = open_frozen(a)
    ended = end_lease(a.store)
    assert ended is not None and ended.released_at is not None
    assert 1.0 < ended.left <= 2.0  # fence_s = 2 x 1 s, less the moment since
    with pytest.raises(NotLeader, match="stepped down"):
        a.store.add_step(incident_id, "off_requested", node="spark-1")
    assert a.renew() is False
    assert b.acquire().holder == a.holder and b.epoch is None  # not yet
    time.sleep(2.2)
    b.acquire()
    assert b.epoch == 2
    assert [s for s, _ in steps_of(b, incident_id)] == ["incident_opened"]


class CountedTime(DatabaseTime):
    """The database's clock, counting how often it was read."""

    reads = 0

    def read(self, conn: Any, now_sql: str = "") -> float:
        self.reads += 1
        return super().read(conn, now_sql)


def test_the_lease_reads_the_database_clock_on_taking_renewing_and_checking(
    stores: Stores,
) -> None:
    """The pair's wall clock (history/database_time.py): read on every take,
    renewal and write check, never the host's (here an hour off)."""
    database_time = CountedTime(fallback=lambda: time.time() + 3600.0)
    a = stores.candidate(clock=database_time)
    assert database_time.error() is None
    a.acquire()
    error = database_time.error()
    assert error is not None and error < 1.0

    def database_now() -> float:
        with a.store._reading("reading the clock") as conn:
            (now,) = conn.execute(f"SELECT {a.store.dialect.now}").fetchone()
            return float(now)

    renewed_or_checked: list[Callable[[], object]] = [a.renew, lambda: open_frozen(a)]
    for write in renewed_or_checked:
        reads = database_time.reads
        write()
        assert database_time.reads == reads + 1
        assert abs(database_time.now() - database_now()) < 1.0


def test_a_renewal_does_not_wait_for_the_history_write_lock(postgres_stores: Stores) -> None:
    """A deposed leader stalled mid-transaction (a slow link, SIGSTOP) holds the
    history's write lock; the leader's renewals must go on without it, or the
    healthy leader gives up too and nobody leads. PostgreSQL only: on SQLite
    every write, a renewal too, takes the file's one write lock."""
    import psycopg

    from spark_watchdog.history.postgres import WRITE_LOCK_KEY

    leader = postgres_stores.candidate()
    assert leader.acquire().holder == leader.holder
    server = postgres_stores.server
    assert server is not None
    password = server.password_file.read_text().strip()
    stalled = psycopg.connect(postgres_stores.url, password=password, autocommit=True)
    try:
        stalled.execute("BEGIN")
        stalled.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK_KEY,))
        renewed: list[bool] = []
        # Another transaction holds the write lock (its own try would wait forever).
        worker = threading.Thread(target=lambda: renewed.append(leader.renew()), daemon=True)
        started = time.monotonic()
        worker.start()
        worker.join(10)
        took = time.monotonic() - started
        assert renewed == [True], f"the renewal waited {took:.1f}s for the write lock"
        assert current(leader.store) is not None
    finally:
        stalled.rollback()
        stalled.close()


def test_a_lease_not_extended_for_a_whole_lease_has_run_out_by_the_hosts_clock_alone(
    stores: Stores,
) -> None:
    """A leader paused past its lease knows it has run out before it touches
    the database again: from then it says nothing about nodes (controller/pair/fence.py)."""
    now = [100.0]
    a = stores.candidate(lease_s=30.0, monotonic=lambda: now[0])
    assert a.ran_out()  # not leading
    a.acquire()
    now[0] += 29.9
    assert not a.ran_out()
    now[0] += 0.1
    assert a.ran_out()
    assert a.renew() is True  # by the database's clock it has not run out: extended
    assert not a.ran_out()
    a.lost()
    assert a.ran_out()
