"""Controllers on the Sparks: every bad order, timing, address and witness is refused
at load with its key and the fix (docs/design.md, "Controllers on the Sparks")."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from spark_watchdog.cli.main import main
from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.controller.look.this_host import node_hosts, not_here
from spark_watchdog.errors import ConfigError

BASE: dict[str, Any] = {
    "nodes": [
        {"name": "spark-1", "agent": "http://10.0.0.11:9720", "ssh_host": "10.0.0.11"},
        {"name": "spark-2", "agent": "http://10.0.0.12:9720"},
    ],
    "listen": {"address": "0.0.0.0"},
    "colocated": {"controllers": [{"node": "spark-1"}, {"node": "spark-2"}]},
}


def _with(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        if key.startswith("colocated_"):
            data["colocated"][key.removeprefix("colocated_")] = value
        else:
            data[key] = value
    return data


def _problem(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_controller_config(data)
    problems: list[str] = caught.value.problems
    assert len(problems) == 1, problems
    return problems[0]


def test_two_sparks_each_running_a_controller_is_a_valid_config() -> None:
    config = parse_controller_config(_with())
    assert config.colocated is not None
    assert config.colocated.order == ("spark-1", "spark-2")


@pytest.mark.parametrize(
    ("changes", "key", "said"),
    [
        # The only controller runs on spark-1: nothing could recover spark-1.
        ({"colocated_controllers": [{"node": "spark-1"}]}, "colocated.controllers", "spark-1"),
        (
            {"colocated_controllers": [{"node": "spark-1"}, {"node": "spark-1"}]},
            "colocated.controllers[1].node",
            "already has place 1",
        ),
        (
            {"colocated_controllers": [{"node": "spark-1"}, {"node": "spark-7"}]},
            "colocated.controllers[1].node",
            "spark-7",
        ),
        ({"colocated_controllers": []}, "colocated.controllers", "at least one"),
        ({"colocated_takeover_after": 20}, "colocated.takeover_after", "freeze_after"),
        ({"colocated_fence_delay": 2}, "colocated.fence_delay", "10"),
        ({"listen": {"address": "127.0.0.1"}}, "listen.address", "other controllers"),
        ({"listen": {"address": "::1"}}, "listen.address", "other controllers"),
        ({"witness": ["tcp://10.0.0.12:22"]}, "witness[0]", "spark-2's own address"),
        ({"witness": ["tcp://10.0.0.11:80"]}, "witness[0]", "spark-1's own address"),
        (
            {"history": "postgresql://watchdog@db:5432/w"},
            "colocated",
            "choose one",
        ),
        (
            {
                "colocated_controllers": [
                    {"node": "spark-1", "urls": ["http://user:pw@10.0.0.11:9721"]},
                    {"node": "spark-2"},
                ]
            },
            "colocated.controllers[0].urls[0]",
            "no user or password",
        ),
        (
            {"colocated_controllers": [{"node": "spark-1", "urls": []}, {"node": "spark-2"}]},
            "colocated.controllers[0].urls",
            "at least one URL",
        ),
    ],
)
def test_a_bad_order_is_refused_with_its_key(changes: dict[str, Any], key: str, said: str) -> None:
    problem = _problem(_with(**changes))
    assert problem.startswith(f"{key}:"), problem
    assert said in problem, problem
    assert "pw" not in problem


def test_a_witness_on_a_controllers_fabric_url_is_its_own_address() -> None:
    controllers = [
        {"node": "spark-1", "urls": ["http://10.0.0.11:9721", "http://192.168.100.1:9721"]},
        {"node": "spark-2"},
    ]
    problem = _problem(_with(colocated_controllers=controllers, witness=["tcp://192.168.100.1:53"]))
    assert problem.startswith("witness[0]:") and "spark-1" in problem


def test_the_gateway_as_witness_is_fine() -> None:
    assert parse_controller_config(_with(witness=["tcp://10.0.0.1:53"])).witness


def test_a_controller_started_on_a_node_without_a_place_is_refused(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    data = _with(history=str(tmp_path / "h.db"))
    data["nodes"][1]["agent"] = "http://127.0.0.1:9720"  # spark-2 is this host
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["controller", "--config", str(path), "--check", "--node", "spark-9"]) == 2
    assert "spark-9" in capsys.readouterr().err
    assert main(["controller", "--config", str(path), "--check", "--node", "spark-2"]) == 0
    assert "place 2 of 2" in capsys.readouterr().out
    # spark-1's addresses are not this host's: a wrong --node is refused, not started.
    assert main(["controller", "--config", str(path), "--check", "--node", "spark-1"]) == 2
    err = capsys.readouterr().err
    assert "none of spark-1's addresses (10.0.0.11)" in err


def test_this_host_is_the_node_when_one_of_its_addresses_resolves_here() -> None:
    controllers = [
        {"node": "spark-1", "urls": ["http://spark-1.fabric:9721"]},
        {"node": "spark-2"},
    ]
    config = parse_controller_config(_with(colocated_controllers=controllers))
    names = {"spark-1.fabric": {"192.168.100.1"}, "10.0.0.11": {"10.0.0.11"}}

    def resolver(host: str) -> set[str]:
        return names.get(host, set())

    assert node_hosts(config, "spark-1") == ["10.0.0.11", "spark-1.fabric"]
    assert not_here(config, "spark-1", {"192.168.100.1"}, resolver) is None
    assert not_here(config, "spark-1", {"10.0.0.11", "fe80::1"}, resolver) is None
    refused = not_here(config, "spark-1", {"10.0.0.12"}, resolver)
    assert refused is not None and "another Spark" in refused
