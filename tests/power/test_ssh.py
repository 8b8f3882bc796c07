"""The SSH banner check and the SSH soft path against a real sshd on loopback.

Each test that needs it gets its own OpenSSH ``sshd`` (``-D -e -f CONFIG``) on
a free 127.0.0.1 port with a throwaway host key, a throwaway client key and a
config in the test's tmp dir; the system's sshd config and keys are never read.
The authorized key carries a forced ``command=`` that runs a stand-in for the
host's reboot (it records the requested command and acts it out: exit, fail,
hang, or kill its own sshd session the way a host going down does).

Running as root (as CI does), sshd needs its privilege separation directory
``/run/sshd`` (created here when missing) and lets root in with a key under
``PermitRootLogin prohibit-password``. As any other user it can only log in
that same user, which is who the tests log in as.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from spark_watchdog.config.controller import LauncherSshConfig, SshDevice
from spark_watchdog.controller.serving.launcher_commands import SshRunner
from spark_watchdog.errors import Ambiguous, Refused, Unreachable
from spark_watchdog.lab.hardware.lab_sshd import use_pam
from spark_watchdog.lab.ports import free_port
from spark_watchdog.power.ssh_banner import (
    CLIENT_VERSION_LINE,
    MAX_READ_BYTES,
    BannerResult,
    _BannerCheck,
    check_ssh_banner,
    scan_banner,
)
from spark_watchdog.power.ssh_reboot import (
    SshCommand,
    SshCommandResult,
    SshReboot,
    build_ssh_reboot,
    classify,
    run_ssh_command,
    ssh_command_for,
)

pytestmark = pytest.mark.integration

SSHD = shutil.which("sshd", path=f"/usr/sbin:/usr/local/sbin:{os.defpath}")
SSH_KEYGEN = shutil.which("ssh-keygen")
SSH = shutil.which("ssh")
PRIVSEP_DIR = Path("/run/sshd")  # compiled into Debian's sshd; needed when run as root

# The host's side of the reboot: records the command, then acts it out.
STANDIN = r"""
import os, signal, sys, time

command = os.environ.get("SSH_ORIGINAL_COMMAND", "")
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "commands"), "a") as f:
    f.write(command + "\n")
if command == "reboot":
    print("the system is going down")
    sys.exit(0)
if command == "reboot-drop":
    # What a host going down does to the session: its sshd process dies.
    pid = os.getppid()
    while pid > 1:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
        if name.startswith("sshd"):
            os.kill(pid, signal.SIGKILL)
            sys.exit(0)
        with open(f"/proc/{pid}/status") as f:
            pid = int(next(line for line in f if line.startswith("PPid:")).split()[1])
    sys.exit(99)
if command == "fail":
    print("sudo: a password is required", file=sys.stderr)
    sys.exit(1)
if command == "exit255":
    sys.exit(255)
if command == "echo":
    print("hello from the host")
    sys.exit(0)
