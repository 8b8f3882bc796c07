"""Numbers are finite and addresses, ports and URLs parse, everywhere, at load: each bad
value is a problem with its key path (exit 2), never a traceback or a busy loop later."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.errors import ConfigError


def _node(**keys: Any) -> dict[str, Any]:
    return {"name": "spark-1", "agent": "http://127.0.0.1:9720", **keys}


def _controller_problems(**sections: Any) -> list[str]:
    data = {"nodes": [_node()], **sections}
    with pytest.raises(ConfigError) as caught:
        parse_controller_config(data)
    return caught.value.problems


def _agent_problems(**sections: Any) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_agent_config({"node": "spark-1", **sections})
    return caught.value.problems


# -- numbers -------------------------------------------------------------------------


def test_nan_and_infinities_are_refused_with_the_key_path() -> None:
    nan, inf = float("nan"), float("inf")
    assert _controller_problems(
        policy={"power_off_seconds": nan, "power_timeout": inf},
        guards={"max_unhealthy_fraction": -inf},
    ) == [
        "policy.power_off_seconds: expected a finite number ≥ 0 and ≤ 3600, got .nan",
        "policy.power_timeout: expected a finite number > 0 and ≤ 600, got .inf",
        "guards.max_unhealthy_fraction: expected a finite number > 0 and ≤ 1, got -.inf",
    ]
    assert _agent_problems(loop_interval=nan) == [
        "loop_interval: expected a finite number ≥ 0.1 and ≤ 60, got .nan"
    ]


def test_an_integer_too_big_for_a_float_is_refused_not_an_overflow() -> None:
    assert _controller_problems(detection={"poll_interval": 10**400}) == [
        "detection.poll_interval: expected a finite number > 0 and ≤ 60, "
        "got an integer of 401 digits"
    ]


def test_free_form_json_holds_no_nan() -> None:
    profiles = {"p": {"speculative_config": {"x": [1.0, float("nan")]}}}
    assert _agent_problems(serving={"profiles": profiles}) == [
        "serving.profiles.p.speculative_config.x[1]: expected a finite number "
        "(JSON has no NaN or infinity), got .nan"
    ]


@pytest.mark.integration
def test_yaml_nan_for_loop_interval_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("node: spark-1\nloop_interval: .nan\nprobes: {gpu: {interval: -.inf}}\n")
    done = subprocess.run(
        [sys.executable, "-m", "spark_watchdog", "agent", "--config", str(path), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr == (
        f"spark-watchdog agent: {path}: 2 problem(s):\n"
        "  loop_interval: expected a finite number ≥ 0.1 and ≤ 60, got .nan\n"
        "  probes.gpu.interval: expected a finite number > 0 and ≤ 3600, got -.inf\n"
    )


# -- addresses, ports, URLs ----------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "problem"),
    [
        ("tcp://127.0.0.1:99999", 'expected a port from 1 to 65535, got "tcp://127.0.0.1:99999"'),
        ("tcp://127.0.0.1:0", 'expected a port from 1 to 65535, got "tcp://127.0.0.1:0"'),
        ("tcp://127.0.0.1", 'expected tcp://host:port (port 1 to 65535), got "tcp://127.0.0.1"'),
        (
            "tcp://127.0.0.1:53/x",
            'expected tcp://host:port (port 1 to 65535), got "tcp://127.0.0.1:53/x"',
        ),
        ("tcp://[::1:53", 'expected tcp://host:port, got "tcp://[::1:53" (Invalid IPv6 URL)'),
    ],
)
def test_bad_witness_targets(target: str, problem: str) -> None:
    assert _controller_problems(witness=[target]) == [f"witness[0]: {problem}"]


def test_good_witness_targets() -> None:
    config = parse_controller_config(
        {"nodes": [_node()], "witness": ["tcp://[::1]:53", "tcp://gw.example:53"]}
    )
    assert config.witness == ("tcp://[::1]:53", "tcp://gw.example:53")


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (
            "http://[::1",
            'expected an http(s)://host[:port] URL, got "http://[::1" (Invalid IPv6 URL)',
        ),
        ("http://spark-1:97200", 'expected a port from 1 to 65535, got "http://spark-1:97200"'),
        ("http://spark-1:port", 'expected a port from 1 to 65535, got "http://spark-1:port"'),
        (
            "http://spark 1:9720",
            "expected an http(s)://host[:port] URL without spaces or control characters, "
            "got 'http://spark 1:9720'",
        ),
        (
            "http://10.0.0.300:9720",
            "expected an http(s)://host[:port] URL with an IP address or a host name, "
            'got "http://10.0.0.300:9720"',
        ),
        (
            "http://spark-1:9720/?x=1",
            'expected an http(s)://host[:port] URL without a query (?…), got "http://spark-1:9720/?x=1"',
        ),
        ("ftp://spark-1", 'expected an http(s)://host[:port] URL, got "ftp://spark-1"'),
    ],
)
def test_bad_agent_urls(url: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_controller_config({"nodes": [_node(agent=url)]})
    assert caught.value.problems == [f"nodes[0].agent: {problem}"]


def test_the_vllm_url_is_parsed_too() -> None:
    assert _agent_problems(probes={"vllm": {"url": "http://[::1"}}) == [
        'probes.vllm.url: expected an http(s)://host[:port] URL, got "http://[::1" '
        "(Invalid IPv6 URL)"
    ]


def test_ipv6_urls_and_webhook_queries_are_fine() -> None:
    config = parse_controller_config(
        {
            "nodes": [_node(agent="http://[::1]:9720")],
            "notify": {"webhooks": [{"url": "https://hooks.example/x?channel=ops"}]},
        }
    )
    assert config.nodes[0].banner_host == "::1"


@pytest.mark.parametrize("section", ["agent", "controller"])
def test_a_listen_address_must_be_an_address(section: str) -> None:
    bad = {"address": "0.0.0.0; rm -rf /"}
    problems = (
        _agent_problems(listen=bad) if section == "agent" else _controller_problems(listen=bad)
    )
    assert problems == [
        "listen.address: expected an IP address to listen on (127.0.0.1, the management "
        'network\'s address, 0.0.0.0 or ::) or a host name, got "0.0.0.0; rm -rf /"'
    ]
    for good in ("::", "0.0.0.0", "10.0.0.11", "localhost"):
        assert parse_agent_config({"node": "n", "listen": {"address": good}}).listen.address == good


def test_device_and_ssh_hosts_are_addresses_or_names() -> None:
    power = [{"type": "ipmi", "host": "10.0.0.1 -P x", "user": "u", "password_file": "/p"}]
    with pytest.raises(ConfigError) as caught:
        parse_controller_config({"nodes": [_node(ssh_host="-oProxyCommand=sh", power=power)]})
    assert caught.value.problems == [
        'nodes[0].power[0].host: expected an IP address or a host name (letters, digits, "-" '
        'and "."), got "10.0.0.1 -P x"'
    ]
    with pytest.raises(ConfigError) as caught:
        parse_controller_config({"nodes": [_node(ssh_host="-oProxyCommand=sh")]})
    assert caught.value.problems == [
        'nodes[0].ssh_host: expected an IP address or a host name (letters, digits, "-" '
        'and "."), got "-oProxyCommand=sh"'
    ]
