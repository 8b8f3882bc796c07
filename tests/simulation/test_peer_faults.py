"""What the peers' path once missed, in the simulation: an agent restarted on
the same boot, pulses replayed or forged from a node's address
(docs/simulation.md, "Fault menu"). Each case also runs with the peers' rule
before it was fixed, to show that the simulation now finds what it missed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from spark_watchdog.agent import peers
from spark_watchdog.simulation.run import simulate

# The peers the only second path: no step group whose engine vouches for its ranks.
OVERRIDES: dict[str, Any] = {"guards": {"dry_run": False}, "serving": {"step_group": []}}


def _old_note(view: peers.PeerView, answer: Any, now: float) -> None:
    """The rule before: a new boot id is progress, and the seq kept for a boot
    never goes back, whichever agent run sent it."""
    view.state, view.error = answer.state, answer.error
    if answer.state != "ok" or answer.pulse is None:
        return
    pulse = answer.pulse
    rebooted = view.boot_id is not None and pulse.boot_id not in (None, view.boot_id)
    advanced = view.seq is not None and pulse.seq > view.seq
    if rebooted or advanced:
        view.progress_at = now
    if rebooted or view.seq is None or advanced:
        view.seq = pulse.seq
    view.boot_id = pulse.boot_id or view.boot_id


@pytest.fixture
def old_rule(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(peers.PeerView, "note", _old_note)
    yield


Script = list[tuple[float, str, str | None]]
RESTART_THEN_CUT: Script = [(120.0, "agent-restart-mgmt-partition", "spark-2")]
FORGED_THEN_CUT: Script = [
    (120.0, "pulse-forged", "spark-2"),
    (125.0, "mgmt-partition-90", "spark-2"),
]
REPLAYED_FREEZE: Script = [(120.0, "pulse-replay", "spark-2"), (121.0, "freeze", "spark-2")]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("script", [RESTART_THEN_CUT, FORGED_THEN_CUT], ids=["restart", "forged"])
def test_a_live_node_cut_off_from_the_controller_is_never_cut(seed: int, script: Script) -> None:
    report = simulate(seed, 5.0, script=script, overrides=OVERRIDES, peers=True)
    assert report.violations == [] and report.sent == []


@pytest.mark.parametrize("script", [RESTART_THEN_CUT, FORGED_THEN_CUT], ids=["restart", "forged"])
def test_with_the_rule_before_the_simulation_finds_the_live_node_cut(
    script: Script, old_rule: None
) -> None:
    found = [
        simulate(seed, 5.0, script=script, overrides=OVERRIDES, peers=True) for seed in (1, 2, 3)
    ]
    assert any(report.violations for report in found), [r.sent for r in found]


def test_replayed_pulses_keep_no_frozen_node_from_its_recovery() -> None:
    report = simulate(1, 5.0, script=REPLAYED_FREEZE, overrides=OVERRIDES, peers=True)
    assert report.violations == []
    assert ("spark-2", "off") in report.sent and "recovered" in report.resolutions
