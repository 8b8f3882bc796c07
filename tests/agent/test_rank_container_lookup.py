"""Which container is the rank's (docs/serving.md, "Which container is the rank"):
exact name, exact id or labels, never an id prefix, whichever path finds it.

The Engine here answers lookups as dockerd does (a reference is an exact id, an
exact name, else a unique id prefix), so a lookup by ``docker inspect NAME``
would find the bystander below; the real Engine's answer is in
tests/docker/test_container_rank.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

# The docker extra: not in every install (the unit suite on other Pythons).
pytest.importorskip("docker")

import docker
import docker.errors

from spark_watchdog.agent.rank import LaunchFailed
from spark_watchdog.agent.rank_container import ContainerRuntime, rank_match
from spark_watchdog.config.agent import ServingConfig, parse_agent_config

BYSTANDER_ID = "51a2a3d6f86a2475fad8092fe095dd91082df2bacc1896559e8cd5f3a5e85ca1"
HEX_NAME = BYSTANDER_ID[:12]


class _EngineApi:
    """The low-level API calls the runtime makes, over containers kept here."""

    def __init__(self, containers: list[dict[str, Any]]) -> None:
        self.containers_by_id = {c["Id"]: c for c in containers}
        self.removed: list[str] = []
        self.killed: list[str] = []

    def _resolve(self, ref: str) -> dict[str, Any]:
        """dockerd's order: exact id, exact name, then a unique id prefix."""
        if ref in self.containers_by_id:
            return self.containers_by_id[ref]
        for container in self.containers_by_id.values():
            if container["Name"] == f"/{ref}":
                return container
        prefixed = [c for i, c in self.containers_by_id.items() if i.startswith(ref)]
        if len(prefixed) == 1:
            return prefixed[0]
        raise docker.errors.NotFound(f"No such container: {ref}")

    def inspect_container(self, ref: str) -> dict[str, Any]:
        return self._resolve(ref)

    def containers(self, all: bool, filters: dict[str, Any]) -> list[dict[str, Any]]:
        """Docker's list filters: ``name`` matches a part of a name (a regexp)."""
        listed = []
        for c in self.containers_by_id.values():
            labels = c["Config"]["Labels"]
            if "name" in filters and not re.search(filters["name"], c["Name"]):
                continue
            wanted = [item.partition("=") for item in filters.get("label", [])]
            if any(labels.get(key) != value for key, _, value in wanted):
                continue
            listed.append({"Id": c["Id"], "Names": [c["Name"]], "Labels": labels})
        return listed

    def remove_container(self, ref: str, v: bool = False, force: bool = False) -> None:
        container = self._resolve(ref)
        self.removed.append(container["Id"])
        del self.containers_by_id[container["Id"]]

    def kill(self, ref: str, signal: str) -> None:
        self.killed.append(self._resolve(ref)["Id"])


class _Containers:
    def create(self, image: str, **options: Any) -> Any:
        raise docker.errors.APIError("created nothing: the test ends here")


class _Engine:
    def __init__(self, containers: list[dict[str, Any]]) -> None:
        self.api = _EngineApi(containers)
        self.containers = _Containers()


def _container(cid: str, name: str, status: str, **labels: str) -> dict[str, Any]:
    return {
        "Id": cid,
        "Name": f"/{name}",
        "State": {"Status": status, "Running": status == "running", "Pid": 4242},
        "Config": {"Image": "other/app:1", "Labels": labels, "Cmd": ["app"]},
        "HostConfig": {},
    }


class _Runtime(ContainerRuntime):
    """The runtime, asking the Engine above instead of a socket."""

    def __init__(self, config: ServingConfig, engine: _Engine) -> None:
        super().__init__(config, None, "spark-1")
        self.engine = engine

    def new_client(self) -> Any:
        return self.engine


def _serving(tmp_path: Path, **docker_settings: Any) -> ServingConfig:
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    token.chmod(0o600)
    serving = {
        "enabled": True,
        "runtime": "docker",
        "docker": {"image": "vllm/vllm-openai:v1", "name": HEX_NAME, **docker_settings},
        "command": ["vllm", "serve", "m"],
        "token_file": str(token),
        "log_file": str(tmp_path / "serving.log"),
    }
    return parse_agent_config({"node": "spark-1", "serving": serving}).serving


@pytest.mark.parametrize("status", ["running", "exited"])
def test_a_container_whose_id_starts_with_the_name_is_never_adopted_stopped_or_removed(
    tmp_path: Path, status: str
) -> None:
    engine = _Engine([_container(BYSTANDER_ID, "bystander", status)])
    runtime = _Runtime(_serving(tmp_path), engine)
    assert engine.api.inspect_container(HEX_NAME)["Id"] == BYSTANDER_ID  # as dockerd answers

    assert runtime.found() is None
    assert runtime.adopt(tmp_path / "serving.log") is None
    assert runtime.leftover() is None
    # A start removes the rank's previous container, by exact name only.
    with pytest.raises(LaunchFailed, match="created nothing"):
        runtime.launch(["vllm", "serve", "m"], {}, tmp_path / "serving.log", "safe")
    assert engine.api.removed == [] and engine.api.killed == []
    assert BYSTANDER_ID in engine.api.containers_by_id


def test_the_container_of_that_exact_name_is_the_rank_and_is_found_by_its_full_id(
    tmp_path: Path,
) -> None:
    rank_id = "f" * 64
    engine = _Engine(
        [
            _container(BYSTANDER_ID, "bystander", "running"),
            _container(rank_id, HEX_NAME, "exited"),
            _container("e" * 64, f"{HEX_NAME}-2", "exited"),  # the name filter matches it too
        ]
    )
    runtime = _Runtime(_serving(tmp_path), engine)
    found = runtime.found()
    assert found is not None and found["Id"] == rank_id
    with pytest.raises(LaunchFailed):
        runtime.launch(["vllm", "serve", "m"], {}, tmp_path / "serving.log", "safe")
    assert engine.api.removed == [rank_id]


def test_labels_pick_the_rank_only_when_all_of_them_match(tmp_path: Path) -> None:
    labelled = "a" * 64
    engine = _Engine(
        [
            _container(BYSTANDER_ID, "bystander", "running", app="vllm"),
            _container(labelled, "vllm_node", "running", app="vllm", role="head"),
        ]
    )
    runtime = _Runtime(_serving(tmp_path, adopt_labels={"app": "vllm", "role": "head"}), engine)
    found = runtime.found()
    assert found is not None and found["Id"] == labelled


def test_the_event_stream_and_the_lookup_use_one_rule() -> None:
    labels = {"app": "vllm"}
    assert rank_match("vllm_node", {}, ["/vllm_node"], {}) == "name"
    assert rank_match("vllm_node", {}, ["vllm_node"], {}) == "name"  # an event's name
    assert rank_match(HEX_NAME, {}, ["/bystander"], {}) is None
    assert rank_match("vllm", {}, ["/vllm_node", "/vllm-2"], {}) is None
    assert rank_match("x", labels, ["/y"], {"app": "vllm", "other": "1"}) == "labels"
    assert rank_match("x", labels, ["/y"], {"app": "vllm2"}) is None
    assert rank_match("x", {}, ["/y"], {}) is None
