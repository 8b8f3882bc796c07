"""What the lab's ``--serving`` modes refuse before anything starts, and the
image its containerized ranks run in (the runs themselves: tests/docker)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import spark_watchdog
from spark_watchdog.lab.cluster import LabCluster
from spark_watchdog.lab.hardware import rank_image
from spark_watchdog.lab.stories.scenarios import run_scenario


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        ({"serving_mode": "podman"}, "--serving must be one of process, docker, launcher"),
        ({"serving_mode": "docker", "netns": True}, "need --serving process"),
        ({"serving_mode": "launcher", "vllm": "real"}, "with --vllm real use --serving process"),
    ],
)
def test_a_lab_refuses_a_serving_mode_it_cannot_run_before_starting_anything(
    tmp_path: Path, settings: dict[str, object], refusal: str
) -> None:
    lab = LabCluster(tmp_path / "lab", **settings)  # type: ignore[arg-type]

    with pytest.raises(ValueError, match=refusal):
        lab.start()
    assert not (tmp_path / "lab").exists() and lab.containers is None


def test_the_partition_scenario_is_not_available_with_containers(tmp_path: Path) -> None:
    result = run_scenario("partition", workdir=tmp_path / "lab", serving="docker")

    assert result.outcome == "not_available"
    assert "--serving process" in " ".join(result.notes)
    assert not (tmp_path / "lab").exists()


def test_lab_up_refuses_namespaces_with_containers() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "spark_watchdog", "lab", "up", "--netns", "--serving", "docker"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--netns needs --serving process" in done.stderr


def test_the_rank_image_binds_this_pythons_paths_outermost_only() -> None:
    bound = [Path(p) for p in rank_image.bound_paths()]

    assert Path("/usr") in bound
    for needed in (Path(sys.base_prefix), Path(sys.prefix), Path(spark_watchdog.__file__)):
        assert any(b == needed.resolve() or b in needed.resolve().parents for b in bound), needed
    for path in bound:
        assert not any(other in path.parents for other in bound), path


def test_the_rank_images_skeleton_mirrors_this_machines_root_links() -> None:
    with tarfile.open(fileobj=io.BytesIO(rank_image._skeleton())) as tar:
        members = {m.name: m for m in tar.getmembers()}
        passwd = tar.extractfile(members["etc/passwd"])
        assert passwd is not None and passwd.read().startswith(b"root:x:0:0:")

    assert members["tmp"].mode == 0o1777
    for name in ("bin", "lib", "lib64", "sbin"):
        host = Path("/") / name
        if host.is_symlink():
            assert members[name].issym() and members[name].linkname == os.readlink(host)
        else:
            assert name not in members
    # The same content, the same tag: imported once per Engine.
    assert rank_image._skeleton() == rank_image._skeleton()
