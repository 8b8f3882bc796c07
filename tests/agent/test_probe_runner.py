"""The probe runner's schedule ends when the agent stops, however the stop lands."""

from __future__ import annotations

import asyncio

from spark_watchdog.agent.probe_runner import ProbeFailure, ProbeRunner


def test_a_stop_that_lands_as_the_probe_answers_still_ends_the_runner() -> None:
    """The agent stops its runners and cancels their tasks. A cancellation that
    comes in the same turn of the loop as the probe's answer is dropped by
    ``asyncio.wait_for`` before Python 3.12; the runner must end all the same,
    or the agent's stop waits on it for ever."""
    calls = 0

    async def main() -> tuple[bool, bool]:
        nonlocal calls
        loop = asyncio.get_running_loop()

        async def probe() -> ProbeFailure:
            nonlocal calls
            calls += 1
            if calls == 2:
                # Queued before the answer's own wake-up of the waiting runner.
                loop.call_soon(runner.stop)
                loop.call_soon(task.cancel)
            return ProbeFailure("error", "a report")

        runner = ProbeRunner("test", 0.01, 5.0, probe=probe)
        task = asyncio.create_task(runner.run_forever())
        done, _ = await asyncio.wait({task}, timeout=10)
        ended = bool(done)
        if not ended:
            runner.stop()
            task.cancel()
            await asyncio.wait({task}, timeout=10)
        return ended, task.done()

    ended, done = asyncio.run(main())
    assert ended, f"the runner probed on after its stop ({calls} calls)"
    assert done
    assert calls == 2


def test_a_stopped_runner_does_not_start_a_round() -> None:
    calls = 0

    async def probe() -> ProbeFailure:
        nonlocal calls
        calls += 1
        return ProbeFailure("error", "a report")

    runner = ProbeRunner("test", 0.01, 5.0, probe=probe)
    runner.stop()
    asyncio.run(runner.run_forever())
    assert calls == 0