if command == "hang":
    with open(os.path.join(here, "hanging"), "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(30)
    sys.exit(0)
print(f"stand-in: unknown command {command!r}", file=sys.stderr)
sys.exit(127)
"""


def keygen(path: Path, comment: str) -> Path:
    assert SSH_KEYGEN is not None
    subprocess.run(
        [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def ssh_children() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.name() == "ssh" and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


@dataclass(frozen=True)
class Keys:
    client: Path
    stranger: Path  # a client key the host does not know
    host: Path
    other_host: Path  # a host key the known_hosts file is not about


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    if SSHD is None or SSH_KEYGEN is None or SSH is None:
        pytest.skip("needs OpenSSH: apt-get install openssh-server openssh-client")
    directory = tmp_path_factory.mktemp("ssh-keys")
    return Keys(
        client=keygen(directory / "client", "spark-watchdog test client"),
        stranger=keygen(directory / "stranger", "not authorized"),
        host=keygen(directory / "host", "test host"),
        other_host=keygen(directory / "other_host", "another host"),
    )


@dataclass
class Sshd:
    process: subprocess.Popen[bytes]
    port: int
    user: str
    directory: Path
    keys: Keys
    known_hosts: Path
    log_path: Path

    def device(self, command: str = "reboot", **overrides: Any) -> SshDevice:
        device = SshDevice(
            type="ssh",
            host="127.0.0.1",
            port=self.port,
            user=self.user,
            key_file=str(self.keys.client),
            known_hosts_file=str(self.known_hosts),
            command=command,
            connect_timeout=2.0,
        )
        return replace(device, **overrides)

    def commands_run(self) -> list[str]:
        path = self.directory / "commands"
        return path.read_text().splitlines() if path.exists() else []

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def start_sshd(directory: Path, keys: Keys) -> Sshd:
    assert SSHD is not None
    if os.geteuid() == 0 and not PRIVSEP_DIR.is_dir():
        # sshd as root chroots its pre-auth child here; systemd's unit creates it
        # (RuntimeDirectory=sshd), a fresh machine that never ran sshd has none.
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    user = pwd.getpwuid(os.geteuid()).pw_name
    standin = directory / "standin.py"
    standin.write_text(STANDIN)
    client_public = (keys.client.with_suffix(".pub")).read_text().strip()
    authorized = directory / "authorized_keys"
    authorized.write_text(f'command="{sys.executable} {standin}",restrict {client_public}\n')
    port = free_port()
    config = directory / "sshd_config"
    config.write_text(
        "\n".join(
            [
                "ListenAddress 127.0.0.1",
                f"Port {port}",
                f"HostKey {keys.host}",
                f"PidFile {directory / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                f"UsePAM {use_pam()}",
                "StrictModes no",  # tmp dirs are not the user's home with its modes
                "PermitRootLogin prohibit-password",
                "LogLevel VERBOSE",
                "",
            ]
        )
    )
    host_public = keys.host.with_suffix(".pub").read_text().split()
    known_hosts = directory / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{port} {host_public[0]} {host_public[1]}\n")
    log_path = directory / "sshd.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
        )
    server = Sshd(process, port, user, directory, keys, known_hosts, log_path)
    deadline = time.monotonic() + 10
    while True:
        if process.poll() is not None:
            pytest.fail(f"sshd exited ({process.returncode}) at start:\n{server.log()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                if sock.recv(64).startswith(b"SSH-"):
                    sock.sendall(b"SSH-2.0-test_fixture\r\n")  # keeps sshd's log quiet
                    return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"sshd did not greet on port {port} within 10 s:\n{server.log()}")
        time.sleep(0.05)


@pytest.fixture
def sshd(tmp_path: Path, keys: Keys) -> Iterator[Sshd]:
    server = start_sshd(tmp_path, keys)
    try:
        yield server
    finally:
        server.process.send_signal(signal.SIGCONT)  # a test may have frozen it
        server.process.terminate()
        try:
            server.process.wait(5)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
        hanging = tmp_path / "hanging"
        if hanging.exists():
            for pid in hanging.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)


class FakeServer:
    """A loopback TCP listener that runs ``behaviour`` on each accepted connection."""

    def __init__(self, behaviour: Callable[[socket.socket], None] | None) -> None:
        self.behaviour = behaviour
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        # No behaviour: never accept; the kernel still completes the handshake.
        self.listener.listen(8)
        self.listener.settimeout(0.05)
        self.port: int = self.listener.getsockname()[1]
        self.served = threading.Event()  # set when a behaviour has returned
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        if behaviour is not None:
            self.thread.start()

    def _serve(self) -> None:
        assert self.behaviour is not None
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                conn.settimeout(None)
                with contextlib.suppress(OSError):
                    self.behaviour(conn)
            self.served.set()

    def __enter__(self) -> FakeServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        if self.thread.is_alive():
            self.thread.join(5)
        self.listener.close()


def check(port: int, timeout: float, host: str = "127.0.0.1") -> tuple[BannerResult, float]:
    started = time.monotonic()
    result = asyncio.run(check_ssh_banner(host, port, timeout))
    return result, time.monotonic() - started


# -- banner check: real sshd ---------------------------------------------------


def test_banner_from_a_real_sshd(sshd: Sshd) -> None:
    result, elapsed = check(sshd.port, 10.0)

    assert result.outcome == "banner", result
    assert result.ok
    assert result.banner is not None and result.banner.startswith("SSH-2.0-OpenSSH")
    assert not result.banner.endswith(("\r", "\n"))
    assert result.error is None
    assert result.connect_s is not None and 0 <= result.connect_s <= result.total_s < 10.0
    assert elapsed < 10.0
    assert result.to_json()["outcome"] == "banner"
    # We said our own version line before hanging up, so sshd logs a plain
    # preauth close, not the kex_exchange_identification error a mute client gets.
    deadline = time.monotonic() + 3
    while "Connection closed by 127.0.0.1" not in sshd.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "Connection closed by 127.0.0.1" in sshd.log()
    assert "kex_exchange_identification" not in sshd.log()


def test_frozen_sshd_connects_but_gives_no_banner(sshd: Sshd) -> None:
    """The freeze signature: the kernel completes the handshake, userland is silent."""
    sshd.process.send_signal(signal.SIGSTOP)
    try:
        result, elapsed = check(sshd.port, 1.0)
    finally:
        sshd.process.send_signal(signal.SIGCONT)

    assert result.outcome == "no_banner", result
    assert not result.ok
    assert result.connect_s is not None and result.connect_s < 0.5
    assert result.banner is None
    assert result.error is not None and "no SSH banner" in result.error
    assert 0.9 <= elapsed < 5.0
    thawed, _ = check(sshd.port, 10.0)
    assert thawed.outcome == "banner", thawed


# -- banner check: other listeners ---------------------------------------------


def test_listener_that_never_speaks_is_no_banner() -> None:
    with FakeServer(None) as server:
        result, elapsed = check(server.port, 0.5)
    assert result.outcome == "no_banner", result
    assert result.connect_s is not None
    assert result.total_s >= 0.45 and elapsed < 1.5


def test_listener_that_closes_at_once_is_closed() -> None:
    with FakeServer(lambda conn: None) as server:
        result, elapsed = check(server.port, 10.0)
    assert result.outcome == "closed", result
    assert result.connect_s is not None
    assert elapsed < 5.0  # at once, not at the deadline


def test_listener_that_resets_is_closed() -> None:
    def reset(conn: socket.socket) -> None:
        # Linger 0: close sends RST instead of FIN.
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    with FakeServer(reset) as server:
        result, elapsed = check(server.port, 10.0)
    assert result.outcome == "closed", result
    assert elapsed < 5.0  # at once, not at the deadline


@pytest.mark.parametrize(
    ("sent", "stays_open"),
    [
        (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", False),
        (b"\x00\xff\x10\x02binary", True),
        (b"SSH-banana\r\n", True),
        (b"SSH-2.0-" + b"x" * 300 + b"\r\n", True),
    ],
    ids=["http-then-close", "binary", "bad-version-line", "version-line-too-long"],
)
def test_listener_that_sends_garbage(sent: bytes, stays_open: bool) -> None:
    def speak(conn: socket.socket) -> None:
        conn.sendall(sent)
        if stays_open:
            conn.settimeout(3)
            conn.recv(100)  # until the checker hangs up

    with FakeServer(speak) as server:
        result, elapsed = check(server.port, 10.0)
    assert result.outcome == "garbage", result
    assert result.banner is None
    assert result.error is not None
    # Decided from the bytes, not by waiting out the timeout.
    assert elapsed < 5.0


def test_text_without_a_version_line_is_garbage_at_the_timeout() -> None:
    def chat(conn: socket.socket) -> None:
        conn.sendall(b"hello, this is not sshd\r\n")
        conn.settimeout(3)
        conn.recv(100)

    with FakeServer(chat) as server:
        result, elapsed = check(server.port, 0.5)
    assert result.outcome == "garbage", result
    assert "no SSH version line" in (result.error or "")
    assert elapsed < 1.5


def test_endless_text_is_cut_at_the_read_limit() -> None:
    def flood(conn: socket.socket) -> None:
        line = b"x" * 98 + b"\r\n"
        for _ in range(MAX_READ_BYTES // len(line) + 10):
            conn.sendall(line)
        conn.settimeout(3)
        conn.recv(100)

    with FakeServer(flood) as server:
        result, elapsed = check(server.port, 10.0)
    assert result.outcome == "garbage", result
    assert f"{MAX_READ_BYTES} bytes" in (result.error or "")
    assert elapsed < 5.0  # at the limit, not at the deadline


def test_lines_before_the_version_line_and_split_packets() -> None:
    """RFC 4253 §4.2 lets a server send text first; TCP may split the version line."""
    received = bytearray()

    def greet(conn: socket.socket) -> None:
        conn.sendall(b"Authorized use only.\r\nWelcome\r\nSSH-2.0-Fake")
        time.sleep(0.1)
        conn.sendall(b"_1.0 some comment\r\n")
        conn.settimeout(2)
        while chunk := conn.recv(100):
            received.extend(chunk)

    with FakeServer(greet) as server:
        result, _ = check(server.port, 2.0)
        assert server.served.wait(3)
    assert result.outcome == "banner", result
    assert result.banner == "SSH-2.0-Fake_1.0 some comment"
    assert bytes(received) == CLIENT_VERSION_LINE


def test_closed_port_is_refused() -> None:
    result, elapsed = check(free_port(), 10.0)
    assert result.outcome == "refused", result
    assert result.connect_s is None
    assert elapsed < 5.0  # at once, not at the deadline


def test_full_backlog_is_connect_timeout() -> None:
    """A listener whose accept queue is full drops SYNs (Linux): no handshake at all."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    filler = socket.create_connection(listener.getsockname(), timeout=1)
    try:
        result, elapsed = check(listener.getsockname()[1], 0.5)
    finally:
        filler.close()
        listener.close()
    assert result.outcome == "connect_timeout", result
    assert result.connect_s is None
    assert elapsed < 1.5


def test_unresolvable_name_is_its_own_outcome() -> None:
    # RFC 6761: .invalid never resolves. Not silence: the controller cannot look.
    result, elapsed = check(22, 2.0, host="no-such-node.invalid")
    assert result.outcome == "unresolvable", result
    assert result.connect_s is None
    assert elapsed < 3.0


def test_the_controllers_own_dead_network_is_not_the_hosts_silence() -> None:
    """ENETUNREACH and friends come from the controller's side: it cannot look.
    EHOSTUNREACH (no answer on the host's own segment) is a dead host: silence."""
    probe = _BannerCheck("192.0.2.1", 22, 1.0)
    own = probe._connect_failure([OSError(errno.ENETUNREACH, "Network is unreachable")])
    assert own.outcome == "no_network", own
    host = probe._connect_failure([OSError(errno.EHOSTUNREACH, "No route to host")])
    assert host.outcome == "unreachable", host


def test_scan_banner_rules() -> None:
    assert scan_banner(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n") == (
        "banner",
        "SSH-2.0-OpenSSH_9.2p1 Debian-2",
    )
    assert scan_banner(b"SSH-1.99-Cisco-1.25\n") == ("banner", "SSH-1.99-Cisco-1.25")
    assert scan_banner(b"SSH-2.0-Open") is None  # not finished yet
    assert scan_banner(b"pre-banner text\r\n") is None
    for garbage in (b"SSH-2.0-\r\n", b"\xff\xfe\r\n", b"text\x00", b"SSH-" + b"9" * 300):
        verdict = scan_banner(garbage)
        assert verdict is not None and verdict[0] == "garbage", garbage


def test_banner_check_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="port"):
        asyncio.run(check_ssh_banner("127.0.0.1", 0))
    with pytest.raises(ValueError, match="timeout"):
        asyncio.run(check_ssh_banner("127.0.0.1", 22, 0))


