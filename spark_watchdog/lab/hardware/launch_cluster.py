"""The lab's cluster launcher, playing spark-vllm-docker's ``launch-cluster.sh``
(``lab ... --serving launcher``, and the Docker tier): ``start`` runs every
node's container detached (``docker run -d``, host network, the recipe's
command with the arguments given after ``start`` appended, as recipes append
their extra vLLM flags);
``stop`` stops and removes them (``docker stop``, ``docker rm``).

    python -m spark_watchdog.lab.hardware launch-cluster --recipe FILE start [VLLM ARGS...]
    python -m spark_watchdog.lab.hardware launch-cluster --recipe FILE stop

The recipe (JSON): ``socket``, ``image``, ``volumes``, ``environment`` and
``nodes`` (``name``, ``container``, ``command``, ``labels``). Its
``fail`` key plays a broken launcher: ``{"stop": 3}`` exits 3 before doing
anything on stop; ``{"stop_does_nothing": true}`` exits 0 and stops nothing;
``{"start_only": ["spark-1"]}`` starts only those nodes and still exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any

import docker
import docker.errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="launch-cluster", description="start or stop every node's vLLM container"
    )
    parser.add_argument("--recipe", required=True)
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("vllm_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    with open(args.recipe) as f:
        recipe: dict[str, Any] = json.load(f)
    fail = recipe.get("fail", {})
    client = docker.DockerClient(base_url=f"unix://{recipe['socket']}", version="auto")
    if args.action == "stop":
        if "stop" in fail:
            print("launch-cluster: cannot reach the nodes", file=sys.stderr)
            return int(fail["stop"])
        if fail.get("stop_does_nothing"):
            print("stopped (it says)")
            return 0
        for node in recipe["nodes"]:
            with contextlib.suppress(docker.errors.NotFound):
                container = client.containers.get(node["container"])
                container.stop(timeout=10)
                container.remove()
                print(f"stopped {node['container']} on {node['name']}")
        return 0
    only = fail.get("start_only")
    for node in recipe["nodes"]:
        if only is not None and node["name"] not in only:
            continue
        client.containers.run(
            recipe["image"],
            [*node["command"], *args.vllm_args],
            name=node["container"],
            labels=node.get("labels", {}),
            environment=recipe.get("environment", {}),
            volumes=recipe.get("volumes", []),
            network_mode="host",
            detach=True,
        )
        print(f"started {node['container']} on {node['name']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
