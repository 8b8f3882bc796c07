"""The systemd guest tier: the units under a real systemd as PID 1.

Each guest is the Debian image from ``scripts/guest_image.py`` under an
overlay of its own (the image stays as built; what the guest writes goes to
its upper layer) booted with ``systemd-nspawn -b``: its own PID 1, journald, D-Bus, machine
id and (nspawn's) boot id, sharing the test machine's kernel and network, so
that the agent in one guest and the controller in another talk over
loopback like two hosts. Commands run inside with ``nsenter`` into the
guest's namespaces. The project goes in the way an operator installs it:
``deploy/install.sh`` from a wheel, with the checkout bound read-only at
``/src``.

Without the image the tier is skipped with the build command in the reason,
unless ``SPARK_WATCHDOG_REQUIRE_GUEST=1`` (scripts/test.sh sets it once the
image is there): then it fails.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import IO

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# A boot of the guest takes about a second here; the deadline is for a loaded CI machine.
BOOT_TIMEOUT = 180.0
# systemd-nspawn's exit status when the guest asked for a reboot (systemd-nspawn(1)).
NSPAWN_REBOOT = 133


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.guest)
            item.add_marker(pytest.mark.integration)


def _image_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("guest_image", ROOT / "scripts/guest_image.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _image(suite: str) -> Path:
    if os.environ.get("SPARK_WATCHDOG_GUEST") == "0":
        pytest.skip("SPARK_WATCHDOG_GUEST=0: the systemd guest tier is off")
    script = _image_script()
    why = script.unavailable()
    image = script.built_image(suite) if why is None else None
    if image is None:
        reason = why or f"no {suite} image: python3 scripts/guest_image.py build {suite}"
        if os.environ.get("SPARK_WATCHDOG_REQUIRE_GUEST") == "1":
            pytest.fail(f"SPARK_WATCHDOG_REQUIRE_GUEST=1 but {reason}")
        pytest.skip(reason)
    return Path(image)


@pytest.fixture(scope="session")
def guest_image() -> Path:
    """Debian 12 (bookworm) with systemd: the guests the units boot in."""
    return _image("bookworm")


@pytest.fixture(scope="session")
def trixie_image() -> Path:
    """Debian 13 (trixie): its python3 is 3.13."""
    return _image("trixie")


@pytest.fixture
def trixie_root(trixie_image: Path, tmp_path: Path) -> Iterator[Path]:
    """The trixie image under an overlay, with a copy of the checkout at /src."""
    with overlay(trixie_image, tmp_path / "trixie") as root:
        _copy_tree(ROOT, root / "src")
        yield root


@pytest.fixture(scope="session")
def unit_test_venv() -> str:
    """Where the trixie image keeps its venv for the unit suite."""
    return str(_image_script().UNIT_TEST_VENV)


@contextlib.contextmanager
def overlay(image: Path, where: Path) -> Iterator[Path]:
    """``where`` shows the image, and takes every write in a layer of its own
    (``where``.upper) that goes when the context ends: a guest of its own for
    the price of what it writes, not of a copy of the image (about 400 MB)."""
    upper, work = where.with_name(f"{where.name}.upper"), where.with_name(f"{where.name}.work")
    for directory in (where, upper, work):
        directory.mkdir(parents=True)
    options = f"lowerdir={image},upperdir={upper},workdir={work}"
    subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(where)], check=True)
    try:
        yield where
    finally:
        # Lazily: a process of a guest that has not quite gone yet keeps no layer.
        done = subprocess.run(["umount", "--lazy", str(where)], check=False)
        if done.returncode == 0:
            for directory in (where, upper, work):
                shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="session")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout (what git tracks or would): the guests see it at
    /src, and the wheel is built from it, not from a checkout whose build/
    may hold modules that no longer exist."""
    tree = tmp_path_factory.mktemp("source") / "src"
    _copy_tree(ROOT, tree)
    return tree