# -- the soft path: reboot over SSH ------------------------------------------


def test_reboot_is_sent_through_the_forced_command(sshd: Sshd) -> None:
    reboot = build_ssh_reboot(sshd.device("reboot"))
    result = asyncio.run(reboot.reboot())

    assert result.outcome == "sent"
    assert result.connection_dropped is False
    assert result.exit_status == 0
    assert result.device == f"ssh {sshd.user}@127.0.0.1:{sshd.port}"
    assert result.to_json()["verified"] is False
    assert sshd.commands_run() == ["reboot"]


def test_connection_dropped_by_the_rebooting_host_is_sent(sshd: Sshd) -> None:
    result = asyncio.run(build_ssh_reboot(sshd.device("reboot-drop")).reboot())

    assert result.outcome == "sent"
    assert result.connection_dropped is True
    assert result.exit_status is None
    assert sshd.commands_run() == ["reboot-drop"]


def test_a_dropped_connection_is_ambiguous_for_other_commands(sshd: Sshd) -> None:
    result = asyncio.run(run_ssh_command(sshd.device(), "reboot-drop", timeout=10))

    assert result.outcome == "dropped", result
    assert result.command_sent is True
    with pytest.raises(Ambiguous):
        result.raise_for_outcome("agent restart")


def test_run_ssh_command_returns_the_output(sshd: Sshd) -> None:
    result = asyncio.run(run_ssh_command(sshd.device(), "echo", timeout=10))

    assert result.ok, result
    assert result.outcome == "exited" and result.exit_status == 0
    assert result.stdout == "hello from the host\n"
    assert "debug1" not in result.stderr
    result.raise_for_outcome("agent restart")  # does not raise


