"""Power backends are built by device type and closed through the protocol."""

from __future__ import annotations

import asyncio
import logging
import typing

import pytest

from spark_watchdog.config.controller import PowerDevice, SshDevice
from spark_watchdog.power.base import OutletGroup, PowerState, close_quietly
from spark_watchdog.power.paths import BUILDERS, PowerPath, build_backend


class Outlet:
    def __init__(self, label: str, close_error: Exception | None = None) -> None:
        self.name = label
        self.limiter_key = "fake:pdu"
        self.closed = 0
        self.close_error = close_error

    async def read_state(self) -> PowerState:
        return PowerState.ON

    async def command(self, target: PowerState) -> None:
        raise AssertionError("nothing is switched here")

    async def aclose(self) -> None:
        self.closed += 1
        if self.close_error is not None:
            raise self.close_error


def test_every_on_off_device_type_has_a_builder() -> None:
    """A device type added to the config without a backend fails here, not at a freeze."""
    on_off = set(typing.get_args(PowerDevice)) - {SshDevice}
    assert set(BUILDERS) == on_off


def test_the_soft_path_builds_no_backend() -> None:
    device = SshDevice(
        type="ssh", host="127.0.0.1", user="root", key_file="/k", known_hosts_file="/h"
    )
    path = PowerPath("spark-1", 0, "nodes[0].power[0]", device)
    with pytest.raises(TypeError, match=r"nodes\[0\]\.power\[0\]: ssh is not an on/off"):
        build_backend(path, {})


def test_a_group_closes_every_outlet() -> None:
    members = [Outlet("a"), Outlet("b")]
    asyncio.run(OutletGroup(members).aclose())
    assert [m.closed for m in members] == [1, 1]


def test_a_failing_close_is_logged_and_the_other_outlets_still_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Closing runs in finally blocks: an error there must not replace the
    power outcome, nor leave the group's other outlets open."""
    members = [Outlet("a", OSError("socket gone")), Outlet("b")]
    with caplog.at_level(logging.WARNING, logger="spark_watchdog.power"):
        asyncio.run(close_quietly(OutletGroup(members)))
    assert [m.closed for m in members] == [1, 1]
    assert "a: closing its connections failed" in caplog.text
