"""Controller config: power devices by type, secrets only from files."""

from __future__ import annotations

import dataclasses
import os
import re
import typing
from pathlib import Path

import pytest

from spark_watchdog.config import controller as schema
from spark_watchdog.config.controller import (
    ControllerConfig,
    SnmpDevice,
    load_controller_config,
    parse_controller_config,
)
from spark_watchdog.config.power_device_types import POWER_DEVICE_TYPES
from spark_watchdog.config.secrets import Secret, read_secret
from spark_watchdog.errors import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "controller.example.yaml"


def _node(**power: object) -> dict[str, object]:
    return {"name": "spark-1", "agent": "http://127.0.0.1:9720", "power": [power]}


def _problems(data: object) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_controller_config(data)
    return caught.value.problems


def test_example_loads() -> None:
    config = load_controller_config(EXAMPLE)
    assert [n.name for n in config.nodes] == ["spark-1", "spark-2", "spark-3"]
    assert [d.type for d in config.nodes[0].power] == ["snmp", "shelly", "ssh"]
    assert [d.type for d in config.nodes[1].power] == ["tasmota", "ipmi", "redfish"]
    assert [d.type for d in config.nodes[2].power] == [
        "shelly_gen1",
        "home_assistant",
        "nut",
        "kasa",
        "exec",
    ]
    assert config.policy.power_off_seconds == 60.0
    assert config.nodes[0].banner_host == "10.0.0.11"


def _classes(cls: type, seen: set[type]) -> None:
    if cls in seen:
        return
    seen.add(cls)
    for hint in typing.get_type_hints(cls).values():
        for arg in [hint, *typing.get_args(hint)]:
            for inner in [arg, *typing.get_args(arg)]:
                if dataclasses.is_dataclass(inner):
                    _classes(typing.cast(type, inner), seen)


def test_every_key_of_every_device_type_is_documented() -> None:
    lines = EXAMPLE.read_text().splitlines()
    documented: set[str] = set()
    key = r"^(\s*)(?:- )?([a-z_]+):"
    for number, line in enumerate(lines):
        # A key of a commented-out block (colocated:) counts as an active one.
        active = re.match(key, line)
        match = active or re.match(key, re.sub(r"^#\s?", "", line))
        if not match:
            continue
        above = lines[number - 1].strip() if number else ""
        # The explanation above it: a comment (for a commented-out key, not another one).
        explained = above.startswith("#") and (
            active is not None or not re.match(key, above.lstrip("#").strip())
        )
        if explained or " #" in line:
            documented.add(match.group(2))
    classes: set[type] = set()
    _classes(ControllerConfig, classes)
    assert {c.__name__ for c in classes} >= {
        "SnmpDevice",
        "IpmiDevice",
        "RedfishDevice",
        "ShellyDevice",
        "ShellyGen1Device",
        "TasmotaDevice",
        "HomeAssistantDevice",
        "NutDevice",
        "KasaDevice",
        "ExecDevice",
        "SshDevice",
        "PolicyConfig",
        "NodeConfig",
    }
    missing = sorted(
        f"{cls.__name__}.{f.name}"
        for cls in classes
        for f in dataclasses.fields(cls)
        if f.name not in documented
    )
    assert not missing, f"undocumented in {EXAMPLE.name}: {missing}"


def test_inline_secrets_are_a_config_error_that_says_so() -> None:
    problems = _problems(
        {"nodes": [_node(type="ipmi", host="b", user="u", password="hunter2", password_file="/x")]}
    )
    assert problems == [
        "nodes[0].power[0].password: inline secrets are not accepted; put the secret in a file "
        "readable only by the service (chmod 600) and set password_file, or use systemd "
        "LoadCredential="
    ]
    assert all("hunter2" not in p for p in problems)