def test_failing_reboot_command_is_refused(sshd: Sshd) -> None:
    with pytest.raises(Refused) as caught:
        asyncio.run(build_ssh_reboot(sshd.device("fail")).reboot())
    assert "exited with status 1" in caught.value.message
    assert "sudo: a password is required" in caught.value.message
    assert sshd.commands_run() == ["fail"]


def test_remote_exit_255_is_not_mistaken_for_a_drop(sshd: Sshd) -> None:
    """ssh exits 255 both for its own errors and for a command that exits 255."""
    with pytest.raises(Refused) as caught:
        asyncio.run(build_ssh_reboot(sshd.device("exit255")).reboot())
    assert "exited with status 255" in caught.value.message


def classified(stderr: str, returncode: int | None, *, timed_out: bool = False) -> SshCommandResult:
    return classify(
        target="root@h:22",
        command="reboot",
        returncode=returncode,
        timed_out=timed_out,
        timeout=5.0,
        elapsed_s=1.0,
        stdout="",
        stderr=stderr,
    )


def test_classify_without_debug_output_cannot_say_not_sent() -> None:
    """If ssh printed no -v lines, a timeout may have followed the command: Ambiguous."""
    result = classified("", None, timed_out=True)
    assert result.outcome == "timeout" and result.command_sent is None
    with pytest.raises(Ambiguous):
        result.raise_for_outcome("ssh h")


