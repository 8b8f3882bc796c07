"""A real PostgreSQL server of its own, on loopback, for the tests and the lab.

``initdb`` into a fresh directory, then ``postgres`` on a free port of
127.0.0.1 with its socket in that directory. ``initdb`` and ``postgres``
refuse to run as root, so as root they run as the ``postgres`` user the
Debian package creates (``runuser``), and the directory is theirs.

One role besides the superuser, ``watchdog``, with a password (SCRAM over
TCP, as a production server would ask) and a database it owns, ``history``:
what docs/install.md tells an operator to create.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from spark_watchdog.lab.ports import free_port

ROLE = "watchdog"
DATABASE = "history"
# The Debian package's system user, which initdb runs as when we are root.
SYSTEM_USER = "postgres"


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server binaries here (the Debian package is ``postgresql``)."""


def server_bindir() -> Path:
    """The newest installed server's bin directory (Debian: /usr/lib/postgresql/N/bin)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).parent
    raise PostgresUnavailable(
        "no PostgreSQL server found (initdb); install it: apt-get install postgresql"
    )


class PostgresServer:
    """Start with ``start()`` (or ``with``); ``url`` and ``password_file`` reach it."""

    def __init__(self, *, port: int | None = None, fsync: bool = False) -> None:
        self.bindir = server_bindir()
        self.port = port or free_port()
        self.fsync = fsync
        self.root = Path(tempfile.mkdtemp(prefix="spark-watchdog-pg-"))
        self.data = self.root / "data"
        self.password = "lab-" + os.urandom(12).hex()
        self.password_file = self.root / "password"
        self._as_root = os.geteuid() == 0
        self.started = False

    @property
    def url(self) -> str:
        """The history URL a controller config names (the password is in password_file)."""
        return f"postgresql://{ROLE}@127.0.0.1:{self.port}/{DATABASE}"

    @property
    def admin_url(self) -> str:
        """The superuser, over the server's own socket (trust: local only)."""
        user = SYSTEM_USER if self._as_root else pwd.getpwuid(os.geteuid()).pw_name
        return f"postgresql://{user}@/postgres?host={self.root}&port={self.port}"

    def _run(self, *argv: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        command = [*argv]
        if self._as_root:
            command = ["runuser", "-u", SYSTEM_USER, "--", *command]
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)

    def start(self) -> PostgresServer:
        if self._as_root:
            entry = pwd.getpwnam(SYSTEM_USER)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.root.chmod(0o700)
        done = self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--no-instructions",
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr.strip()[-2000:]}")
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            f"-c fsync={'on' if self.fsync else 'off'} -c max_connections=50"
        )
        done = self._pg_ctl("-l", str(self.root / "server.log"), "-o", options, "-t", "60", "start")
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed: {done.stderr.strip()} {self.log_tail()}")
        self.started = True
        self.psql(
            f"CREATE ROLE {ROLE} LOGIN PASSWORD '{self.password}'",
            f"CREATE DATABASE {DATABASE} OWNER {ROLE}",
        )
        self.password_file.write_text(self.password + "\n")
        self.password_file.chmod(0o600)
        return self

    def psql(self, *statements: str, database: str = "postgres") -> str:
        """Run statements as the superuser over the local socket; their output."""
        argv = [str(self.bindir.parent / "bin" / "psql")]
        if not Path(argv[0]).exists():
            argv = ["psql"]
        argv += ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"]
        argv += ["-h", str(self.root), "-p", str(self.port), "-d", database]
        for statement in statements:
            argv += ["-c", statement]
        done = self._run(*argv)
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr.strip()}")
        return done.stdout

    def restart_immediate(self) -> None:
        """``pg_ctl restart -m immediate``: the server dies without a checkpoint and comes back."""
        # -l: the new server's output goes to the log, not to our pipes (which
        # would then never close).
        done = self._pg_ctl("-l", str(self.root / "server.log"), "-m", "immediate", "restart")
        if done.returncode != 0:
            raise RuntimeError(f"pg_ctl restart failed: {done.stderr.strip()}")

    def _pg_ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``pg_ctl`` on this server's data directory, waiting for it to finish (-w)."""
        return self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-w", *args)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join((self.root / "server.log").read_text().splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.started:
            self._pg_ctl("-m", "fast", "stop")
            self.started = False
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                shutil.rmtree(self.root)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.2)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
