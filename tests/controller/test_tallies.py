"""The controller's in-memory counts behind /metrics, fed with real history records."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_watchdog.config.controller import NotifyConfig
from spark_watchdog.controller.record.ledger import Ledger
from spark_watchdog.controller.record.notify import Notifier
from spark_watchdog.controller.record.tallies import Tallies
from spark_watchdog.history.store import HistoryStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[HistoryStore]:
    with HistoryStore(str(tmp_path / "history.db")) as opened:
        yield opened


def test_seeded_counters_start_at_zero_so_a_first_event_shows_as_an_increase() -> None:
    tallies = Tallies()
    tallies.seed_nodes(["spark-1"])
    view = tallies.view()
    assert view.incidents_opened[("spark-1", "host_frozen")] == 0
    assert view.incidents_resolved[("spark-1", "host_frozen", "gave_up")] == 0
    assert view.power_actions[("spark-1", "cycle", "verified")] == 0
    assert view.incidents_open == {}


def test_incidents_are_counted_per_node_when_opened_and_resolved(store: HistoryStore) -> None:
    tallies = Tallies()
    opened = store.open_incident(
        "serving_stalled", ["spark-1", "spark-2"], detected_at=1.0, evidence={}
    )
    tallies.note_record(opened)
    tallies.note_record(opened)  # the same record twice is one incident
    view = tallies.view()
    assert view.incidents_opened == {
        ("spark-1", "serving_stalled"): 1,
        ("spark-2", "serving_stalled"): 1,
    }
    assert view.incidents_open == view.incidents_opened
    tallies.note_record(store.resolve_incident(opened.id, "recovered"))
    view = tallies.view()
    assert view.incidents_open == {}
    assert view.incidents_resolved == {
        ("spark-1", "serving_stalled", "recovered"): 1,
        ("spark-2", "serving_stalled", "recovered"): 1,
    }


def test_actions_count_once_their_outcome_is_recorded(store: HistoryStore) -> None:
    tallies = Tallies()
    incident = store.open_incident("host_frozen", ["spark-3"], detected_at=1.0, evidence={})
    pending = store.record_action("spark-3", "cycle", device="pdu", incident_id=incident.id)
    tallies.note_record(pending)
    assert tallies.view().power_actions == {}, "a pending (write-ahead) action is not an outcome"
    tallies.note_record(store.finish_action(pending.id, "ambiguous", error="SET timed out"))
    tallies.note_record(store.finish_action(pending.id, "verified"))
    tallies.note_record(
        store.record_action("spark-3", "cycle", device="pdu", incident_id=incident.id, dry_run=True)
    )
    assert tallies.view().power_actions == {
        ("spark-3", "cycle", "ambiguous"): 1,
        ("spark-3", "cycle", "verified"): 1,
        ("spark-3", "cycle", "dry_run"): 1,
    }


def test_incidents_found_open_at_start_are_open_but_not_newly_opened(
    store: HistoryStore,
) -> None:
    left = store.open_incident("host_frozen", ["spark-4"], detected_at=1.0, evidence={})
    tallies = Tallies()
    tallies.seed_open(store.open_incidents())
    view = tallies.view()
    assert view.incidents_open == {("spark-4", "host_frozen"): 1}
    assert view.incidents_opened == {}
    tallies.note_record(store.resolve_incident(left.id, "gave_up"))
    assert tallies.view().incidents_open == {}


def test_verdict_changes() -> None:
    tallies = Tallies()
    for verdict in ("pending", "healthy", "host_frozen", "healthy"):
        tallies.note_verdict("spark-2", verdict)
    assert tallies.view().verdict_changes == {
        ("spark-2", "pending"): 1,
        ("spark-2", "healthy"): 2,
        ("spark-2", "host_frozen"): 1,
    }


def test_the_ledger_feeds_what_it_wrote(store: HistoryStore) -> None:
    ledger = Ledger(store, Notifier(NotifyConfig()))

    async def write() -> None:
        incident = await ledger.write(
            store.open_incident, "host_frozen", ["spark-1"], detected_at=1.0, evidence={}
        )
        await ledger.write(store.add_step, incident.id, "rung_started")  # not counted
        await ledger.write(store.resolve_incident, incident.id, "false_alarm")

    asyncio.run(write())
    view = ledger.tallies.view()
    assert view.incidents_opened == {("spark-1", "host_frozen"): 1}
    assert view.incidents_resolved == {("spark-1", "host_frozen", "false_alarm"): 1}