def test_classify_remote_killed_by_signal_is_a_drop() -> None:
    stderr = (
        "debug1: Connection established.\n"
        'Authenticated to h ([10.0.0.5]:22) using "publickey".\n'
        "debug1: Sending command: reboot\n"
        "debug1: client_input_channel_req: channel 0 rtype exit-signal reply 0\n"
    )
    result = classified(stderr, 255)
    assert result.outcome == "dropped", result
    result.raise_for_outcome("ssh h", drop_means_sent=True)  # sent: does not raise


def test_classify_negotiation_failure_is_refused() -> None:
    stderr = (
        "debug1: Connecting to h [10.0.0.5] port 22.\n"
        "debug1: Connection established.\n"
        "Unable to negotiate with 10.0.0.5 port 22: no matching host key type found.\n"
    )
    result = classified(stderr, 255)
    assert result.outcome == "failed" and result.command_sent is False
    with pytest.raises(Refused, match="no matching host key type"):
        result.raise_for_outcome("ssh h")


def test_wrong_key_is_refused(sshd: Sshd) -> None:
    device = sshd.device(key_file=str(sshd.keys.stranger))
    with pytest.raises(Refused) as caught:
        asyncio.run(build_ssh_reboot(device).reboot())
    assert "refused the key" in caught.value.message
    assert "Permission denied (publickey)" in caught.value.message
    assert sshd.commands_run() == []


