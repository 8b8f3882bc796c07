"""Controller: does each power device answer, and is the outlet the node's?

Reads only. The backend is wrapped so that a command cannot leave doctor even
by mistake: :class:`ReadOnlyBackend` refuses ``command`` before anything is
sent. What is read: the power state (through ``VerifiedPower.state``, with the
controller's own read timeout) and, where the device keeps them (SNMP PDUs),
the outlet's number and name, the cheapest way to catch "outlet 3 is not
spark-3" before the controller cuts the wrong machine; and whether the device
can switch the node back on by itself after a cycle's off (its flip-back
timer, or an outlet reboot whose duration covers ``power_off_seconds``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from spark_watchdog.config.controller import ControllerConfig, SshDevice
from spark_watchdog.doctor.result import Finding, fail, ok, warn
from spark_watchdog.errors import ConfigError, PowerError, Unreachable, WatchdogError
from spark_watchdog.power.base import (
    PowerBackend,
    PowerState,
    SelfTimingBackend,
    VerifiedPower,
    close_quietly,
)
from spark_watchdog.power.paths import (
    PowerPath,
    build_backend,
    read_device_secrets,
    timing_for,
)
from spark_watchdog.power.ssh_banner import check_ssh_banner


class ReadOnlyViolation(PowerError):
    """Something asked doctor's power backend to switch power."""


class ReadOnlyBackend:
    """A backend that reads through to ``inner`` and refuses every command."""

    def __init__(self, inner: PowerBackend) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def limiter_key(self) -> str:
        return self.inner.limiter_key

    async def read_state(self) -> PowerState:
        return await self.inner.read_state()

    async def command(self, target: PowerState) -> None:
        raise ReadOnlyViolation(self.name, f"doctor only reads; refused to switch {target.value}")

    async def aclose(self) -> None:
        await self.inner.aclose()


def power_timeout_s(config: ControllerConfig, path: PowerPath) -> float:
    """Doctor's deadline for one path: vendor lookup, state, names and the
    device's own timer setting, each a read."""
    return 4 * timing_for(config, path).read_timeout + 5.0


async def check_power_path(config: ControllerConfig, path: PowerPath) -> Finding:
    if isinstance(path.device, SshDevice):
        return await _check_soft_path(path, path.device)
    where = f"{path.key_path} ({path.kind})"
    try:
        backend = build_backend(path, read_device_secrets(path))
    except ConfigError as exc:
        return fail(f"{where}: {'; '.join(exc.problems)}", "correct the device's config keys")
    try:
        return await _read(config, path, backend)
    finally:
        await close_quietly(backend)


async def _read(config: ControllerConfig, path: PowerPath, backend: PowerBackend) -> Finding:
    power = VerifiedPower(ReadOnlyBackend(backend), timing_for(config, path))
    try:
        state = await power.state()
        outlets: list[Any] = []
        if path.kind == "snmp":
            from spark_watchdog.power.snmp_outlet import describe_snmp_backend

            outlets = await describe_snmp_backend(backend)
    except Unreachable as exc:
        return fail(
            f"{backend.name} does not answer: {exc.message}",
            "check the device's address, port and credentials (a wrong SNMP community looks "
            "like silence), and the network from the controller to it",
        )
    except PowerError as exc:
        return fail(
            f"{backend.name} answered, but: {exc.message}",
            "check the vendor, outlet and credentials against the device",
        )
    except WatchdogError as exc:  # an outlet name the PDU does not have
        return fail(f"{backend.name}: {exc}", "correct the outlet in the config")
    found = judge_power(path.node, backend.name, state, outlets)
    found = await _with_timed_on(config, backend, found)
    read_power_on = getattr(backend, "read_power_on", None)
    if found.status != "ok" or read_power_on is None:
        return found
    try:
        policy = await read_power_on()
    except PowerError as exc:
        return warn(
            f"{found.detail}; its setting for after its own power loss cannot be read: "
            f"{exc.message}",
            "check on the plug that it switches on again after a power outage",
        )
    return judge_power_on(path.node, backend.name, policy) or found


async def _with_timed_on(
    config: ControllerConfig, backend: PowerBackend, found: Finding
) -> Finding:
    """Say whether the device can switch the node back on by itself after a cycle's off."""
    if found.status != "ok" or not isinstance(backend, SelfTimingBackend):
        return found
    if not config.policy.self_timed_on:
        return replace(found, detail=f"{found.detail}; self-timed on: off (policy.self_timed_on)")
    try:
        plan = await backend.plan_timed_on(config.policy.power_off_seconds)
    except PowerError as exc:
        return replace(found, detail=f"{found.detail}; self-timed on: unknown ({exc.message})")
    if plan.on_after_s is None:
        said = f"no, {plan.how}: a controller that dies during the hold leaves it off"
    else:
        said = f"yes, {plan.how} (on {plan.on_after_s:g}s after the off)"
    return replace(found, detail=f"{found.detail}; self-timed on: {said}")