def test_unknown_device_type_and_wrong_type_keys() -> None:
    problems = _problems(
        {
            "nodes": [
                {
                    "name": "spark-1",
                    "agent": "http://127.0.0.1:9720",
                    "power": [
                        {"type": "ups", "host": "x"},
                        {"type": "shelly", "url": "http://p", "cipher_suite": 3},
                    ],
                }
            ]
        }
    )
    # The table's types, in its order (config/power_device_types.py).
    kinds = ", ".join(t.name for t in POWER_DEVICE_TYPES)
    assert kinds.startswith("snmp, ipmi, redfish, shelly, shelly_gen1, tasmota, home_assistant")
    assert f'nodes[0].power[0].type: expected one of {kinds}, got "ups"' in problems
    assert any(p.startswith("nodes[0].power[1].cipher_suite: unknown key") for p in problems)


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (
            {"type": "snmp", "host": "pdu", "outlet": "A3", "outlets": [1], "community_file": "c"},
            "nodes[0].power[0].outlet: expected exactly one of outlet (number or name) or outlets",
        ),
        (
            {"type": "snmp", "host": "pdu", "outlet": 0, "community_file": "c"},
            "nodes[0].power[0].outlet: expected an integer ≥ 1 and ≤ 65535, got 0",
        ),
        (
            {"type": "snmp", "host": "pdu", "outlet": 1, "version": 3, "community_file": "c"},
            "nodes[0].power[0].user: SNMPv3 needs a user",
        ),
        (
            {"type": "snmp", "host": "pdu", "outlet": 1, "version": "4", "community_file": "c"},
            "nodes[0].power[0].version: expected 1, 2c or 3, got '4'",
        ),
        (
            {
                "type": "snmp",
                "host": "pdu",
                "outlet": 1,
                "vendor": "generic",
                "community_file": "c",
            },
            "nodes[0].power[0].vendor: generic needs control_oid, status_oid",
        ),
        (
            {
                "type": "snmp",
                "host": "pdu",
                "outlet": 1,
                "version": 3,
                "user": "u",
                "priv_protocol": "AES",
                "priv_key_file": "/k",
            },
            "nodes[0].power[0].priv_protocol: privacy needs authentication (authPriv)",
        ),
        (
            {"type": "redfish", "url": "10.0.0.1", "user": "u", "password_file": "/p"},
            'nodes[0].power[0].url: expected an http(s)://host[:port] URL, got "10.0.0.1"',
        ),
        (
            {"type": "shelly_gen1", "url": "http://10.0.0.33", "user": "admin"},
            "nodes[0].power[0].user: a Shelly Gen1 login needs its password: set password_file",
        ),
        (
            {"type": "shelly_gen1", "url": "http://10.0.0.33", "switch_id": -1},
            "nodes[0].power[0].switch_id: expected an integer ≥ 0 and ≤ 255, got -1",
        ),
    ],
)
def test_device_problems(device: dict[str, object], expected: str) -> None:
    problems = _problems({"nodes": [_node(**device)]})
    assert any(p.startswith(expected) for p in problems), problems


def test_outlet_number_or_name() -> None:
    config = parse_controller_config(
        {
            "nodes": [
                _node(type="snmp", host="pdu", outlet="spark-1 psu", community_file="c"),
            ]
        }
    )
    device = config.nodes[0].power[0]
    assert isinstance(device, SnmpDevice)
    assert device.outlet_list == ("spark-1 psu",)
    assert device.snmp_version == "2c"


def test_duplicate_nodes_and_empty_cluster() -> None:
    node = {"name": "spark-1", "agent": "http://127.0.0.1:9720"}
    assert _problems({"nodes": [node, node]}) == ['nodes[1].name: duplicate node name "spark-1"']
    assert _problems({"nodes": []}) == ["nodes: expected at least one node"]


def _nodes(*powers: list[dict[str, object]]) -> dict[str, object]:
    return {
        "nodes": [
            {"name": f"spark-{i + 1}", "agent": f"http://10.0.1.{i + 1}:9720", "power": power}
            for i, power in enumerate(powers)
        ]
    }


def _pdu(**keys: object) -> dict[str, object]:
    return {"type": "snmp", "host": "10.0.0.5", "community_file": "c", **keys}


