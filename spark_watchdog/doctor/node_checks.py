"""Node: does NVML answer within the agent's deadline, is vLLM's progress readable,
and do the peers answer their pulse?

Both reuse the agent's own probes with the agent's own settings: the NVML
worker child with its deadline, and the vLLM scraper with its timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from spark_watchdog.config.agent import AgentConfig, peers_on_management
from spark_watchdog.doctor.result import Finding, fail, ok, skip, warn
from spark_watchdog.probes.gpu import GpuProbe, GpuReading
from spark_watchdog.probes.pulse import ask_once
from spark_watchdog.probes.vllm import VllmScraper
from spark_watchdog.probes.vllm_metrics import ENGINE_STEPS, GENERATION_TOKENS, RUNNING
from spark_watchdog.probes.vllm_sample import VllmSample


async def check_gpu(config: AgentConfig, worker_argv: Sequence[str] | None = None) -> Finding:
    gpu = config.probes.gpu
    if not gpu.enabled:
        return skip("probes.gpu.enabled is false: the agent does not read the GPU")
    async with GpuProbe(gpu.deadline, worker_argv) as probe:
        reading = await probe.read()
    return judge_gpu(reading, gpu.deadline, config.serving.enabled)


def judge_gpu(reading: GpuReading, deadline: float, serving_enabled: bool) -> Finding:
    if reading.state == "ok":
        names = ", ".join(
            f"{d.name or f'GPU {d.index}'}"
            + (f" at {d.power_w:.0f} W" if d.power_w is not None else "")
            for d in reading.devices
        )
        said = (
            f"NVML answered in {reading.duration_s * 1000:.0f} ms (the agent's deadline: "
            f"{deadline:g} s): {len(reading.devices)} GPU(s): {names}; "
            f"driver {reading.driver_version or '?'}"
        )
        xids = reading.xids
        if xids is not None and xids.watcher != "on":
            return warn(
                f"{said}; but live Xid events are {xids.watcher} ({xids.detail}): a GPU fault "
                "is known only from the journal, after the boot, if the host survives it",
                "nothing to fix on the node if its driver refuses event sets; the agent "
                "reports it in /v1/state (gpu_faults.watcher)",
            )
        return ok(said + ("; live Xid events watched" if xids is not None else ""))
    if reading.state == "unavailable":
        why = reading.error or "no NVIDIA driver or no GPU"
        if serving_enabled:
            return fail(
                f"{why}. This node serves a model (serving.enabled), so without NVML the GPU "
                "heartbeat, the power draw that tells a wedged kernel, is blind",
                "install the NVIDIA driver (`nvidia-smi` must work), or set "
                "probes.gpu.enabled: false on a node without a GPU",
            )
        return warn(
            f"{why}. Fine only if this node runs no GPU work; otherwise the GPU heartbeat is blind",
            "install the NVIDIA driver, or set probes.gpu.enabled: false if this node has no GPU",
        )
    if reading.state == "timeout":
        return fail(
            f"{reading.error}. The agent would report gpu `timeout`: the driver is likely wedged",
            "look for NVRM Xid lines (`journalctl -k -b | grep NVRM`); a wedged driver "
            "clears only with a reboot or a power cycle",
        )
    return fail(
        f"the NVML worker failed: {reading.error}",
        "run `spark-watchdog probe gpu` on the node to see the worker's error",
    )


def check_vllm(config: AgentConfig) -> Finding:
    """One scrape of ``/health`` and ``/metrics``; the series the stall rule needs present."""
    vllm = config.probes.vllm
    if not vllm.enabled:
        return skip("probes.vllm.enabled is false: the agent does not watch vLLM here")
    if vllm.url is None:
        return skip(
            "probes.vllm.url is null: a headless worker rank, no HTTP API on this node; "
            "the head's doctor checks vLLM"
        )
    sample = VllmScraper(vllm.url, vllm.timeout, vllm.max_body_bytes).scrape()
    if not sample.reachable:
        return _unreachable(vllm.url, sample)
    if sample.health_status == 503:
        return fail(
            f"vLLM at {vllm.url} answers /health 503: its engine is dead",
            "restart serving (`spark-watchdog serving restart`, or the node's own launcher)",
        )
    return _series_finding(vllm.url, sample)


def _unreachable(url: str, sample: VllmSample) -> Finding:
    """No usable answer: vLLM is down, or its metrics cannot be read."""
    if sample.health_status is None:
        return fail(
            f"vLLM at {url} does not answer: {sample.error}",
            "start vLLM, or set probes.vllm.url to this node's vLLM API "
            "(http://HOST:PORT of `vllm serve --port`)",
        )
    return fail(
        f"vLLM at {url} answered /health {sample.health_status} but its metrics are "
        f"unusable: {sample.error}",
        "do not start vLLM with --disable-log-stats: the watchdog reads progress from /metrics",
    )


def _series_finding(url: str, sample: VllmSample) -> Finding:
    """Whether every engine exports the series the stall rule needs."""
    engines = list(sample.engines.values())
    without_running = [e.engine for e in engines if e.running is None]
    without_progress = [
        e.engine for e in engines if e.engine_steps is None and e.generation_tokens is None
    ]
    without_steps = [e.engine for e in engines if e.engine_steps is None]
    if without_running or without_progress:
        missing = RUNNING if without_running else f"{ENGINE_STEPS} and {GENERATION_TOKENS}"
        return fail(
            f"{url}/metrics has no {missing} (engine(s) "
            f"{', '.join(without_running or without_progress)}): a stall cannot be judged",
            'run a vLLM release with the V1 metrics (docs/facts.md, "Metrics") and without '
            "--disable-log-stats",
        )
    running = sum(e.running or 0 for e in engines)
    steps = sum(e.engine_steps or 0 for e in engines)
    detail = (
        f"vLLM at {url}: /health {sample.health_status}, {len(engines)} engine(s), "
        f"model(s) {', '.join(sample.models) or '?'}; {RUNNING} ({running} running) and "
        f"progress counters present"
    )
    if without_steps:
        return warn(
            f"{detail}, but no {ENGINE_STEPS}: progress is judged by generated tokens only, "
            "so a long chunked prefill can look like a stall",
            "use a vLLM release that exports vllm:iteration_tokens_total (the engine-step "
            "heartbeat)",
        )
    if sample.health_status != 200:
        return warn(
            f"{detail}; but /health answered {sample.health_status}, not 200",
            "check the vLLM server log for why /health is not 200",
        )
    return ok(f"{detail} ({ENGINE_STEPS} = {steps})")


def check_restart_policy(command: Sequence[str]) -> Finding:
    """A rank launched by a container runtime that restarts it on its own: the
    agent's stop is undone behind its back, a restarted rank 0 meets a stale rank 1
    and hangs, and each restart can leak unified memory
    (docs/facts.md, "Whole-host freezes"). The serving launcher must be the only
    one that starts the rank."""
    argv = list(command)
    if not argv:
        return skip("serving.command is empty: the agent does not launch the rank here")
    runtime = next((a for a in argv[:3] if Path(a).name in ("docker", "podman", "nerdctl")), None)
    if runtime is None:
        return ok("serving.command is not a container runtime: nothing restarts the rank")
    policy = None
    for i, arg in enumerate(argv):
        if arg.startswith("--restart="):
            policy = arg.split("=", 1)[1]
        elif arg == "--restart" and i + 1 < len(argv):
            policy = argv[i + 1]
    if policy is None or policy == "no":
        return warn(
            f"{Path(runtime).name} runs the rank: a stop reaches it through the client, but "
            "the memory guard's SIGKILL ends only the client, not the container, whose "
            "unified memory stays taken",
            "run vLLM directly under the agent (serving.command: [vllm, serve, ...]) where "
            "the memory guard matters",
        )
    return warn(
        f"serving.command starts the rank with {Path(runtime).name} --restart {policy}: the "
        "runtime restarts it behind the agent's back (a stop is undone, a lone rank rejoins "
        "stale peers, restarts leak unified memory)",
        "drop --restart (or use --restart no) and let the agent and the controller restart it",
    )


def check_peer_pulses(config: AgentConfig) -> Finding:
    """One pulse to each peer the agent watches (``peers:``), over the path it uses."""
    if not config.peers:
        return skip(
            "no peers: configured: the controller has no second path to this node "
            '(docs/design.md, "Peers")'
        )
    same_host = set(peers_on_management(config))
    bad: list[str] = []
    quiet: list[str] = []
    fine: list[str] = []
    for peer in config.peers:
        answer = ask_once(peer.name, peer.url, config.peering.timeout)
        line = f"{peer.name} at {peer.url}: {answer.state}" + (
            f" ({answer.error})" if answer.error else ""
        )
        if answer.state == "ok":
            fine.append(line)
        elif answer.state == "silent":
            quiet.append(line)
        else:
            bad.append(line)
    if bad:
        return fail(
            "; ".join(bad + quiet) + ": a pulse that is not this peer's is no evidence",
            "give each peer the URL of its own agent on the fabric (its ConnectX-7 address)",
        )
    if quiet or same_host:
        notes = quiet + [
            f"{name} is asked on this agent's own management address "
            f"({config.listen.address}): not a second path"
            for name in sorted(same_host)
        ]
        return warn(
            "; ".join(notes),
            "start the peer's agent, let the fabric reach its port, and give each peer "
            "its fabric (ConnectX-7) address, not the management one",
        )
    return ok(f"every peer answered its pulse: {'; '.join(fine)}")
