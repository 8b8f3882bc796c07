"""A dockerd of the lab's own: its own data root, exec root and socket under
one directory, no iptables, no bridge (containers on the host's network).
Started and stopped by PID; nothing of the machine's own Docker is touched.
The Docker tier (tests/docker) and the benchmarks run their containers here."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import docker

START_TIMEOUT = 60.0


class DockerUnavailable(RuntimeError):
    """This machine cannot run a dockerd of the lab's own (it says why)."""


def docker_unavailable() -> str | None:
    """Why this machine cannot run a dockerd of its own; None when it can."""
    if os.geteuid() != 0:
        return "a dockerd of the lab's own needs root"
    if shutil.which("dockerd") is None:
        return "dockerd not found: apt-get install docker.io (scripts/setup.sh does)"
    if importlib.util.find_spec("docker") is None:
        return "the Docker SDK is not installed: pip install 'spark-watchdog[docker]'"
    return None


@dataclass
class Dockerd:
    """A dockerd of the tier's own."""

    root: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def log(self) -> Path:
        return self.root / "dockerd.log"

    def client(self, timeout: int = 30) -> docker.DockerClient:
        import docker  # the docker extra: only where a dockerd of the lab's own runs

        return docker.DockerClient(base_url=self.url, timeout=timeout)

    def start(self) -> Dockerd:
        import docker.errors

        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    "dockerd",
                    f"--data-root={self.root / 'data'}",
                    f"--exec-root={self.root / 'exec'}",
                    f"--pidfile={self.root / 'dockerd.pid'}",
                    f"--host={self.url}",
                    "--iptables=false",
                    "--ip-masq=false",
                    "--bridge=none",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise DockerUnavailable(f"dockerd exited {self.process.returncode}:\n{self.tail()}")
            with contextlib.suppress(docker.errors.DockerException, OSError):
                if self.socket.exists() and self.client().ping():
                    return self
            time.sleep(0.2)
        raise DockerUnavailable(
            f"dockerd did not answer within {START_TIMEOUT:.0f} s:\n{self.tail()}"
        )

    def stop(self) -> None:
        """SIGTERM by PID (its containerd goes with it), SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def unmount(self) -> None:
        """What the daemon left mounted under its root (its network namespace's
        bind mount outlives it), so the temporary directory can go."""
        inside = str(self.root.resolve()) + "/"
        with open("/proc/self/mountinfo") as table:
            mounted = [line.split()[4] for line in table if line.split()[4].startswith(inside)]
        for point in sorted(mounted, key=len, reverse=True):
            subprocess.run(["umount", "--lazy", point], check=False, capture_output=True)

    def restart(self) -> None:
        self.stop()
        self.start()

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""
