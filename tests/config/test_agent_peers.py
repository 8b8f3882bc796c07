"""The agent's ``peers:``: refused at load with the key named, and the same-host warning."""

from __future__ import annotations

from typing import Any

import pytest

from spark_watchdog.config.agent import parse_agent_config, peers_on_management
from spark_watchdog.errors import ConfigError


def _config(peers: Any, **extra: Any) -> dict[str, Any]:
    return {"node": "spark-1", "peers": peers, **extra}


def _problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_agent_config(data)
    return caught.value.problems


def test_peers_load_with_their_defaults() -> None:
    config = parse_agent_config(_config([{"name": "spark-2", "url": "http://192.168.100.2:9720"}]))
    assert [(p.name, p.url) for p in config.peers] == [("spark-2", "http://192.168.100.2:9720")]
    assert (config.peering.interval, config.peering.timeout) == (1.0, 0.5)
    assert parse_agent_config({"node": "spark-1"}).peers == ()


@pytest.mark.parametrize(
    ("peers", "expected"),
    [
        (
            [{"name": "spark-1", "url": "http://192.168.100.1:9720"}],
            'peers[0].name: "spark-1" is this node itself',
        ),
        (
            [
                {"name": "spark-2", "url": "http://192.168.100.2:9720"},
                {"name": "spark-2", "url": "http://192.168.100.3:9720"},
            ],
            'peers[1].name: "spark-2" is listed twice',
        ),
        ([{"name": "spark-2", "url": "ftp://192.168.100.2"}], "peers[0].url: expected"),
        ([{"name": "spark-2", "url": "http://192.168.100.2:99999"}], "peers[0].url: expected"),
        ([{"name": "spark 2", "url": "http://192.168.100.2:9720"}], "peers[0].name: expected"),
        ([{"name": "spark-2"}], "peers[0].url"),
        ({"spark-2": "http://192.168.100.2:9720"}, "peers: expected"),
    ],
)
def test_bad_peers_are_refused_naming_the_key(peers: Any, expected: str) -> None:
    problems = _problems(_config(peers))
    assert any(p.startswith(expected) for p in problems), problems


def test_a_timeout_longer_than_the_interval_is_refused() -> None:
    problems = _problems(_config([], peering={"interval": 1.0, "timeout": 2.0}))
    assert any(p.startswith("peering.timeout: expected at most interval") for p in problems)


def test_a_peer_on_the_management_address_is_no_second_path() -> None:
    config = parse_agent_config(
        _config(
            [
                {"name": "spark-2", "url": "http://10.0.0.11:9720"},
                {"name": "spark-3", "url": "http://192.168.100.3:9720"},
            ],
            listen={"address": "10.0.0.11"},
        )
    )
    assert peers_on_management(config) == ["spark-2"]
    anywhere = parse_agent_config(
        _config(
            [{"name": "spark-2", "url": "http://10.0.0.11:9720"}], listen={"address": "0.0.0.0"}
        )
    )
    assert peers_on_management(anywhere) == []


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://admin:hunter2@192.168.100.2:9720", 'remove "USER:PASSWORD@"'),
        ("http://hunter2@192.168.100.2:9720/", 'remove "USER:PASSWORD@"'),
        ("http://admin:hunter2@[fe80::1", 'remove "USER:PASSWORD@"'),
        ("http://192.168.100.2:9720/?access_token=hunter2", "without a query, fragment"),
        ("http://192.168.100.2:9720/;token=hunter2", "without a query, fragment"),
        ("http://192.168.100.2:9720/?q=Bearer%20hunter2", "without a query, fragment"),
        ("http://192.168.100.2:9720/#hunter2", "without a query, fragment"),
    ],
)
def test_a_peer_url_with_credentials_is_refused_without_showing_them(
    url: str, expected: str
) -> None:
    """Pulses are unauthenticated and a peer's URL is shown in /v1/state and the log."""
    problems = _problems(_config([{"name": "spark-2", "url": url}]))
    assert len(problems) == 1 and problems[0].startswith("peers[0].url: expected"), problems
    assert expected in problems[0]
    assert "hunter2" not in problems[0] and "admin" not in problems[0]