def test_missing_key_file_is_refused_without_trying_other_keys(sshd: Sshd) -> None:
    device = sshd.device(key_file=str(sshd.directory / "no-such-key"))
    with pytest.raises(Refused) as caught:
        asyncio.run(build_ssh_reboot(device).reboot())
    assert "no-such-key" in caught.value.message
    assert sshd.commands_run() == []


def test_unknown_host_key_is_refused_and_not_learned(sshd: Sshd) -> None:
    empty = sshd.directory / "empty_known_hosts"
    empty.write_text("")
    before = empty.stat()
    with pytest.raises(Refused) as caught:
        asyncio.run(build_ssh_reboot(sshd.device(known_hosts_file=str(empty))).reboot())
    assert "not in the known_hosts file" in caught.value.message
    assert empty.read_text() == ""
    assert empty.stat().st_mtime_ns == before.st_mtime_ns
    assert sshd.commands_run() == []

    missing = sshd.directory / "missing_known_hosts"
    with pytest.raises(Refused):
        asyncio.run(build_ssh_reboot(sshd.device(known_hosts_file=str(missing))).reboot())
    assert not missing.exists()


def test_changed_host_key_is_refused(sshd: Sshd) -> None:
    other = sshd.keys.other_host.with_suffix(".pub").read_text().split()
    changed = sshd.directory / "changed_known_hosts"
    text = f"[127.0.0.1]:{sshd.port} {other[0]} {other[1]}\n"
    changed.write_text(text)
    with pytest.raises(Refused) as caught:
        asyncio.run(build_ssh_reboot(sshd.device(known_hosts_file=str(changed))).reboot())
    assert "does NOT match" in caught.value.message
    assert changed.read_text() == text
    assert sshd.commands_run() == []


def test_closed_port_is_unreachable(keys: Keys, tmp_path: Path) -> None:
    device = SshDevice(
        type="ssh",
        host="127.0.0.1",
        port=free_port(),
        user="root",
        key_file=str(keys.client),
        known_hosts_file=str(tmp_path / "known_hosts"),
        connect_timeout=20.0,
    )
    started = time.monotonic()
    with pytest.raises(Unreachable) as caught:
        asyncio.run(build_ssh_reboot(device).reboot())
    assert "Connection refused" in caught.value.message
    assert "nothing was sent" in caught.value.message
    assert time.monotonic() - started < 15.0  # refused at once, not timed out


def test_frozen_host_is_unreachable_for_the_soft_path(sshd: Sshd) -> None:
    """ssh's ConnectTimeout covers the banner exchange: a frozen sshd means nothing sent."""
    sshd.process.send_signal(signal.SIGSTOP)
    started = time.monotonic()
    try:
        with pytest.raises(Unreachable) as caught:
            asyncio.run(build_ssh_reboot(sshd.device(connect_timeout=1.0)).reboot())
    finally:
        sshd.process.send_signal(signal.SIGCONT)
    assert "banner exchange" in caught.value.message
    assert time.monotonic() - started < 10.0  # ssh's 1 s, long before our 16 s deadline
    assert sshd.commands_run() == []


def test_our_deadline_before_the_session_is_unreachable(sshd: Sshd) -> None:
    """Killed by our own deadline before authenticating: certainly not sent."""
    sshd.process.send_signal(signal.SIGSTOP)
    try:
        reboot = build_ssh_reboot(sshd.device(connect_timeout=10.0), timeout=1.0)
        with pytest.raises(Unreachable) as caught:
            asyncio.run(reboot.reboot())
    finally:
        sshd.process.send_signal(signal.SIGCONT)
    assert "nothing was sent" in caught.value.message
    assert ssh_children() == []


