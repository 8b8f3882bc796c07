"""A real NUT ``upsd`` on loopback, in a directory of its own, for tests and benchmarks.

Not the system's service: its own ``ups.conf``, ``upsd.conf`` and
``upsd.users`` in a temporary directory (``NUT_CONFPATH``, ``NUT_STATEPATH``),
listening on ``127.0.0.1`` at a port of the lab's range. Behind it:

- ``pdu``: Debian's ``dummy-ups`` driver on a ``.dev`` file with two outlets
  (``outlet.1.status``, ``outlet.2.status``). It offers only ``load.off`` and
  switches nothing; its variables can be set through upsd (``SET VAR``), as
  the hardware would report a change;
- ``rack``: :class:`~spark_watchdog.lab.hardware.nut_outlet_driver.NutOutletDriver`,
  a driver of our own whose outlets switch on ``outlet.N.load.off|on``.

One user may run the outlet commands and set variables. Debian ships the
binaries in ``/lib/nut`` (``/sbin/upsd`` is a wrapper that reads the system's
``nut.conf``); other systems in ``/usr/lib/nut``, ``/usr/libexec/nut`` or
``/usr/sbin``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

from spark_watchdog.lab.hardware.nut_outlet_driver import NutOutletDriver
from spark_watchdog.lab.ports import free_port

PLACES = ("/lib/nut", "/usr/lib/nut", "/usr/libexec/nut", "/usr/sbin", "/sbin", "/usr/bin")
PACKAGES = "nut-server (apt-get install nut-server nut-client)"
USER = "watchdog"
DRIVER = "spark-outlets"  # the stand-in driver's name: its socket is DRIVER-rack


class NutUnavailable(RuntimeError):
    """upsd or dummy-ups is not installed, or did not start."""


def find(program: str) -> str | None:
    """The real binary (not Debian's /sbin/upsd wrapper, which reads /etc/nut/nut.conf)."""
    for place in PLACES:
        candidate = Path(place) / program
        if candidate.is_file() and os.access(candidate, os.X_OK):
            try:
                if candidate.read_bytes()[:2] == b"#!":
                    continue  # a wrapper script
            except OSError:
                continue
            return str(candidate)
    found = shutil.which(program)
    return found


def _quoted(value: str) -> str:
    """A value as upsd.users and upsd's protocol take it: in double quotes, with
    ``\\``, ``"`` and ``#`` (else the start of a comment) escaped by a backslash."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("#", "\\#")
    return f'"{escaped}"'


class NutServer:
    """upsd with ``pdu`` (dummy-ups) and ``rack`` (the outlet driver stand-in) behind it."""

    def __init__(
        self,
        directory: Path,
        password: str,
        *,
        switch_delay: float = 0.0,
        port: int | None = None,
    ) -> None:
        self.directory = directory
        self.password = password
        self.port = port or free_port()
        self.host = "127.0.0.1"
        upsd, dummy = find("upsd"), find("dummy-ups")
        if upsd is None or dummy is None:
            raise NutUnavailable(f"upsd or dummy-ups not found: install {PACKAGES}")
        self._upsd_binary, self._dummy_binary = upsd, dummy
        self.rack = NutOutletDriver(directory / f"{DRIVER}-rack", switch_delay=switch_delay)
        self._processes: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> NutServer:
        try:
            self._configure()
            self.rack.__enter__()
            self._start([self._dummy_binary, "-a", "pdu", "-F", *self._as_root()], "dummy-ups.log")
            self._wait_for(self.directory / "dummy-ups-pdu", "dummy-ups")
            self._start([self._upsd_binary, "-F", *self._as_root()], "upsd.log")
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for process in reversed(self._processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
        self._processes.clear()
        self.rack.__exit__(None, None, None)

    # --- the test's hand on dummy-ups -------------------------------------------

    def set_var(self, ups: str, variable: str, value: str) -> None:
        """SET VAR through upsd, as the device would report a change (upsrw)."""
        answers = self.talk(
            [
                f"USERNAME {USER}",
                f"PASSWORD {_quoted(self.password)}",
                f'SET VAR {ups} {variable} "{value}"',
            ]
        )
        if answers[-1] != "OK":
            raise RuntimeError(f"SET VAR {ups} {variable}: {answers[-1]}")

    def talk(self, lines: list[str]) -> list[str]:
        """One session: each line's one-line answer."""
        answers: list[str] = []
        with socket.create_connection((self.host, self.port), timeout=10) as connection:
            stream = connection.makefile("rwb")
            for line in lines:
                stream.write(line.encode() + b"\n")
                stream.flush()
                answers.append(stream.readline().decode().rstrip("\r\n"))
        return answers

    def wait_var(self, ups: str, variable: str, value: str, timeout: float = 30.0) -> None:
        """Until upsd reports ``value`` (the driver's update reached it)."""
        deadline = time.monotonic() + timeout
        want = f'VAR {ups} {variable} "{value}"'
        while time.monotonic() < deadline:
            if self.talk([f"GET VAR {ups} {variable}"])[0] == want:
                return
            time.sleep(0.1)
        raise TimeoutError(f"upsd never reported {want}")

    # --- internals -----------------------------------------------------------------

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        directory = str(self.directory)
        env.update(NUT_CONFPATH=directory, NUT_STATEPATH=directory, NUT_ALTPIDPATH=directory)
        return env

    def _as_root(self) -> list[str]:
        # As root the NUT programs switch to the "nut" user, which cannot use
        # this directory; they stay root here instead.
        return ["-u", "root"] if os.geteuid() == 0 else []

    def _configure(self) -> None:
        d = self.directory
        (d / "pdu.dev").write_text(
            "device.type: pdu\nups.status: OL\n"
            "outlet.1.status: on\noutlet.1.switchable: yes\n"
            "outlet.2.status: on\noutlet.2.switchable: yes\n"
        )
        files = {
            "ups.conf": (
                f'[pdu]\n\tdriver = dummy-ups\n\tport = {d / "pdu.dev"}\n\tdesc = "dummy-ups"\n'
                f'[rack]\n\tdriver = {DRIVER}\n\tport = none\n\tdesc = "outlet stand-in"\n'
            ),
            "upsd.conf": f"LISTEN {self.host} {self.port}\nMAXAGE 30\n",
            "upsd.users": (
                f"[{USER}]\n\tpassword = {_quoted(self.password)}\n\tinstcmds = ALL\n"
                "\tactions = SET\n"
            ),
        }
        for name, text in files.items():
            (d / name).write_text(text)
            (d / name).chmod(0o600)

    def _start(self, argv: list[str], log_name: str) -> None:
        log = (self.directory / log_name).open("wb")
        with log:
            self._processes.append(
                subprocess.Popen(
                    argv,
                    env=self._environment(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def _wait_for(self, path: Path, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline or self._processes[-1].poll() is not None:
                raise NutUnavailable(f"{what} did not start: {self._log(what)}")
            time.sleep(0.05)

    def _wait_ready(self, timeout: float = 60.0) -> None:
        """Until upsd answers with fresh data for both UPSes."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            if self._processes[-1].poll() is not None:
                break
            try:
                answers = self.talk(["GET VAR pdu ups.status", "GET VAR rack ups.status"])
            except OSError as exc:
                last = str(exc)
            else:
                if all(a.endswith('ups.status "OL"') for a in answers):
                    return
                last = "; ".join(answers)
            time.sleep(0.1)
        raise NutUnavailable(f"upsd not ready ({last}): {self._log('upsd')}")

    def _log(self, what: str) -> str:
        path = self.directory / f"{what}.log"
        try:
            return path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"
