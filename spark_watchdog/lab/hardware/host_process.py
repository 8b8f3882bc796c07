"""A simulated host behind an outlet: a process tree that power starts and kills."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence

from spark_watchdog.power.base import PowerState


class HostProcess:
    """A simulated host behind an outlet: power on starts a command, power off kills it.

    Off kills the whole process group at once (SIGKILL, like pulling the
    plug); on starts the command again after ``boot_seconds``.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        boot_seconds: float = 0.0,
        on_boot: Callable[[int], None] | None = None,
    ) -> None:
        if not argv:
            raise ValueError("a host command is needed")
        self.argv = list(argv)
        self.boot_seconds = boot_seconds
        self.on_boot = on_boot
        self.process: subprocess.Popen[bytes] | None = None
        self.boots = 0
        self._lock = threading.Lock()
        self._boot_timer: threading.Timer | None = None

    def power(self, state: PowerState) -> None:
        if state is PowerState.ON:
            self.power_on()
        else:
            self.power_off()

    def power_on(self) -> None:
        with self._lock:
            if self._boot_timer is not None or self.running:
                return
            if self.boot_seconds <= 0:
                self._boot_locked()
                return
            self._boot_timer = threading.Timer(self.boot_seconds, self._boot)
            self._boot_timer.daemon = True
            self._boot_timer.start()

    def power_off(self) -> None:
        with self._lock:
            if self._boot_timer is not None:
                self._boot_timer.cancel()
                self._boot_timer = None
            process = self.process
            if process is None or process.poll() is not None:
                return
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def ended(self) -> bool:
        """Its command ran and exited, and no boot is on its way."""
        with self._lock:
            return self.boots > 0 and self._boot_timer is None and not self.running

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.running and self.process is not None else None

    def _boot(self) -> None:
        with self._lock:
            self._boot_timer = None
            self._boot_locked()

    def _boot_locked(self) -> None:
        self.process = subprocess.Popen(self.argv, start_new_session=True, stdin=subprocess.DEVNULL)
        self.boots += 1
        if self.on_boot is not None:
            self.on_boot(self.process.pid)