def judge_power_on(node: str, device: str, policy: str) -> Finding | None:
    """A plug that would leave the node off (or out of reach) after its own power
    loss: Shelly ``initial_state``, Shelly Gen1 ``default_state``, Tasmota ``PowerOnState``.
    None when it is fine."""
    if policy in ("on", "restore_last"):
        return None
    why = {
        "off": f"it stays off after its own power loss, and so does {node}",
        "toggle": f"it flips after its own power loss: {node} may stay off",
        "match_input": "after its own power loss it follows its button's input",
        "pulse_time": f"after its own power loss it switches off again after PulseTime: {node} "
        "goes dark",
        "on_locked": "it ignores relay commands (PowerOnState 4): the controller cannot cut power",
    }.get(policy, f"unknown setting {policy!r}")
    return warn(
        f"{device}: power-on setting {policy}: {why}",
        "set it to restore the last state or to on (Shelly: Switch.SetConfig initial_state "
        "restore_last; Shelly Gen1: /settings/relay/N?default_state=last; Tasmota: "
        "PowerOnState 3 or 1)",
    )


def judge_power(node: str, device: str, state: PowerState, outlets: list[Any]) -> Finding:
    """``outlets``: the SNMP OutletDescription of each outlet (empty for other devices)."""
    detail = f"{device}: power {state.value}"
    named = [o for o in outlets if o.outlet_name]
    if named:
        detail += "; the PDU names " + ", ".join(
            f'outlet {o.outlet} "{o.outlet_name}"' for o in named
        )
    if state is not PowerState.ON:
        return warn(
            f"{detail}: {node} is not powered now"
            + (" (some outlets on, some off)" if state is PowerState.MIXED else ""),
            f"if {node} should be running, switch it on (`spark-watchdog power --config FILE "
            f"{node} on`) and find out why it was off",
        )
    strangers = [o for o in named if node.lower() not in str(o.outlet_name).lower()]
    if strangers:
        names = ", ".join(f'outlet {o.outlet} is "{o.outlet_name}"' for o in strangers)
        return warn(
            f"{detail}: {names}, a name without {node!r} in it. If the number is wrong, "
            f"fencing {node} cuts another machine",
            f"confirm on the PDU which outlet feeds {node}, then name that outlet {node} "
            f"(or give the outlet by name in the config: `outlet: {node}`)",
        )
    caveats = {o.caveat for o in outlets if o.caveat}
    if caveats:
        return warn(
            f"{detail}; the vendor profile is unconfirmed: {'; '.join(sorted(caveats))}",
            f"test one cycle of {node} in a maintenance window "
            f"(`spark-watchdog power --config FILE {node} cycle`) before trusting it",
        )
    if outlets and not named:
        return ok(f"{detail} (this PDU keeps no outlet names: doctor cannot confirm it is {node})")
    if not outlets:
        return ok(f"{detail} (this device type has no outlet name to confirm it is {node})")
    return ok(detail)


async def _check_soft_path(path: PowerPath, device: SshDevice) -> Finding:
    banner = await check_ssh_banner(device.host, device.port, timeout=device.connect_timeout)
    soft = "the ssh path reboots a stuck host and cannot reach a frozen one"
    if banner.ok:
        return ok(f"{path.key_path}: ssh {device.host}:{device.port}: {banner.banner} ({soft})")
    return fail(
        f"{path.key_path}: ssh {device.host}:{device.port}: {banner.outcome} ({banner.error})",
        f"run sshd there or correct host/port ({soft})",
    )


def check_power_coverage(node: str, paths: list[PowerPath]) -> Finding:
    """A node whose only paths are soft (ssh) cannot be brought back from a freeze."""
    if not paths:
        return warn(
            f"{node} has no power path: the controller can detect its freeze but a person "
            "must cut its power",
            f"add a power device to {node} (a PDU outlet or a smart plug on its power brick: "
            "DGX Spark has no BMC)",
        )
    if all(p.is_soft for p in paths):
        return warn(
            f"{node} has only an ssh path: it reboots a stuck host and cannot reach a frozen one",
            f"add a PDU outlet or a smart plug for {node} before its ssh path",
        )
    hard = sum(1 for p in paths if not p.is_soft)
    return ok(f"{node}: {hard} power path(s) that can cut power, {len(paths) - hard} soft")
