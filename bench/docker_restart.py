"""What a restart through Docker adds to the rank's own start.

The same safe-profile restart (stop, then start until ``/health`` answers 200)
is timed with ``serving.runtime: process`` and with ``serving.runtime:
docker`` on a dockerd of the bench's own (the Docker tier's image, the lab's
vLLM stand-in in it): the difference of the medians is what Docker adds.
``--real`` does the same with the real vLLM (the real-vLLM tier's venv,
bound into the container, vLLM's cache on a host directory; ``--enforce-eager``:
the tier's image has no C++ compiler for torch.compile).

    .venv/bin/python -m bench.docker_restart --rounds 5
    .venv/bin/python -m bench.docker_restart --real --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from spark_watchdog.agent.serving import ServingLauncher
from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.lab.hardware import real_vllm
from spark_watchdog.lab.hardware.dockerd import Dockerd
from spark_watchdog.lab.ports import free_port

ROOT = Path(__file__).resolve().parents[1]
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])
GOAL_OVERHEAD_S = 2.0
START_TIMEOUT_S = 600.0


def _script(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _image(daemon: Dockerd) -> str:
    guest = _script("guest_image")
    path = guest.built_image("bookworm")
    if path is None:
        raise SystemExit("bench: build the image first: python3 scripts/guest_image.py build")
    tag = f"spark-watchdog-bench/rank:{guest.image_key('bookworm')}"
    with subprocess.Popen(["tar", "-C", str(path), "-c", "."], stdout=subprocess.PIPE) as tar:
        assert tar.stdout is not None
        daemon.client().api.import_image_from_stream(tar.stdout, repository=tag)
    return tag


def _launcher(
    workdir: Path, command: list[str], environment: dict[str, str], docker: dict[str, Any] | None
) -> ServingLauncher:
    token = workdir / "token"
    token.write_text("bench-token\n")
    token.chmod(0o600)
    serving: dict[str, Any] = {
        "enabled": True,
        "command": command,
        "environment": environment,
        "token_file": str(token),
        "log_file": str(workdir / f"serving-{'docker' if docker else 'process'}.log"),
        "stop_timeout": 30.0,
    }
    if docker is not None:
        serving.update(runtime="docker", docker=docker)
    config = parse_agent_config({"node": "bench-1", "serving": serving})
    return ServingLauncher(config.serving, node="bench-1")


def _restart(launcher: ServingLauncher, url: str, ready: Callable[[], bool]) -> float:
    """Stop, then start with the safe profile until ready: the seconds it took."""
    launcher.stop()
    started = time.monotonic()
    launcher.start("safe")
    deadline = started + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if launcher.status()["state"] != "running":
            raise SystemExit(f"bench: the rank ended while starting: {launcher.status()}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{url}/health", timeout=2).status_code == 200 and ready():
                return time.monotonic() - started
        time.sleep(0.05)
    raise SystemExit(f"bench: not serving after {START_TIMEOUT_S:.0f} s")


def standin(daemon: Dockerd, image: str, workdir: Path, rounds: int) -> dict[str, Any]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    inside = ["python3", "-m", "spark_watchdog.lab.hardware", "vllm", "--port", str(port)]
    here = [sys.executable, "-m", "spark_watchdog.lab.hardware", "vllm", "--port", str(port)]
    env = {"PYTHONPATH": f"{SITE_PACKAGES}:{ROOT}", "PYTHONDONTWRITEBYTECODE": "1"}
    docker = {
        "image": image,
        "socket": str(daemon.socket),
        "gpus": "none",
        "volumes": [f"{ROOT}:{ROOT}:ro", f"{SITE_PACKAGES}:{SITE_PACKAGES}:ro"],
    }
    launchers = {
        "process": _launcher(workdir, here, {}, None),
        "docker": _launcher(workdir, inside, env, docker),
    }
    return _compare(launchers, url, rounds, "the stand-in", digits=3)


def real(daemon: Dockerd, image: str, workdir: Path, rounds: int) -> dict[str, Any]:
    python = _script("real_vllm_env").built_python()
    if python is None:
        raise SystemExit("bench: build the real vLLM first: python3 scripts/real_vllm_env.py build")
    venv = Path(python).parent.parent.resolve()
    base = Path(os.path.realpath(python)).parent.parent
    model = real_vllm.tiny_model(Path(python)).resolve()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = real_vllm.RealHead(venv / "bin" / "python", model).command("127.0.0.1", port)
    env = real_vllm.server_environment(base={})
    # vLLM's cache (~/.cache/vllm: the model inspection it otherwise runs in a
    # subprocess at every start, ~8 s here, and on a GPU build the compile cache)
    # on the host, as docs/serving.md says to mount it.
    cache = workdir / "vllm-cache"
    cache.mkdir()
    docker = {
        "image": image,
        "socket": str(daemon.socket),
        "gpus": "none",
        "volumes": [f"{p}:{p}:ro" for p in (venv, base, model)] + [f"{cache}:/root/.cache/vllm"],
    }
    launchers = {
        "process": _launcher(workdir, command, {**os.environ, **env}, None),
        "docker": _launcher(workdir, command, env, docker),
    }
    return _compare(launchers, url, rounds, "real vLLM", digits=1)


def _compare(
    launchers: dict[str, ServingLauncher], url: str, rounds: int, what: str, digits: int
) -> dict[str, Any]:
    """``rounds`` timed restarts of each launcher (after one that is not counted:
    it fills the page cache), and what Docker adds to the median."""
    times: dict[str, list[float]] = {kind: [] for kind in launchers}
    for kind, launcher in launchers.items():

        def engine_said(launcher: ServingLauncher = launcher) -> bool:
            return launcher.status()["effective"]["cudagraph_mode"] is not None

        try:
            _restart(launcher, url, engine_said)
            for n in range(rounds):
                times[kind].append(_restart(launcher, url, engine_said))
                print(
                    f"bench: {what}, {kind} restart {n + 1}/{rounds}: {times[kind][-1]:.2f} s",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            launcher.stop()
            launcher.close()
    process, docker_s = statistics.median(times["process"]), statistics.median(times["docker"])
    return {
        "rounds": rounds,
        "process_s": [round(t, digits) for t in times["process"]],
        "docker_s": [round(t, digits) for t in times["docker"]],
        "median_process_s": round(process, digits),
        "median_docker_s": round(docker_s, digits),
        "docker_adds_s": round(docker_s - process, digits),
        "goal_s": GOAL_OVERHEAD_S,
        "goal_met": docker_s - process <= GOAL_OVERHEAD_S,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="restarts timed per runtime")
    parser.add_argument("--real", action="store_true", help="the real vLLM instead")
    parser.add_argument("--json-out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    # A short path: the daemon's socket must fit in a sockaddr_un.
    workdir = Path(tempfile.mkdtemp(prefix="bench-docker-", dir="/tmp"))
    (workdir / "dk").mkdir()
    daemon = Dockerd(workdir / "dk").start()
    try:
        image = _image(daemon)
        run = real if args.real else standin
        result = run(daemon, image, workdir, args.rounds)
    finally:
        with contextlib.suppress(Exception):
            for container in daemon.client().containers.list(all=True):
                container.remove(force=True)
        daemon.stop()
        daemon.unmount()
    print(json.dumps(result, indent=2))
    if args.json_out:
        args.json_out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
