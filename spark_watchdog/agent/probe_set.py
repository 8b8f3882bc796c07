"""The agent's probes: vLLM, the GPU and the journal, each on a runner of its
own (``ProbeRunner``, its interval and deadline), and what each report sets off:
the next canary, the GPU clock check, the GPU faults, the journal's boots for
``GET /v1/boots`` and the memory guard's view of the journal."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from spark_watchdog.agent.clock_check import ClockCheck, ClockPolicy
from spark_watchdog.agent.gpu_faults import GpuFaultLog, rank_stopper
from spark_watchdog.agent.memory_watch import MemoryWatch
from spark_watchdog.agent.probe_runner import Observation, ProbeRunner
from spark_watchdog.agent.serving import ServingLauncher
from spark_watchdog.agent.snapshot import ProbeBodies
from spark_watchdog.agent.vllm_watch import VllmWatch
from spark_watchdog.config.agent import AgentConfig
from spark_watchdog.errors import ProbeError
from spark_watchdog.probes.gpu import GpuProbe, GpuReading
from spark_watchdog.probes.host import read_boot_id
from spark_watchdog.probes.journal import JournalProbe, JournalReport

log = logging.getLogger("spark_watchdog.agent")

# A probe with no report for this many of its own (interval + deadline) is
# stuck; the agent then stops petting the systemd watchdog so it restarts us.
_STALE_FACTOR = 10.0


def _clock_check(config: AgentConfig) -> ClockCheck | None:
    if not (config.gpu_clock_check.enabled and config.probes.gpu.enabled):
        return None
    ccfg = config.gpu_clock_check
    policy = ClockPolicy(ccfg.floor_mhz, ccfg.busy_util_pct, ccfg.busy_samples, ccfg.window)
    return ClockCheck(policy, time.monotonic())


class AgentProbes:
    """The enabled probes' runners by name, and what their reports feed."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        serving: ServingLauncher | None,
        memory: MemoryWatch | None,
        gpu_worker_argv: Sequence[str] | None = None,
        journal_boot_id: str | None = None,
    ) -> None:
        self.config = config
        self.memory = memory
        self.clock_check = _clock_check(config)
        # Live GPU faults of this boot; one that ends the rank's context stops it.
        self.gpu_faults = GpuFaultLog(rank_stopper(serving))
        self.runners: dict[str, ProbeRunner] = {}
        self.vllm: VllmWatch | None = None
        self._gpu: GpuProbe | None = None
        self._journal: JournalProbe | None = None
        self._lock = threading.Lock()
        self._boots_json: dict[str, Any] = {"boots": [], "state": "pending"}
        if config.probes.vllm.enabled:
            self._add_vllm_probe()
        if config.probes.gpu.enabled:
            self._add_gpu_probe(gpu_worker_argv)
        if config.probes.journal.enabled:
            self._add_journal_probe(journal_boot_id)
        for runner in self.runners.values():
            runner.on_report = self._on_report
        self.bodies = ProbeBodies(
            self.runners,
            config.probes.gpu.low_power_watts,
            lambda: None if self.vllm is None else self.vllm.requests_running(),
        )

    def _add_vllm_probe(self) -> None:
        self.vllm = VllmWatch(self.config.probes.vllm)
        self.runners["vllm"] = self.vllm.runner

    def _add_gpu_probe(self, worker_argv: Sequence[str] | None) -> None:
        gcfg = self.config.probes.gpu
        self._gpu = GpuProbe(gcfg.deadline, worker_argv=worker_argv)
        # The GpuProbe enforces the deadline itself (and kills the child);
        # the runner's deadline is only a backstop, past a fresh child's start.
        backstop = gcfg.deadline + GpuProbe.start_allowance_s + 2.0
        self.runners["gpu"] = ProbeRunner("gpu", gcfg.interval, backstop, probe=self._gpu.read)

    def _add_journal_probe(self, boot_id: str | None) -> None:
        probes = self.config.probes
        jcfg = probes.journal
        if boot_id is None:
            # The boot the journal calls "current" is the one this host
            # runs now; proc_root lets the lab give each node its own.
            try:
                boot_id = read_boot_id(probes.host.proc_root)
            except ProbeError as exc:
                log.warning("%s; no journal boot will count as current", exc)
        self._journal = JournalProbe(
            jcfg.directory,
            tail_entries=jcfg.tail_entries,
            evidence_per_kind=jcfg.evidence_per_kind,
            max_boots=jcfg.max_boots,
            current_boot_id=boot_id,
        )
        self.runners["journal"] = ProbeRunner(
            "journal", jcfg.interval, 60.0, blocking_probe=self._journal.read
        )

    def boots_json(self) -> dict[str, Any]:
        """The journal's boots as ``GET /v1/boots`` serves them."""
        with self._lock:
            return self._boots_json

    def stuck(self, now: float) -> bool:
        """A runner with no report for ``_STALE_FACTOR`` of its interval and deadline."""
        for runner in self.runners.values():
            if runner.latest is None:
                continue
            limit = _STALE_FACTOR * (runner.interval + runner.deadline)
            if now - runner.latest.observed_at > limit:
                return True
        return False

    async def close(self) -> None:
        """Stop what runs beside the runners: the canary and the GPU worker."""
        if self.vllm is not None:
            self.vllm.cancel()
        if self._gpu is not None:
            await self._gpu.close()

    def _on_report(self, name: str, observation: Observation) -> None:
        if name == "journal" and isinstance(observation.report, JournalReport):
            full = observation.report.to_json()
            with self._lock:
                self._boots_json = full
            if self.memory is not None:
                self.memory.note_journal(observation.report, time.monotonic())
        if name == "vllm" and self.vllm is not None:
            self.vllm.maybe_run_canary()
        if name == "gpu" and isinstance(observation.report, GpuReading):
            self._check_clock(observation.report)
            self.gpu_faults.take_soon(observation.report.xids)

    def _check_clock(self, reading: GpuReading) -> None:
        check = self.clock_check
        if check is None or check.state != "pending":
            return
        if check.observe(reading, time.monotonic()) == "latched":
            log.error(
                "GPU clock latched on this boot: %d busy readings, none at %d MHz "
                "(highest %s MHz); minutes without AC clear it",
                check.busy,
                check.policy.floor_mhz,
                check.max_busy_mhz,
            )
