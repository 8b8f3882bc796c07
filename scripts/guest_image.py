"""A Debian root file system for the systemd guest tier (tests/guest).

The tier boots a real systemd as PID 1 with ``systemd-nspawn -b`` on a
directory this script makes with ``debootstrap``: Debian 12's minimal base
(bookworm, Python 3.11), with systemd, D-Bus, python3 with venv, and the
distro's python3-systemd (what deploy/install.sh expects on a node). A
second image, Debian 13 (trixie, Python 3.13), only runs the unit tests on
its Python: it carries a venv (``/opt/unit-tests``) with the project's
dependencies and the test runner, so that the tests run offline. Each image
is cached per user and keyed by the suite, the package list and (trixie) the
Python requirements, so building it again is free while none changes; the
tests boot it through an overlay, never write to it.

Standard library only: it runs under the system Python before any venv exists.

    python3 scripts/guest_image.py build [SUITE]   # build or reuse; prints the image's path
    python3 scripts/guest_image.py path [SUITE]    # the image if built (exit 1 if not)

SUITE is bookworm (the default) or trixie.

It needs root, debootstrap and systemd-nspawn (Debian's systemd-container);
where any is missing, ``build`` exits 3 and scripts/test.sh skips the tier.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

SUITES: dict[str, tuple[str, ...]] = {
    "bookworm": (
        "systemd",
        "systemd-sysv",
        "dbus",
        "python3",
        "python3-venv",
        "python3-systemd",
        "ca-certificates",
        "procps",
        # The real vLLM's CPU build (torch) links libnuma: the Docker tier runs
        # it from its venv in a container of this image (tests/docker).
        "libnuma1",
    ),
    "trixie": ("python3", "python3-venv", "ca-certificates"),
}
DEFAULT_SUITE = "bookworm"
ROOT = Path(__file__).resolve().parents[1]
# The trixie image's venv for the unit suite on Python 3.13 (tests/guest/test_pythons.py):
# the project's dependencies (pyproject.toml) and these, so that /src installs
# without an index (--no-build-isolation) and its tests run.
UNIT_TEST_VENV = "/opt/unit-tests"
UNIT_TEST_REQUIREMENTS = (
    "pytest>=8,<9.2",
    "pytest-xdist>=3.6",  # tests/suite runs the suite's own plan for workers
    "hypothesis>=6",
    "setuptools>=77",
    "wheel",
)
# pip in the image trusts this machine's CA bundle (bound in while it installs).
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# The serving drop-in runs the rank as this user (systemd/...service.d/serving.conf).
SERVING_USER = "vllm"
COMPLETE = ".complete"
EXIT_NOT_HERE = 3
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def cache_root() -> Path:
    explicit = os.environ.get("SPARK_WATCHDOG_CACHE")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "spark-watchdog"


def python_requirements(suite: str = DEFAULT_SUITE) -> tuple[str, ...]:
    """What the image's unit-test venv holds (none but in trixie)."""
    if suite != "trixie":
        return ()
    return (*_project_dependencies(), *UNIT_TEST_REQUIREMENTS)


def _project_dependencies() -> list[str]:
    text = (ROOT / "pyproject.toml").read_text()
    if sys.version_info >= (3, 11):
        import tomllib

        return [str(d) for d in tomllib.loads(text)["project"]["dependencies"]]
    # Python 3.10 (Ubuntu 22.04's python3) has no tomllib: the array's strings.
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    return re.findall(r'^\s*"([^"]+)"', block.group(1), re.M) if block else []


def image_key(suite: str = DEFAULT_SUITE) -> str:
    parts = (suite, SERVING_USER, *SUITES[suite], *python_requirements(suite))
    recipe = "\0".join(parts).encode()
    return f"debian-{suite}-{hashlib.sha256(recipe).hexdigest()[:12]}"


def image_dir(suite: str = DEFAULT_SUITE) -> Path:
    return cache_root() / "guest" / image_key(suite)


def built_image(suite: str = DEFAULT_SUITE) -> Path | None:
    directory = image_dir(suite)
    return directory if (directory / COMPLETE).is_file() else None


def unavailable() -> str | None:
    """Why the tier cannot run on this machine, or None."""
    if os.geteuid() != 0:
        return "the systemd guest tier needs root (debootstrap, systemd-nspawn)"
    for tool, package in (("debootstrap", "debootstrap"), ("systemd-nspawn", "systemd-container")):
        if shutil.which(tool) is None:
            return f"{tool} not found: apt-get install {package}"
    return None