_IPMI = {"type": "ipmi", "user": "u", "password_file": "/p"}
_REDFISH = {"type": "redfish", "user": "u", "password_file": "/p"}
_HA = {"token_file": "/t"}
_NUT = {"user": "u", "password_file": "/p"}
_SSH = {"host": "10.0.1.2", "user": "u", "key_file": "/k", "known_hosts_file": "/h"}


def test_two_nodes_on_one_outlet_are_refused_with_both_key_paths() -> None:
    problems = _problems(_nodes([_pdu(outlet=3)], [_pdu(outlet=4)], [_pdu(outlet=3)]))
    assert problems == [
        "nodes[2].power[0]: outlet 3 of PDU 10.0.0.5:161 is already nodes[0].power[0] "
        "(spark-1); two nodes on one outlet would cut both"
    ]


@pytest.mark.parametrize(
    ("first", "second", "described"),
    [
        # Host case-insensitive, the default port spelled out, number and "3" alike.
        (_pdu(outlet=3), _pdu(host="10.0.0.5", port=161, outlet="3"), "outlet 3 of PDU"),
        (
            _pdu(host="PDU-A.lab", outlets=[1, 2]),
            _pdu(host="pdu-a.lab", outlets=[5, 2]),
            "outlet 2 of PDU pdu-a.lab:161",
        ),
        (
            {"type": "shelly", "url": "http://Plug-1"},
            {"type": "shelly", "url": "http://plug-1:80/", "switch_id": 0},
            "switch 0 of shelly plug plug-1:80",
        ),
        (
            {"type": "tasmota", "url": "http://10.0.0.32", "switch_id": 2},
            {"type": "tasmota", "url": "http://10.0.0.32:80", "switch_id": 2},
            "switch 2 of tasmota plug 10.0.0.32:80",
        ),
        (
            {"type": "shelly_gen1", "url": "http://10.0.0.33"},
            {"type": "shelly_gen1", "url": "http://10.0.0.33:80", "switch_id": 0},
            "switch 0 of shelly_gen1 plug 10.0.0.33:80",
        ),
        (
            {"type": "nut", "host": "UPS-1", "ups": "rack", "outlet": 2, **_NUT},
            {"type": "nut", "host": "ups-1", "port": 3493, "ups": "rack", "outlet": 2, **_NUT},
            "outlet 2 of rack@ups-1:3493",
        ),
        (
            {"type": "kasa", "host": "Strip-1", "outlet": 2},
            {"type": "kasa", "host": "strip-1", "port": 9999, "outlet": 2},
            "outlet 2 of kasa device strip-1:9999",
        ),
        (
            {"type": "home_assistant", "url": "http://HA:8123", "entity_id": "switch.a", **_HA},
            {"type": "home_assistant", "url": "http://ha:8123/", "entity_id": "switch.a", **_HA},
            "switch.a of Home Assistant ha:8123",
        ),
        (
            {
                "type": "exec",
                "off_command": ["/r", "off"],
                "on_command": ["/r", "on"],
                "status_command": ["/r"],
            },
            {
                "type": "exec",
                "off_command": ["/r", "off"],
                "on_command": ["/q", "on"],
                "status_command": ["/q"],
            },
            'the exec off command "/r off"',
        ),
        ({**_IPMI, "host": "BMC-1"}, {**_IPMI, "host": "bmc-1", "port": 623}, "IPMI BMC bmc-1:623"),
        (
            {**_REDFISH, "url": "https://bmc-1", "system": "Node2"},
            {**_REDFISH, "url": "https://BMC-1:443/redfish/v1", "system": "Node2"},
            "Redfish system Node2 of bmc-1:443",
        ),
        (
            {**_REDFISH, "url": "https://bmc-1"},
            {**_REDFISH, "url": "https://bmc-1"},
            "the Redfish system of bmc-1:443",
        ),
    ],
)
def test_every_device_type_refuses_a_shared_target(
    first: dict[str, object], second: dict[str, object], described: str
) -> None:
    problems = _problems(_nodes([first], [{"type": "ssh", **_SSH}, second]))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"nodes[1].power[1]: {described}"), problems
    assert "is already nodes[0].power[0] (spark-1); two nodes on one" in problems[0]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (_pdu(outlet=3), _pdu(outlet=4)),
        (_pdu(outlet=3), _pdu(outlet=3, port=1161)),
        (_pdu(outlet=3), _pdu(host="10.0.0.6", outlet=3)),
        (_pdu(outlet=3), _pdu(outlet="spark-2")),  # a name is not compared with numbers
        (
            {"type": "shelly", "url": "http://p"},
            {"type": "shelly", "url": "http://p", "switch_id": 1},
        ),
        ({"type": "shelly", "url": "http://p"}, {"type": "shelly", "url": "http://p:8080"}),
        ({**_IPMI, "host": "bmc-1"}, {**_IPMI, "host": "bmc-1", "port": 624}),
        (
            {**_REDFISH, "url": "https://bmc-1", "system": "Node1"},
            {**_REDFISH, "url": "https://bmc-1", "system": "Node2"},
        ),
        # An SSH reboot switches no power of its own: not compared.
        ({"type": "ssh", **_SSH}, {"type": "ssh", **_SSH}),
    ],
)
def test_distinct_targets_are_accepted(first: dict[str, object], second: dict[str, object]) -> None:
    config = parse_controller_config(_nodes([first], [second]))
    assert len(config.nodes) == 2


