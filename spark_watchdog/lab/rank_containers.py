"""The lab's ranks as containers (``lab ... --serving docker|launcher``): a
dockerd of the lab's own, the ranks' image made from this machine's Python,
each node's container and its processes, and the lab's cluster launcher
(``launch-cluster``) with its recipe. lab/cluster.py holds one of these when
its ranks are containers."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
import requests

from spark_watchdog.lab.hardware.dockerd import Dockerd, DockerUnavailable, docker_unavailable
from spark_watchdog.lab.hardware.rank_image import RankImage, rank_image
from spark_watchdog.lab.node import LabNode

if TYPE_CHECKING:
    import docker

# How a node's rank runs (LabCluster.serving_mode; `spark-watchdog lab ... --serving`).
SERVING: dict[str, str] = {
    "process": "a process the agent forks (serving.runtime: process)",
    "docker": "a container the agent creates on the lab's dockerd (serving.runtime: docker)",
    "launcher": "containers a cluster launcher starts (the lab's launch-cluster, playing "
    "spark-vllm-docker's launch-cluster.sh); the agents adopt them, the controller "
    "restarts serving through the launcher (serving.launcher: command)",
}
# Where a containerized lab keeps its dockerd: a short path (a socket's path
# must fit in a sockaddr_un), not under the lab's own directory.
DOCKERD_PREFIX = "swlab-dk-"
LAUNCH_TIMEOUT_S = 120.0
ADOPT_TIMEOUT_S = 60.0


def serving_conflict(mode: str, *, netns: bool = False, vllm: str = "standin") -> str | None:
    """Why ``--serving mode`` cannot run with the lab's other choices; None when it can."""
    if mode == "process":
        return None
    if netns:
        return (
            f"--netns needs --serving process: --serving {mode} runs the ranks on this "
            "machine's own network, and the nodes' network namespaces (lab up --netns, the "
            "partition scenario) need --serving process"
        )
    if vllm != "standin":
        return (
            f"--serving {mode} runs the lab's vLLM stand-in in containers; with --vllm real "
            "use --serving process"
        )
    return None


def check_serving(mode: str, *, netns: bool, vllm: str) -> None:
    """ValueError where ``mode`` is no serving mode, or cannot be combined with
    the lab's other choices: before anything starts."""
    if mode not in SERVING:
        expected = ", ".join(SERVING)
        raise ValueError(f"--serving must be one of {expected}, not {mode!r}")
    conflict = serving_conflict(mode, netns=netns, vllm=vllm)
    if conflict is not None:
        raise ValueError(conflict)