def test_timeout_after_sending_kills_ssh_and_is_ambiguous(sshd: Sshd) -> None:
    # The deadline covers the session's set-up too; on a loaded CI machine that
    # alone has taken over 1.5 s, so it is generous (the command hangs 30 s).
    reboot = build_ssh_reboot(sshd.device("hang"), timeout=8.0)
    started = time.monotonic()
    with pytest.raises(Ambiguous) as caught:
        asyncio.run(reboot.reboot())
    elapsed = time.monotonic() - started

    assert "was sent but did not finish within 8s;" in caught.value.message
    assert 7.9 <= elapsed < 20.0
    assert ssh_children() == []
    assert sshd.commands_run() == ["hang"]


def test_cancel_kills_ssh_and_argv_holds_no_key_material(sshd: Sshd) -> None:
    ssh = ssh_command_for(sshd.device())
    key_text = sshd.keys.client.read_text()
    key_body = [line for line in key_text.splitlines() if line and "PRIVATE KEY" not in line]
    seen: dict[str, Any] = {}

    async def scenario() -> None:
        task = asyncio.create_task(ssh.run("hang", 20))
        hanging = sshd.directory / "hanging"
        deadline = time.monotonic() + 10
        while not hanging.exists():
            assert time.monotonic() < deadline, "the hang command never started"
            await asyncio.sleep(0.05)
        (child,) = ssh_children()
        seen["pid"] = child.pid
        seen["cmdline"] = child.cmdline()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())

    assert not psutil.pid_exists(seen["pid"]) or (
        psutil.Process(seen["pid"]).status() == psutil.STATUS_ZOMBIE
    )
    cmdline = seen["cmdline"]
    assert f'IdentityFile="{sshd.keys.client}"' in cmdline
    joined = "\n".join(cmdline)
    assert key_text.strip() not in joined
    for line in key_body:
        assert line not in joined
    assert "BatchMode=yes" in cmdline and "StrictHostKeyChecking=yes" in cmdline


def test_argv_shape() -> None:
    ssh = SshCommand(
        "10.0.0.5",
        user="root",
        key_file="/etc/spark-watchdog/ssh key%1",
        known_hosts_file="/etc/spark-watchdog/known_hosts",
        port=2222,
        connect_timeout=2.5,
    )
    argv = ssh.argv("sudo systemctl reboot")
    assert argv[:3] == ["ssh", "-F", "none"]
    assert argv[-2:] == ["root@10.0.0.5", "sudo systemctl reboot"]
    assert argv[argv.index("-p") + 1] == "2222"
    options = [argv[i + 1] for i, arg in enumerate(argv) if arg == "-o"]
    assert "ConnectTimeout=3" in options
    assert 'IdentityFile="/etc/spark-watchdog/ssh key%%1"' in options
    assert "-i" not in argv
    for forbidden in ("StrictHostKeyChecking=no", "StrictHostKeyChecking=accept-new"):
        assert forbidden not in options
    with pytest.raises(ValueError, match="host"):
        SshCommand("-oProxyCommand=x", user="root", key_file="/k", known_hosts_file="/h")
    with pytest.raises(ValueError, match="key_file"):
        SshCommand("h", user="root", key_file="relative", known_hosts_file="/h")


def test_missing_ssh_client_is_reported_not_raised(tmp_path: Path) -> None:
    ssh = SshCommand(
        "127.0.0.1",
        user="root",
        key_file=str(tmp_path / "key"),
        known_hosts_file=str(tmp_path / "known_hosts"),
        ssh_binary=str(tmp_path / "no-ssh-here"),
    )
    result = asyncio.run(ssh.run("reboot", 5))
    assert result.outcome == "failed" and result.command_sent is False
    with pytest.raises(Refused, match="openssh-client"):
        result.raise_for_outcome("ssh node")


def test_key_path_with_space_and_percent(sshd: Sshd) -> None:
    odd = sshd.directory / "odd dir %h"
    odd.mkdir()
    key = odd / "client key"
    shutil.copy(sshd.keys.client, key)
    key.chmod(0o600)
    result = asyncio.run(build_ssh_reboot(sshd.device(key_file=str(key))).reboot())
    assert result.outcome == "sent"