def test_one_outlet_twice_within_a_node_is_refused() -> None:
    problems = _problems(_nodes([_pdu(outlet=3), _pdu(outlet=3)]))
    assert problems == [
        "nodes[0].power[1]: outlet 3 of PDU 10.0.0.5:161 is already nodes[0].power[0] "
        "of this node; a second path to one outlet is no fallback"
    ]
    problems = _problems(_nodes([_pdu(outlets=[1, 3, 1])]))
    assert problems == [
        "nodes[0].power[0]: outlet 1 of PDU 10.0.0.5:161 is listed twice in nodes[0].power[0]"
    ]


def test_secret_from_file_and_from_credentials_directory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "community"
    path.write_text("private\n")
    path.chmod(0o600)
    secret = read_secret("nodes[0].power[0].community_file", str(path))
    assert isinstance(secret, Secret) and secret.reveal() == "private"
    assert "private" not in repr(secret) and "private" not in str(secret)
    assert not caplog.records
    credentials = tmp_path / "creds"
    credentials.mkdir()
    (credentials / "pdu-community").write_text("s3cret")
    (credentials / "pdu-community").chmod(0o600)
    secret = read_secret("k", "pdu-community", {"CREDENTIALS_DIRECTORY": str(credentials)})
    assert secret.reveal() == "s3cret"


def test_a_loose_secret_file_read_while_running_gets_a_warning_without_the_value(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Refused at start and --check (tests/config/test_secret_checks.py); a mode changed
    while running does not stop a recovery, it is logged."""
    path = tmp_path / "community"
    path.write_text("private")
    path.chmod(0o644)
    read_secret("nodes[0].power[0].community_file", str(path))
    assert (
        f"secret file {path} has mode 0644: group and others can use it; `chmod 600 {path}`"
        in caplog.text
    )
    assert "private" not in caplog.text.replace(str(tmp_path), "")


@pytest.mark.parametrize(
    ("reference", "environ", "expected"),
    [
        ("/nonexistent/secret", {}, "does not exist"),
        ("name-only", {}, "$CREDENTIALS_DIRECTORY is not set"),
        ("../escape", {"CREDENTIALS_DIRECTORY": "/tmp"}, 'must not contain "/"'),
    ],
)
def test_secret_errors_name_the_key(reference: str, environ: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read_secret("nodes[0].power[0].password_file", reference, environ)
    assert expected in str(caught.value)


def test_empty_secret_file(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        read_secret("k", str(path), dict(os.environ))


def test_schema_module_exports_every_device_type() -> None:
    assert set(typing.get_args(schema.PowerDevice)) == {t.config for t in POWER_DEVICE_TYPES}
