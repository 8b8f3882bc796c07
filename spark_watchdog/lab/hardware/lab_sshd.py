"""A real OpenSSH sshd on each lab host, for the controller's forced reboot.

Each simulated host runs ``sshd -D`` in its own process tree (a freeze stops
it, a power cut kills it, like the rest of the host), on the node's address
and a port of its own; the banner stand-in keeps the node's SSH port for the
banner checks. The controller logs in with a throwaway client key the lab
made and trusts only the host key the lab wrote into its known_hosts file:
the real client path (``controller/io.py``), the real server.

The authorized key carries a forced command: this module with ``--request``.
A reboot command (the sysrq restart, or any ``reboot``) leaves a
``reboot-request`` file in the node's directory, which the lab acts out as a
forced reboot: the host drops at once (its ports go dark) and boots again with
a new boot id. A ``halt`` command leaves the same file, acted out as a clean
shutdown after which the host stays down until its outlet is cycled.
Any other command is refused (exit 1): the lab's agent is not restarted over
SSH.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SSHD = shutil.which("sshd", path=f"/usr/sbin:/usr/local/sbin:{os.defpath}")
SSH_KEYGEN = shutil.which("ssh-keygen")
SSH = shutil.which("ssh")
PRIVSEP_DIR = Path("/run/sshd")  # compiled into Debian's sshd; needed when run as root
CONFIG = "sshd_config"
REQUEST = "reboot-request"


def unavailable() -> str | None:
    """Why the lab cannot run sshd here, or None."""
    missing = [n for n, p in (("sshd", SSHD), ("ssh-keygen", SSH_KEYGEN), ("ssh", SSH)) if not p]
    if missing:
        return f"no {', '.join(missing)}: apt-get install openssh-server openssh-client"
    return None


@dataclass(frozen=True)
class LabSshKeys:
    client: Path
    host: Path
    known_hosts: Path
    user: str

    @classmethod
    def create(cls, directory: Path) -> LabSshKeys:
        assert SSH_KEYGEN is not None
        directory.mkdir(parents=True, exist_ok=True)
        keys = []
        for name in ("client", "host"):
            path = directory / name
            if not path.exists():
                subprocess.run(
                    [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", f"lab {name}", "-f", path],
                    check=True,
                    capture_output=True,
                )
            keys.append(path)
        known = directory / "known_hosts"
        known.write_text("")
        user = pwd.getpwuid(os.geteuid()).pw_name
        return cls(keys[0], keys[1], known, user)

    def add_node(self, node_dir: Path, address: str, port: int) -> None:
        """The node's sshd config and authorized key; its host key in known_hosts."""
        if os.geteuid() == 0 and not PRIVSEP_DIR.is_dir():
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        client = self.client.with_suffix(".pub").read_text().strip()
        forced = f"{sys.executable} -m spark_watchdog.lab.hardware ssh-command --request {node_dir}"
        authorized = node_dir / "authorized_keys"
        authorized.write_text(f'command="{forced}",restrict {client}\n')
        (node_dir / CONFIG).write_text(
            "\n".join(
                [
                    f"ListenAddress {address}",
                    f"Port {port}",
                    f"HostKey {self.host}",
                    "PidFile none",
                    f"AuthorizedKeysFile {authorized}",
                    "PubkeyAuthentication yes",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    f"UsePAM {use_pam()}",
                    "StrictModes no",
                    "PermitRootLogin prohibit-password",
                    "LogLevel ERROR",
                    "",
                ]
            )
        )
        kind, key = self.host.with_suffix(".pub").read_text().split()[:2]
        with self.known_hosts.open("a") as known:
            known.write(f"[{address}]:{port} {kind} {key}\n")


def sshd_argv(node_dir: Path) -> list[str] | None:
    """How a host starts its sshd, or None when the lab set none up for it."""
    config = node_dir / CONFIG
    if SSHD is None or not config.exists():
        return None
    return [SSHD, "-D", "-e", "-f", str(config)]


def take_request(node_dir: Path) -> str | None:
    """A pending forced reboot request of the node (its command), consumed."""
    path = node_dir / REQUEST
    try:
        command = path.read_text()
        path.unlink()
    except OSError:
        return None
    return command


def use_pam() -> str:
    """``UsePAM no``, unless root's password is locked ("!"), where OpenSSH
    without PAM refuses even key logins (some images lock root)."""
    if os.geteuid() != 0:
        return "no"
    try:
        with open("/etc/shadow", encoding="utf-8") as shadow:
            for line in shadow:
                name, _, rest = line.partition(":")
                if name == pwd.getpwuid(0).pw_name and rest.startswith("!"):
                    return "yes"
    except OSError:
        pass
    return "no"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the lab host's forced SSH command")
    parser.add_argument("--request", type=Path, required=True, metavar="NODE_DIR")
    args = parser.parse_args(argv)
    command = os.environ.get("SSH_ORIGINAL_COMMAND", "")
    if not any(word in command for word in ("sysrq-trigger", "reboot", "halt")):
        print(
            f"lab host: only a reboot is possible over ssh here, not {command!r}", file=sys.stderr
        )
        return 1
    tmp = args.request / (REQUEST + ".tmp")
    tmp.write_text(command)
    os.replace(tmp, args.request / REQUEST)
    print("lab host: rebooting now")
    return 0