@dataclass
class RankContainers:
    """The containers of one lab's ranks, and what runs them."""

    mode: str  # "docker" (the agents create them) or "launcher" (the launcher does)
    lab_tag: tuple[str, str]  # (variable, lab id): how sweep() finds their processes
    recipe: Path  # the launcher's recipe (launcher mode)
    dockerd: Dockerd | None = None
    image: RankImage | None = None
    _client: docker.DockerClient | None = field(default=None, repr=False)
    _asking: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def start(self) -> RankContainers:
        why = docker_unavailable()
        if why is not None:
            raise DockerUnavailable(f"--serving {self.mode}: {why}")
        # Kept before it starts: stop() stops a dockerd that never answered, too.
        self.dockerd = Dockerd(Path(tempfile.mkdtemp(prefix=DOCKERD_PREFIX)))
        self.dockerd.start()
        with contextlib.closing(self.dockerd.client()) as client:
            self.image = rank_image(client)
        return self

    @property
    def python(self) -> str:
        """The interpreter a rank's command starts (bound into the container)."""
        return self.image.python if self.image is not None else sys.executable

    @staticmethod
    def name(node: LabNode) -> str:
        return f"vllm_{node.name}"

    def environment(self) -> dict[str, str]:
        # The lab's tag: sweep() finds a container's processes like any other.
        variable, lab_id = self.lab_tag
        return {variable: lab_id, "PYTHONDONTWRITEBYTECODE": "1"}

    def agent_serving(self, node: LabNode, serving: dict[str, Any]) -> None:
        """Make a node's ``serving`` config section run its rank as a container:
        created by the agent (docker), or the launcher's, adopted (launcher)."""
        assert self.dockerd is not None and self.image is not None
        settings: dict[str, Any] = {
            "socket": str(self.dockerd.socket),
            "name": self.name(node),
            "gpus": "none",
        }
        if self.mode == "docker":
            settings.update(image=self.image.tag, volumes=list(self.image.volumes))
            serving["environment"] = self.environment()
        else:  # the launcher's container, adopted: its own spec is re-created
            del serving["command"], serving["environment"]
        serving.update(runtime="docker", docker=settings)

    def write_recipe(
        self, nodes: Sequence[LabNode], command_of: Callable[[LabNode], list[str]]
    ) -> None:
        """What the lab's launch-cluster starts on each node."""
        assert self.dockerd is not None and self.image is not None
        lab_id = self.lab_tag[1]
        recipe = {
            "socket": str(self.dockerd.socket),
            "image": self.image.tag,
            "volumes": list(self.image.volumes),
            "environment": self.environment(),
            "nodes": [
                {
                    "name": n.name,
                    "container": self.name(n),
                    "command": command_of(n),
                    "labels": {"spark-watchdog.lab": lab_id},
                }
                for n in nodes
            ],
        }
        self.recipe.write_text(json.dumps(recipe, indent=2))

    def launcher_argv(self, action: str) -> list[str]:
        """The lab's launch-cluster, as a person (or the controller) runs it."""
        return [
            sys.executable,
            "-m",
            "spark_watchdog.lab.hardware",
            "launch-cluster",
            "--recipe",
            str(self.recipe),
            action,
        ]

    def controller_serving(self) -> dict[str, Any]:
        """With the launcher: the controller restarts serving with the lab's
        launch-cluster, the profile's flags appended to its start."""
        if self.mode != "launcher":
            return {}
        return {
            "launcher": {
                "type": "command",
                "stop": self.launcher_argv("stop"),
                "start": [*self.launcher_argv("start"), "{vllm_args}"],
                "stop_timeout": 60.0,
                "start_timeout": 60.0,
            }
        }

    def launch(self, nodes: Sequence[LabNode], environment: Mapping[str, str]) -> None:
        """The operator's first start with the cluster's launcher (the recipe's
        own flags: profile plain); the agents adopt the containers it starts."""
        done = subprocess.run(
            self.launcher_argv("start"),
            capture_output=True,
            text=True,
            timeout=LAUNCH_TIMEOUT_S,
            env=dict(environment),
        )
        if done.returncode != 0:
            raise RuntimeError(f"launch-cluster start exited {done.returncode}: {done.stderr}")
        for node in nodes:
            self._wait_adopted(node)

    def _wait_adopted(self, node: LabNode) -> None:
        deadline = time.monotonic() + ADOPT_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(requests.RequestException, ValueError):
                answer = requests.get(f"{node.agent_url}/v1/serving", timeout=2).json()
                if answer.get("state") == "running":
                    return
            time.sleep(0.2)
        raise TimeoutError(f"{node.name}'s agent did not adopt {self.name(node)}")

    def tree(self, node: LabNode) -> list[psutil.Process]:
        """The processes of the node's rank container, as this machine sees them."""
        if self.dockerd is None:
            return []
        import docker.errors  # the docker extra: there when a dockerd runs

        try:
            # One client for the lab's asking threads (a power cut, a memory
            # collapse watching its rank 5 times a second), one question at a time.
            with self._asking:
                if self._client is None:
                    self._client = self.dockerd.client(timeout=5)
                attrs = self._client.api.inspect_container(self.name(node))
        except (docker.errors.DockerException, requests.RequestException, OSError):
            return []
        pid = int((attrs.get("State") or {}).get("Pid") or 0)
        if pid <= 0:
            return []
        try:
            root = psutil.Process(pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        """Every container removed, the dockerd stopped by PID, its directory gone."""
        if self.dockerd is None:
            return
        with self._asking:
            if self._client is not None:
                self._client.close()
                self._client = None
        import docker.errors

        gone = (docker.errors.DockerException, requests.RequestException, OSError)
        with contextlib.suppress(*gone), contextlib.closing(self.dockerd.client()) as client:
            for container in client.containers.list(all=True):
                container.remove(force=True)
        self.dockerd.stop()
        self.dockerd.unmount()
        shutil.rmtree(self.dockerd.root, ignore_errors=True)
