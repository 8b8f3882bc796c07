"""deploy/install.sh, run for real into a scratch root: a venv per release
with pip, the units, the config, the credentials drop-in; an upgrade from a
wheel that keeps the config and the previous release; uninstall and purge."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "deploy" / "install.sh"
# The program the shipped example's exec power path runs (config/controller.example.yaml).
RELAY_BOARD = "/usr/local/bin/relay-board"

pytestmark = pytest.mark.integration


def _python() -> str:
    """The system interpreter (it has venv and the distro's site packages)."""
    for candidate in ("/usr/bin/python3", shutil.which("python3")):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.fail("no python3 to create release environments with")


def _install(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHON": _python()}
    return subprocess.run(
        ["bash", str(INSTALL), *args, "--root", str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


def _releases(root: Path) -> list[Path]:
    return sorted((root / "opt/spark-watchdog/releases").iterdir())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(REPO)],
        check=True,
        timeout=600,
    )
    (found,) = out.glob("spark_watchdog-*.whl")
    return found


def test_the_wheel_carries_the_operator_s_page(wheel: Path) -> None:
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    page = {
        f"spark_watchdog/controller/page/web/{n}" for n in ("index.html", "page.css", "page.js")
    }
    assert page <= names, sorted(page - names)


def test_controller_install_upgrade_uninstall(tmp_path: Path, wheel: Path) -> None:
    root = tmp_path / "root"
    credentials = root / "etc/spark-watchdog/credentials"
    credentials.mkdir(parents=True)
    secret = credentials / "pdu-community"
    secret.write_text("private-community\n")
    secret.chmod(0o600)

    first = _install("controller", "--from", str(REPO), root=root)
    assert first.returncode == 0, first.stderr
    entry = root / "opt/spark-watchdog/bin/spark-watchdog"
    version = subprocess.run([str(entry), "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("spark-watchdog ")
    link = root / "usr/local/bin/spark-watchdog"
    assert link.is_symlink() and str(link.readlink()) == "/opt/spark-watchdog/bin/spark-watchdog"
    completion = root / "usr/share/bash-completion/completions/spark-watchdog"
    assert "complete -F _spark_watchdog spark-watchdog" in completion.read_text()
    assert (root / "usr/local/share/man/man1/spark-watchdog.1").read_text().startswith(".TH ")
    unit = root / "etc/systemd/system/spark-watchdog-controller.service"
    assert "ExecStart=/opt/spark-watchdog/bin/spark-watchdog controller" in unit.read_text()
    conf = root / "etc/systemd/system/spark-watchdog-controller.service.d/credentials.conf"
    assert (
        "LoadCredential=pdu-community:/etc/spark-watchdog/credentials/pdu-community"
        in conf.read_text()
    )
    assert "private-community" not in first.stderr + conf.read_text()
    # The state directory of a controller on a Spark is that role's alone.
    assert not (conf.parent / "colocated.conf").exists()
    config = root / "etc/spark-watchdog/controller.yaml"
    assert config.read_text() == (REPO / "config/controller.example.yaml").read_text()
    # The shipped example validates with the installed program, once the relay
    # board its exec path names is there: until then, --check names only that.
    check = subprocess.run(
        [str(entry), "controller", "--config", str(config), "--check"],
        capture_output=True,
        text=True,
    )
    if not Path(RELAY_BOARD).exists():
        problems = [line for line in check.stderr.splitlines() if line.startswith("  ")]
        assert check.returncode == 2 and len(problems) == 3, check.stderr
        assert all(f'"{RELAY_BOARD}" does not exist' in line for line in problems), problems
        relay = root / RELAY_BOARD.lstrip("/")
        relay.write_text('#!/bin/sh\necho \'{"state": "on"}\'\n')
        relay.chmod(0o755)
        config.write_text(config.read_text().replace(RELAY_BOARD, str(relay)))
        check = subprocess.run(
            [str(entry), "controller", "--config", str(config), "--check"],
            capture_output=True,
            text=True,
        )
    assert check.returncode == 0, check.stdout + check.stderr
    # The installed unit passes systemd's verify (pointed at the scratch root's program).
    if shutil.which("systemd-analyze"):
        verifiable = tmp_path / unit.name
        verifiable.write_text(
            unit.read_text().replace("/opt/spark-watchdog", f"{root}/opt/spark-watchdog")
        )
        verify = subprocess.run(
            ["systemd-analyze", "verify", "--man=no", str(verifiable)],
            capture_output=True,
            text=True,
        )
        assert verify.returncode == 0, verify.stderr
    first_release = (root / "opt/spark-watchdog/bin").resolve().parent

    # Upgrade from a wheel: a new release, the link flipped, the edited config kept.
    config.write_text(config.read_text() + "# edited by the operator\n")
    second = _install("controller", "--from", str(wheel), root=root)
    assert second.returncode == 0, second.stderr
    current = (root / "opt/spark-watchdog/bin").resolve().parent
    assert current != first_release
    assert _releases(root) == sorted([first_release, current])  # the previous one stays
    assert config.read_text().endswith("# edited by the operator\n")
    assert subprocess.run([str(entry), "--version"], capture_output=True).returncode == 0

    # Uninstall keeps config and history; --purge removes them.
    history = root / "var/lib/spark-watchdog/history.db"
    # A controller on a Spark: its own state directory (the colocated drop-in),
    # where systemd keeps a dynamic user's (private/) behind the link.
    kept = root / "var/lib/private/spark-watchdog-controller/history.db"
    for path in (history, kept):
        path.parent.mkdir(parents=True)
        path.write_bytes(b"")
    (root / "var/lib/spark-watchdog-controller").symlink_to("private/spark-watchdog-controller")
    removed = _install("uninstall", root=root)
    assert removed.returncode == 0, removed.stderr
    assert not unit.exists() and not conf.exists()
    assert not (root / "opt/spark-watchdog").exists()
    assert not link.is_symlink() and not completion.exists()
    assert config.exists() and history.exists() and kept.exists()
    purged = _install("uninstall", "--purge", root=root)
    assert purged.returncode == 0, purged.stderr
    assert not config.exists() and not history.exists()
    assert not (root / "var/lib/private/spark-watchdog-controller").exists()
    assert not (root / "var/lib/spark-watchdog-controller").is_symlink()


def test_node_install_with_the_serving_dropin(tmp_path: Path, wheel: Path) -> None:
    root = tmp_path / "root"
    result = _install("node", "--serving", "--from", str(wheel), "--prefix", "/opt/sw", root=root)
    assert result.returncode == 0, result.stderr
    unit = root / "etc/systemd/system/spark-watchdog-agent.service"
    assert "ExecStart=/opt/sw/bin/spark-watchdog agent" in unit.read_text()
    dropin = root / "etc/systemd/system/spark-watchdog-agent.service.d/serving.conf"
    assert "MemoryDenyWriteExecute=no" in dropin.read_text()
    assert (root / "etc/spark-watchdog/agent.yaml").exists()
    assert (root / "opt/sw/bin/spark-watchdog").exists()
    # No credentials yet: no drop-in that would name a missing file.
    assert not (unit.parent / "spark-watchdog-agent.service.d/credentials.conf").exists()
    assert "no credentials yet" in result.stderr


def test_node_install_with_the_docker_dropin_replaces_the_serving_one(
    tmp_path: Path, wheel: Path
) -> None:
    root = tmp_path / "root"
    first = _install("node", "--serving", "--from", str(wheel), "--no-start", root=root)
    assert first.returncode == 0, first.stderr

    again = _install("node", "--serving-docker", "--from", str(wheel), "--no-start", root=root)

    assert again.returncode == 0, again.stderr
    dropins = root / "etc/systemd/system/spark-watchdog-agent.service.d"
    assert (
        "SupplementaryGroups=systemd-journal video docker" in (dropins / "docker.conf").read_text()
    )
    assert not (dropins / "serving.conf").exists()
    assert "installed the docker drop-in" in again.stderr


# Two Sparks and their plugs, one controller on each, as in
# docs/install.md, "Two Sparks and a smart plug, no other machine".
# The plugs' passwords are credential names. This host is spark-2 (a
# controller on a Spark must have one of its node's addresses).
COLOCATED_CONFIG = """\
nodes:
  - name: spark-1
    agent: http://192.168.1.11:9720
    power: [{type: shelly, url: "http://192.168.1.31", user: admin, password_file: plug-1}]
  - name: spark-2
    agent: http://127.0.0.1:9720
    power: [{type: shelly, url: "http://192.168.1.32", user: admin, password_file: plug-2}]
listen: {address: 0.0.0.0, port: 9721}
history: /var/lib/spark-watchdog/history.db
witness: [tcp://192.168.1.1:53]
colocated:
  controllers:
    - node: spark-1
      urls: [http://192.168.1.11:9721, http://10.10.0.1:9721]
    - node: spark-2
"""


def test_colocated_installs_agent_and_controller_on_one_spark(tmp_path: Path, wheel: Path) -> None:
    root = tmp_path / "root"
    credentials = root / "etc/spark-watchdog/credentials"
    credentials.mkdir(parents=True)
    (credentials / "plug-1").write_text("plug-password\n")
    units = root / "etc/systemd/system"
    config = root / "etc/spark-watchdog/controller.yaml"

    first = _install("colocated", "--serving", "--from", str(wheel), root=root)

    assert first.returncode == 0, first.stderr
    for unit in ("spark-watchdog-agent.service", "spark-watchdog-controller.service"):
        assert "ExecStart=/opt/spark-watchdog/bin/spark-watchdog " in (units / unit).read_text()
        conf = units / f"{unit}.d/credentials.conf"
        assert "LoadCredential=plug-1:/etc/spark-watchdog/credentials/plug-1" in conf.read_text()
    assert (units / "spark-watchdog-agent.service.d/serving.conf").exists()
    colocated = units / "spark-watchdog-controller.service.d/colocated.conf"
    assert (
        colocated.read_bytes()
        == (REPO / "systemd/spark-watchdog-controller.service.d/colocated.conf").read_bytes()
    )
    # No config is invented: the examples, where there was none, and nothing started.
    assert config.read_text() == (REPO / "config/controller.example.yaml").read_text()
    agent = root / "etc/spark-watchdog/agent.yaml"
    assert agent.read_text() == (REPO / "config/agent.example.yaml").read_text()
    assert "not started: agent.yaml controller.yaml came from the examples" in first.stderr
    assert "history: /var/lib/spark-watchdog-controller/history.db" in first.stderr
    assert "sudo deploy/install.sh colocated --serving --no-start" in first.stderr
    assert ": place N of M" in first.stderr
    release = (root / "opt/spark-watchdog/bin").resolve()

    # The example's controller has no colocated: block; run again, it is refused
    # before anything changes, with the fix named.
    refused = _install("colocated", "--from", str(wheel), root=root)

    assert refused.returncode == 2
    assert "controller.yaml has no colocated: block" in refused.stderr
    assert "nothing was changed" in refused.stderr and "step 4" in refused.stderr
    assert (root / "opt/spark-watchdog/bin").resolve() == release
    assert len(_releases(root)) == 1

    # With the order written in, it installs; a history left in the agent's
    # state directory is named.
    config.write_text(COLOCATED_CONFIG)
    again = _install("colocated", "--from", str(wheel), root=root)

    assert again.returncode == 0, again.stderr
    assert "history in /var/lib/spark-watchdog, the agent's state" in again.stderr
    assert config.read_text() == COLOCATED_CONFIG
    assert len(_releases(root)) == 2
    entry = root / "opt/spark-watchdog/bin/spark-watchdog"
    check = subprocess.run(
        [str(entry), "controller", "--config", str(config), "--check", "--node", "spark-2"],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    assert "runs on spark-2: place 2 of 2" in check.stdout


def test_a_controller_install_does_not_ask_for_colocated(tmp_path: Path, wheel: Path) -> None:
    """A management host's config has no colocated: and needs none."""
    root = tmp_path / "root"
    config = root / "etc/spark-watchdog/controller.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(COLOCATED_CONFIG.split("colocated:")[0])
    result = _install("controller", "--from", str(wheel), "--no-start", root=root)
    assert result.returncode == 0, result.stderr
    assert not (root / "etc/systemd/system/spark-watchdog-agent.service").exists()
    assert "place N of M" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["frobnicate"], "unknown argument 'frobnicate'"),
        (["node", "--serving", "--serving-docker"], "exclude each other"),
        (["controller", "--serving-docker"], "--serving-docker applies to 'node' and 'colocated'"),
        ([], "say what to install"),
        (["controller", "--serving"], "--serving applies to 'node' and 'colocated' only"),
        (["uninstall", "--serving"], "--serving applies to 'node' and 'colocated' only"),
        (["node", "--prefix", "relative"], "--prefix must be an absolute path"),
        (["node", "--from", "/nonexistent.whl"], "/nonexistent.whl: no such wheel"),
        (["node", "--from", "/tmp"], "not a wheel and not a source checkout"),
    ],
)
def test_bad_arguments_are_named(tmp_path: Path, args: list[str], message: str) -> None:
    result = _install(*args, root=tmp_path / "root")
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "root/opt").exists()


def test_a_checkout_installs_its_own_files_not_a_stale_build(tmp_path: Path) -> None:
    """setuptools reuses a checkout's build/: a module removed since must not
    come back in the release."""
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True, timeout=60
    ).stdout.decode()
    checkout = tmp_path / "checkout"
    for name in filter(None, listed.split("\0")):
        if (REPO / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, checkout / name)
    stale = checkout / "build/lib/spark_watchdog/lab/vllm_standin.py"
    stale.parent.mkdir(parents=True)
    stale.write_text("raise SystemExit('a module removed from the checkout')\n")
    root = tmp_path / "root"
    result = _install("node", "--from", str(checkout), root=root)
    assert result.returncode == 0, result.stderr
    (release,) = _releases(root)
    (package,) = release.glob("lib/python3*/site-packages/spark_watchdog")
    assert (package / "lab/hardware/vllm_standin.py").exists()
    assert not (package / "lab/vllm_standin.py").exists(), "the stale build/ reached the release"
    assert stale.exists(), "the checkout itself is left as it was"
