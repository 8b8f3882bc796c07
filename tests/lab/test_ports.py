"""The lab's port picks stay out of the kernel's ephemeral range."""

from __future__ import annotations

import itertools
import random
import socket
from pathlib import Path

import pytest

from spark_watchdog.lab import ports


def test_picks_lie_below_the_ephemeral_range_and_are_never_repeated() -> None:
    low = ports.ephemeral_low()
    assert low is not None, "this kernel publishes net.ipv4.ip_local_port_range"
    picks = [ports.free_port(chooser=random.Random(7)) for _ in range(50)]
    assert len(set(picks)) == len(picks)
    assert all(ports.LOWEST <= port < low for port in picks)


def test_a_pick_can_be_listened_on_at_once() -> None:
    port = ports.free_port()
    with socket.socket() as listener:
        listener.bind((ports.LOOPBACK, port))
        listener.listen()


class _BusyFirst(random.Random):
    """Offers the busy port first, then any."""

    def __init__(self, busy: int) -> None:
        super().__init__(11)
        self.offers = [busy]

    def randrange(self, start: int, stop: int | None = None, step: int = 1) -> int:
        return self.offers.pop() if self.offers else super().randrange(start, stop, step)


def test_a_port_in_use_is_not_picked() -> None:
    busy_port = ports.free_port()
    with socket.socket() as busy:
        busy.bind((ports.LOOPBACK, busy_port))
        busy.listen()
        picked = ports.free_port(chooser=_BusyFirst(busy_port))
    assert picked != busy_port


def test_an_unreadable_range_falls_back_to_the_kernels_pick(tmp_path: Path) -> None:
    assert ports.ephemeral_low(tmp_path / "missing") is None
    (tmp_path / "range").write_text("garbage\n")
    assert ports.ephemeral_low(tmp_path / "range") is None
    (tmp_path / "range").write_text("32768\t60999\n")
    assert ports.ephemeral_low(tmp_path / "range") == 32768


def test_picks_lie_in_the_range_this_process_was_given(monkeypatch: pytest.MonkeyPatch) -> None:
    low = ports.LOWEST + 3000
    monkeypatch.setenv(ports.RANGE_VARIABLE, f"{low}-{low + 299}")
    picks = {ports.free_port() for _ in range(40)}
    assert len(picks) == 40 and all(low <= port <= low + 299 for port in picks)


@pytest.mark.parametrize("value", ["20000", "20000-", "b-c", "30000-20000", "80-90", "20000-70000"])
def test_a_range_that_is_not_one_is_refused_with_the_variable_named(value: str) -> None:
    with pytest.raises(ports.PortRangeError, match=rf"SPARK_WATCHDOG_PORTS={value!r}.*LOW-HIGH"):
        ports.assigned_range(value)


def test_no_range_means_the_whole_space_below_the_ephemeral_range() -> None:
    assert ports.assigned_range("") is None


def test_side_by_side_slices_never_meet() -> None:
    slices = [ports.worker_range(i, 6, (10000, 32767)) for i in range(6)]
    assert slices[0][0] == 10000 and slices[-1][1] <= 32767
    for (_, high), (low, _) in itertools.pairwise(slices):
        assert high < low
    # A worker's slice is sliced again for what it runs side by side.
    inner = [ports.worker_range(i, 2, slices[3]) for i in range(2)]
    assert slices[3][0] <= inner[0][0] and inner[1][1] <= slices[3][1]
    with pytest.raises(ValueError, match="leave"):
        ports.worker_range(0, 1000, (10000, 10999))