@pytest.fixture(scope="session")
def wheels(source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The project's wheel as it is, and as a later version (the upgrade)."""
    out = tmp_path_factory.mktemp("wheels")
    current = _wheel(source, out / "current")
    later_tree = tmp_path_factory.mktemp("later") / "src"
    _copy_tree(ROOT, later_tree)
    init = later_tree / "spark_watchdog/__init__.py"
    text = init.read_text()
    version = text.split('__version__ = "', 1)[1].split('"', 1)[0]
    init.write_text(text.replace(f'__version__ = "{version}"', f'__version__ = "{version}.post1"'))
    later = _wheel(later_tree, out / "later")
    # Everything the wheel depends on, for the guest's pip to install offline
    # (PIP_NO_INDEX, PIP_FIND_LINKS): the guests reach no package index.
    deps = out / "deps"
    deps.mkdir()
    for wheel in _dependency_wheels(current).iterdir():
        os.link(wheel, deps / wheel.name)
    return {"current": current, "later": later}


def _dependency_wheels(project_wheel: Path) -> Path:
    """The wheels of what ``project_wheel`` requires, downloaded once and kept
    in the cache under a key of its requirements and this Python and machine."""
    with zipfile.ZipFile(project_wheel) as wheel:
        (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        lines = wheel.read(metadata).decode().splitlines()
    requires = sorted(line for line in lines if line.startswith("Requires-Dist:"))
    recipe = "\n".join((sys.version.split()[0], platform.machine(), *requires)).encode()
    cache = Path(_image_script().cache_root()) / "wheelhouse"
    kept = (
        cache / f"py{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}-"
        f"{hashlib.sha256(recipe).hexdigest()[:12]}"
    )
    if (kept / ".complete").is_file():
        return kept / "wheels"
    scratch = cache / f"{kept.name}.building-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "-d",
            str(scratch / "wheels"),
            str(project_wheel),
        ],
        check=True,
        timeout=900,
    )
    for own in (scratch / "wheels").glob("spark_watchdog-*"):
        own.unlink()  # the project's own wheel is built anew every session
    (scratch / ".complete").write_text("")
    shutil.rmtree(kept, ignore_errors=True)
    scratch.rename(kept)
    return kept / "wheels"