def _say(text: str) -> None:
    print(f"guest-image: {text}", file=sys.stderr, flush=True)


def build(suite: str = DEFAULT_SUITE) -> Path:
    found = built_image(suite)
    if found is not None:
        return found
    target = image_dir(suite)
    scratch = target.with_name(f"{target.name}.building-{os.getpid()}")
    _remove(scratch)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    mirror = os.environ.get("SPARK_WATCHDOG_DEBIAN_MIRROR", DEFAULT_MIRROR)
    started = time.monotonic()
    _say(f"debootstrap {suite} from {mirror} into {scratch} (a minute or two, about 300 MB)")
    try:
        _bootstrap(suite, scratch, mirror)
        if python_requirements(suite):
            _unit_test_venv(suite, scratch)
    except BaseException:
        _remove(scratch)  # nothing half-built stays in the cache
        raise
    (scratch / COMPLETE).write_text(image_key(suite) + "\n")
    shutil.rmtree(target, ignore_errors=True)
    scratch.rename(target)
    _say(f"ready after {time.monotonic() - started:.0f} s: {target}")
    return target


def _remove(tree: Path) -> None:
    """Delete a half-built root, unless something is still mounted inside it
    (debootstrap mounts /proc and /sys there): never delete through a mount."""
    inside = str(tree.resolve()) + "/"
    with open("/proc/self/mountinfo") as table:
        mounted = [line.split()[4] for line in table if line.split()[4].startswith(inside)]
    if mounted:
        _say(f"left {tree} in place: {', '.join(mounted)} still mounted there")
        return
    shutil.rmtree(tree, ignore_errors=True)


def _bootstrap(suite: str, scratch: Path, mirror: str) -> None:
    subprocess.run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(SUITES[suite])}",
            suite,
            str(scratch),
            mirror,
        ],
        check=True,
        stdout=sys.stderr.fileno(),
    )
    subprocess.run(
        ["chroot", str(scratch), "useradd", "--system", "--create-home", SERVING_USER],
        check=True,
    )
    # Each booted copy gets a machine id of its own (tests/guest/conftest.py);
    # persistent journal storage, so a previous boot can be read after a reboot.
    (scratch / "etc/machine-id").write_text("")
    (scratch / "var/log/journal").mkdir(parents=True, exist_ok=True)
    shutil.rmtree(scratch / "var/cache/apt/archives", ignore_errors=True)


def _unit_test_venv(suite: str, scratch: Path) -> None:
    """The venv the unit suite runs from, made inside the image (its Python),
    with this machine's network and CA bundle for pip."""
    _say(f"{suite}: {UNIT_TEST_VENV} with the project's dependencies and the test runner")
    script = (
        "set -eu\n"
        f"python3 -m venv {UNIT_TEST_VENV}\n"
        f"{UNIT_TEST_VENV}/bin/pip install -q --disable-pip-version-check "
        '--cert /etc/ssl/certs/host-ca.crt "$@"\n'
    )
    (scratch / "make-unit-test-venv.sh").write_text(script)
    try:
        subprocess.run(
            [
                "systemd-nspawn",
                "--quiet",
                "-D",
                str(scratch),
                "--register=no",
                "--keep-unit",
                "--as-pid2",
                f"--bind-ro={HOST_CA_BUNDLE}:/etc/ssl/certs/host-ca.crt",
                "/bin/sh",
                "/make-unit-test-venv.sh",
                *python_requirements(suite),
            ],
            check=True,
            stdout=sys.stderr.fileno(),
            timeout=1800,
        )
    finally:
        (scratch / "make-unit-test-venv.sh").unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("build", "path") or len(argv) > 2:
        print("usage: guest_image.py build|path [SUITE]", file=sys.stderr)
        return 2
    suite = argv[1] if len(argv) == 2 else DEFAULT_SUITE
    if suite not in SUITES:
        print(
            f"guest_image.py: unknown suite {suite!r} (known: {', '.join(SUITES)})", file=sys.stderr
        )
        return 2
    if argv[0] == "path":
        found = built_image(suite)
        if found is None:
            return 1
        print(found)
        return 0
    why = unavailable()
    if why is not None:
        _say(why)
        return EXIT_NOT_HERE
    print(build(suite))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
