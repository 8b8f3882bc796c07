"""The Docker tier: the rank as a container of a real Docker Engine.

The tier starts a dockerd of its own (Debian's docker.io: its own data root,
exec root and socket in a temporary directory, no iptables, no bridge,
containers on the host's network) and stops it, by its PID, at the end. No
registry is reached: the image is ``docker import`` of the systemd guest
tier's Debian 12 root file system (python3), and the rank's code and its
dependencies are bound in read-only at the paths they have here (the
checkout and this venv's site-packages), so the container runs the lab's
vLLM stand-in (or, in the real-vLLM case, the real server from its venv).

Without dockerd or root the tier is skipped with the reason, unless
``SPARK_WATCHDOG_REQUIRE_DOCKER=1`` (scripts/test.sh sets it where it can
run): then it fails.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import docker
import docker.errors
import pytest
from docker_tier import ROOT, Dockerd

from spark_watchdog.lab.hardware.dockerd import docker_unavailable


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


def _unavailable(why: str) -> None:
    if os.environ.get("SPARK_WATCHDOG_REQUIRE_DOCKER") == "1":
        pytest.fail(f"SPARK_WATCHDOG_REQUIRE_DOCKER=1 but {why}")
    pytest.skip(f"Docker tier skipped: {why}")


def _guest_image_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("guest_image", ROOT / "scripts/guest_image.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def dockerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dockerd]:
    if os.environ.get("SPARK_WATCHDOG_DOCKER") == "0":
        pytest.skip("SPARK_WATCHDOG_DOCKER=0: the Docker tier is off")
    why = docker_unavailable()
    if why is not None:
        _unavailable(why)
    # A short path: the socket's path must fit in a sockaddr_un.
    daemon = Dockerd(Path(tmp_path_factory.mktemp("dk")))
    try:
        daemon.start()
    except RuntimeError as exc:
        daemon.stop()
        _unavailable(str(exc))
    try:
        yield daemon
    finally:
        with contextlib.suppress(docker.errors.DockerException, OSError):
            client = daemon.client()
            for container in client.containers.list(all=True):
                container.remove(force=True)
        daemon.stop()
        daemon.unmount()


@pytest.fixture(scope="session")
def rank_image(dockerd: Dockerd) -> str:
    """The guest tier's Debian 12 root file system as an image (python3 in it)."""
    script = _guest_image_script()
    image = script.built_image("bookworm")
    if image is None:
        _unavailable("no bookworm image: python3 scripts/guest_image.py build bookworm")
    tag = f"spark-watchdog-test/rank:{script.image_key('bookworm')}"
    with subprocess.Popen(["tar", "-C", str(image), "-c", "."], stdout=subprocess.PIPE) as tar:
        assert tar.stdout is not None
        dockerd.client().api.import_image_from_stream(tar.stdout, repository=tag)
    assert tar.returncode == 0, "tar of the guest image failed"
    return tag


@pytest.fixture
def docker_client(dockerd: Dockerd) -> Iterator[docker.DockerClient]:
    client = dockerd.client()
    yield client
    for container in client.containers.list(all=True):
        container.remove(force=True)
    client.close()