def _copy_tree(source: Path, target: Path) -> None:
    """The checkout's tracked and untracked files, without .venv and caches."""
    listed = subprocess.run(
        ["git", "-C", str(source), "ls-files", "-co", "--exclude-standard", "-z"],
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        relative = Path(os.fsdecode(raw))
        origin = source / relative
        if not origin.is_file():
            continue
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        (target / relative).write_bytes(origin.read_bytes())


def _wheel(source: Path, out: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
        check=True,
        timeout=600,
    )
    (found,) = out.glob("spark_watchdog-*.whl")
    return found


@dataclass
class Guest:
    """One booted copy of the image: start, reboot, power loss, commands."""

    name: str
    root: Path
    binds: dict[Path, str] = field(default_factory=dict)
    boots: int = 0
    _nspawn: subprocess.Popen[bytes] | None = None
    _console: IO[bytes] | None = None

    @property
    def console_log(self) -> Path:
        return self.root.with_name(f"{self.name}.console.log")

    def start(self) -> Guest:
        """Boot the guest and wait until its systemd says the system is up."""
        assert self._nspawn is None or self._nspawn.poll() is not None, "already running"
        if self._console is None:
            self._console = self.console_log.open("ab")
        argv = [
            "systemd-nspawn",
            "--quiet",
            "-D",
            str(self.root),
            "--boot",
            f"--machine={self.name}",
            # Not with the machine manager (none need run here), in the caller's cgroup.
            "--register=no",
            "--keep-unit",
            "--link-journal=no",
            *(f"--bind-ro={host}:{inside}" for host, inside in self.binds.items()),
        ]
        self._nspawn = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=self._console, stderr=subprocess.STDOUT
        )
        self.boots += 1
        self.wait_for(self._system_up, BOOT_TIMEOUT, "the guest's systemd to be up")
        return self

    def _system_up(self) -> bool:
        if self._nspawn is not None and self._nspawn.poll() is not None:
            raise AssertionError(
                f"systemd-nspawn exited with {self._nspawn.returncode}:\n{self.console_tail()}"
            )
        if self.leader() is None:
            return False
        # Blocks until the boot is done, once PID 1 answers on its bus at all.
        state = self.run(
            "systemctl", "is-system-running", "--wait", check=False, timeout=BOOT_TIMEOUT
        ).stdout.strip()
        return state in ("running", "degraded")

    def leader(self) -> int | None:
        """The guest's PID 1 (systemd) as this machine numbers it."""
        if self._nspawn is None or self._nspawn.poll() is not None:
            return None
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self._nspawn.pid).children(recursive=True):
                if child.name() == "systemd":
                    return child.pid
        return None

    def run(
        self, *argv: str, check: bool = True, timeout: float = 120.0, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        leader = self.leader()
        assert leader is not None, f"guest {self.name} is not running"
        done = subprocess.run(
            [
                "nsenter",
                "-t",
                str(leader),
                "-a",
                "--",
                "/usr/bin/env",
                "-i",
                f"PATH={PATH}",
                "LANG=C.UTF-8",
                *argv,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"in guest {self.name}: {' '.join(argv)} exited {done.returncode}\n"
                f"stdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
            )
        return done

    def write(self, path: str, text: str, mode: int = 0o644) -> None:
        """A file in the guest, created with its mode (a secret is never readable)."""
        target = self.root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700 if mode & 0o077 == 0 else 0o755)
        descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
        target.chmod(mode)

    def reboot(self) -> None:
        """A clean reboot from inside: ``systemctl reboot``, then the next boot."""
        assert self._nspawn is not None
        self.run("systemctl", "reboot", check=False)
        code = self._nspawn.wait(timeout=BOOT_TIMEOUT)
        assert code == NSPAWN_REBOOT, f"nspawn exited {code} at a reboot:\n{self.console_tail()}"
        self.start()

    def power_loss(self) -> None:
        """The guest's PID 1 killed: every process in it dies at once, nothing
        is flushed or closed, like a host whose power went; then the next boot."""
        assert self.leader() is not None, f"guest {self.name} is not running"
        self.cut_power()
        self.start()

    def _processes(self) -> list[psutil.Process]:
        leader = self.leader()
        assert leader is not None, f"guest {self.name} is not running"
        root = psutil.Process(leader)
        return [root, *root.children(recursive=True)]

    def freeze(self) -> None:
        """Every process of the guest stopped (SIGSTOP), its kernel side still
        there: sockets accept, nothing answers. A frozen host."""
        for process in self._processes():
            with contextlib.suppress(psutil.NoSuchProcess):
                process.suspend()

    def cut_power(self) -> None:
        """The power goes: PID 1 killed (its stopped processes too), no next boot."""
        leader = self.leader()
        if leader is None or self._nspawn is None:
            return
        os.kill(leader, signal.SIGKILL)
        self._nspawn.wait(timeout=60)

    def stop(self) -> None:
        if self._nspawn is not None and self._nspawn.poll() is None:
            with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
                self.run("systemctl", "poweroff", check=False, timeout=30)
            try:
                self._nspawn.wait(timeout=60)
            except subprocess.TimeoutExpired:
                leader = self.leader()
                if leader is not None:
                    os.kill(leader, signal.SIGKILL)
                self._nspawn.kill()
                self._nspawn.wait(timeout=30)
        if self._console is not None:
            self._console.close()
            self._console = None

    def console_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.console_log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def wait_for(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return
            time.sleep(0.5)
        raise AssertionError(
            f"guest {self.name}: timed out after {timeout:.0f} s waiting for {what}"
        )

    # -- the units ------------------------------------------------------------

    def show(self, unit: str, *props: str) -> dict[str, str]:
        args = [f"--property={p}" for p in props]
        out = self.run("systemctl", "show", unit, *args).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def main_pid(self, unit: str) -> int:
        return int(self.show(unit, "MainPID")["MainPID"])

    def wait_active(self, unit: str, timeout: float = 120.0) -> dict[str, str]:
        def running() -> bool:
            state = self.show(unit, "ActiveState", "SubState")
            if state["ActiveState"] == "failed":
                raise AssertionError(f"{unit} failed:\n{self.journal(unit)}")
            return state["ActiveState"] == "active" and state["SubState"] == "running"

        self.wait_for(running, timeout, f"{unit} to be active (running)")
        return self.show(unit, "MainPID", "StatusText", "NRestarts", "ActiveState")

    def journal(self, unit: str, lines: int = 60) -> str:
        done = self.run("journalctl", "-u", unit, "-b", "--no-pager", "-n", str(lines), check=False)
        return done.stdout

    def install(self, *args: str) -> subprocess.CompletedProcess[str]:
        offline = ("PIP_NO_INDEX=1", "PIP_FIND_LINKS=/wheels/deps")
        return self.run("env", *offline, "bash", "/src/deploy/install.sh", *args, timeout=600)


def _boot_guest(root: Path, name: str, binds: dict[Path, str]) -> Guest:
    (root / "etc/machine-id").write_text(uuid.uuid4().hex + "\n")
    return Guest(name=name, root=root, binds=binds)


@pytest.fixture(scope="module")
def guests(
    guest_image: Path,
    source: Path,
    wheels: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Guest]]:
    """Two guests from the image: a Spark node and the management host."""
    where = tmp_path_factory.mktemp("guests")
    binds = {source: "/src", wheels["current"].parent.parent: "/wheels"}
    started: dict[str, Guest] = {}
    with contextlib.ExitStack() as layers:
        try:
            for name in ("swnode", "swcontrol"):
                root = layers.enter_context(overlay(guest_image, where / name))
                # Known before it boots: a boot that fails is stopped all the same.
                started[name] = _boot_guest(root, name, binds)
                started[name].start()
            yield started
        finally:
            for guest in started.values():
                guest.stop()
