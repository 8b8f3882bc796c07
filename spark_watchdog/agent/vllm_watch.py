"""The agent's side of the vLLM probe: the scrape, the stall tracker and the canaries.

The probe runner calls :meth:`VllmWatch.read` in a worker thread; the
canaries (docs/design.md, "Signals on the node") are sent from the event
loop after a report, and on the controller's request from an HTTP thread.
"""

from __future__ import annotations

import asyncio
import logging
import time

from spark_watchdog.agent.probe_runner import ProbeRunner
from spark_watchdog.config.agent import CanaryConfig, VllmProbeConfig
from spark_watchdog.config.secrets import read_secret
from spark_watchdog.probes.vllm import (
    Canary,
    CanaryResult,
    ProgressTracker,
    VllmScraper,
    VllmStatus,
    rank_process_alive,
)

log = logging.getLogger("spark_watchdog.agent")


def canary_api_key(config: CanaryConfig) -> str | None:
    """The vLLM server's API key for the canary, read from its file now.

    :raises ConfigError: the file is missing, unreadable, open to others or blank.
    """
    if config.api_key_file is None:
        return None
    return read_secret("probes.vllm.canary.api_key_file", config.api_key_file).reveal()


class VllmWatch:
    def __init__(self, config: VllmProbeConfig) -> None:
        self.config = config
        self.tracker = ProgressTracker(config.stall_after, dead_after=config.dead_after)
        self._scraper: VllmScraper | None = None
        self._canary: Canary | None = None
        # The one the controller asks for (POST /v1/serving/canary), sent
        # whether or not automatic canaries are on.
        self.asked_canary: Canary | None = None
        if config.url is not None:
            self._scraper = VllmScraper(config.url, config.timeout, config.max_body_bytes)
            api_key = canary_api_key(config.canary)
            ccfg = config.canary
            if ccfg.enabled:
                self._canary = Canary(config.url, ccfg.model, ccfg.timeout, api_key=api_key)
            self.asked_canary = Canary(config.url, ccfg.model, ccfg.timeout, api_key=api_key)
        self.runner = ProbeRunner(
            "vllm", config.interval, config.timeout + 1.0, blocking_probe=self.read
        )
        self._canary_task: asyncio.Task[None] | None = None
        self._last_canary = float("-inf")

    def read(self) -> VllmStatus:
        match = self.config.process_match
        process_alive = rank_process_alive(match) if match else None
        sample = self._scraper.scrape() if self._scraper is not None else None
        return self.tracker.update(
            sample, time.monotonic(), process_alive=process_alive, wall=time.time()
        )

    def latest(self) -> VllmStatus | None:
        latest = self.runner.latest
        if latest is not None and isinstance(latest.report, VllmStatus):
            return latest.report
        return None

    def known_models(self) -> tuple[str, ...]:
        report = self.latest()
        return () if report is None else report.models

    def requests_running(self) -> float | None:
        report = self.latest()
        return None if report is None else report.running

    def advanced_at(self) -> float | None:
        """When (monotonic) the probe last saw the engine counters go up, as of its last report."""
        report = self.latest()
        return None if report is None else report.advanced_at

    def maybe_run_canary(self) -> None:
        """Send a 1-token canary when a stall is suspected, or when the head has
        been quiet for ``canary.idle_after`` (an idle hang answers no new
        request, and nothing else would show it). Runs on the event loop."""
        if self._canary is None:
            return
        if self._canary_task is not None and not self._canary_task.done():
            return
        now = time.monotonic()
        ccfg = self.config.canary
        if self.tracker.stall_suspected:
            if now - self._last_canary < ccfg.min_interval:
                return
        else:
            quiet = self.tracker.quiet_for(now)
            if (
                ccfg.idle_after <= 0
                or quiet is None
                or quiet < ccfg.idle_after
                # One timeout is confirmed by a second canary at once.
                or (
                    now - self._last_canary < ccfg.idle_after
                    and not self.tracker.canary_unconfirmed
                )
            ):
                return
        self._last_canary = now
        self._canary_task = asyncio.get_running_loop().create_task(self._run_canary())

    async def _run_canary(self) -> None:
        assert self._canary is not None
        # The models of the last report save a GET /v1/models.
        result = await asyncio.to_thread(self._canary.run, self.known_models())
        self.tracker.note_canary(result, time.monotonic())
        log.info("canary: %s", result.outcome, extra={"probe": "vllm", "canary": result.outcome})

    def run_asked_canary(self, loop: asyncio.AbstractEventLoop | None) -> CanaryResult | None:
        """The controller's canary, from an HTTP thread; None: no vLLM API here."""
        if self.asked_canary is None:
            return None
        result = self.asked_canary.run(self.known_models())
        if loop is not None:
            # An answered canary is proof of life for the stall clock too.
            loop.call_soon_threadsafe(self.tracker.note_canary, result, time.monotonic())
        return result

    def cancel(self) -> None:
        if self._canary_task is not None:
            self._canary_task.cancel()
