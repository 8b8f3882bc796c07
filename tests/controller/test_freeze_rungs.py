"""Each node's rungs, worked out once when the controller starts
(controller/act/power_actions.py, ``freeze_rungs``): the power paths that can
reach a frozen host, in their configured order, each with its timing."""

from __future__ import annotations

from pathlib import Path

from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.controller.act.power_actions import freeze_rungs
from spark_watchdog.power.paths import power_paths, timing_for


def test_a_nodes_rungs_are_its_paths_that_cut_power_in_order_with_their_timing(
    tmp_path: Path,
) -> None:
    key, hosts, community = tmp_path / "key", tmp_path / "known_hosts", tmp_path / "community"
    for secret in (key, hosts, community):
        secret.write_text("x\n")
        secret.chmod(0o600)
    ssh = {
        "type": "ssh",
        "host": "127.0.0.1",
        "user": "watchdog",
        "key_file": str(key),
        "known_hosts_file": str(hosts),
    }

    def snmp(outlet: int, timeout: float) -> dict[str, object]:
        return {
            "type": "snmp",
            "host": "127.0.0.1",
            "outlet": outlet,
            "vendor": "apc_rpdu2",
            "community_file": str(community),
            "timeout": timeout,
        }

    config = parse_controller_config(
        {
            "nodes": [
                {"name": "spark-1", "agent": "http://127.0.0.1:9", "power": [ssh]},
                {
                    "name": "spark-2",
                    "agent": "http://127.0.0.1:9",
                    "power": [snmp(1, 2.0), ssh, snmp(2, 30.0)],
                },
            ],
            "history": str(tmp_path / "history.db"),
        },
        "test",
    )

    rungs = freeze_rungs(config)

    assert rungs["spark-1"] == ()  # SSH reboots a stuck host; it cannot reach a frozen one
    assert [r.path.key_path for r in rungs["spark-2"]] == ["nodes[1].power[0]", "nodes[1].power[2]"]
    paths = power_paths(config, config.nodes[1])
    assert [r.timing for r in rungs["spark-2"]] == [
        timing_for(config, paths[0]),
        timing_for(config, paths[2]),
    ]
    assert rungs["spark-2"][0].timing != rungs["spark-2"][1].timing  # each path's own