def test_credential_names_resolve_in_the_credentials_directory(sshd: Sshd) -> None:
    credentials = sshd.directory / "credentials"
    credentials.mkdir()
    shutil.copy(sshd.keys.client, credentials / "node-ssh-key")
    (credentials / "node-ssh-key").chmod(0o600)
    shutil.copy(sshd.known_hosts, credentials / "node-known-hosts")
    device = sshd.device(key_file="node-ssh-key", known_hosts_file="node-known-hosts")
    reboot = build_ssh_reboot(device, environ={"CREDENTIALS_DIRECTORY": str(credentials)})
    assert isinstance(reboot, SshReboot)
    assert reboot.ssh.key_file == str(credentials / "node-ssh-key")
    assert asyncio.run(reboot.reboot()).outcome == "sent"


def test_the_forced_reboot_says_honestly_whether_it_left(sshd: Sshd) -> None:
    """The controller's forced reboot (controller/io.py) against the real sshd:
    sent when the command ran or the session died with the host, not sent when
    it failed or could not connect, unknown when it hung after leaving."""
    from spark_watchdog.controller.io import forced_reboot_over_ssh

    def attempt(**overrides: Any) -> Any:
        return asyncio.run(forced_reboot_over_ssh(sshd.device(**overrides)))

    assert attempt(forced_command="reboot").sent is True
    assert attempt(forced_command="reboot-drop").sent is True
    failed = attempt(forced_command="fail")
    assert failed.sent is False and "failed" in failed.detail
    assert attempt(forced_command="reboot", port=free_port()).sent is False
    assert attempt(forced_command="reboot", key_file=str(sshd.keys.stranger)).sent is False
    assert sshd.commands_run() == ["reboot", "reboot-drop", "fail"]
    # The default command is sysrq's emergency restart, not a reboot that waits on drivers.
    assert "sysrq-trigger" in sshd.device().forced_command


# -- the cluster launcher's commands over SSH (controller/serving/launcher_commands.py) --


def _launcher_runner(server: Sshd, port: int | None = None) -> SshRunner:
    ssh = LauncherSshConfig(
        user=server.user,
        key_file=str(server.keys.client),
        known_hosts_file=str(server.known_hosts),
        connect_timeout=10.0,  # sshd forks a session per connection: slow on a loaded machine
    )
    return SshRunner("127.0.0.1", port or server.port, ssh, working_directory="/srv/my cluster")


def test_a_launcher_argv_reaches_the_node_word_for_word_with_its_environment(
    sshd: Sshd,
) -> None:
    argv = ["./launch-cluster.sh", "start", "a b", "$(touch /tmp/owned)", "--api-key", "sk-9"]
    environment = {"SPARK_WATCHDOG_PROFILE": "safe", "SPARK_WATCHDOG_VLLM_ARGS": "--x '{}'"}

    result = asyncio.run(_launcher_runner(sshd).run("start", argv, environment, 10.0))

    line = sshd.commands_run()[-1]
    # The remote shell splits the line back into exactly these words: nothing expands.
    cd, _, command = line.partition(" && ")
    assert shlex.split(cd) == ["cd", "/srv/my cluster"]
    assert shlex.split(command) == [
        "timeout",
        "-k",
        "10",
        "10",
        "env",
        "SPARK_WATCHDOG_PROFILE=safe",
        "SPARK_WATCHDOG_VLLM_ARGS=--x '{}'",
        *argv,
    ]
    # The stand-in knows no such command: it exits 127, as a shell would.
    assert result.end == "exited" and result.exit_code == 127 and not result.ok
    assert "unknown command" in result.output
    assert "sk-9" not in result.output and "sk-9" not in " ".join(result.argv)
    assert result.where == f"{sshd.user}@127.0.0.1:{sshd.port}"


def test_a_launcher_node_without_sshd_ran_nothing() -> None:
    ssh = LauncherSshConfig(
        user="root", key_file="/nonexistent/key", known_hosts_file="/nonexistent/kh"
    )
    runner = SshRunner("127.0.0.1", free_port(), ssh)

    result = asyncio.run(runner.run("stop", ["./launch-cluster.sh", "stop"], {}, 10.0))

    assert result.end == "unreachable" and result.nothing_ran, result
