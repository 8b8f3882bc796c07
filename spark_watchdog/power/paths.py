"""Turn a node's configured power devices into backends, reading their secrets.

The backends are imported only when a device of their type is configured:
pysnmp in particular is heavy and only the SNMP module may import it.
"""

from __future__ import annotations

import importlib
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spark_watchdog.config.controller import (
    ControllerConfig,
    KasaDevice,
    NodeConfig,
    PowerDevice,
    RedfishDevice,
)
from spark_watchdog.config.power_device_types import POWER_DEVICE_TYPES, power_device_type
from spark_watchdog.config.secrets import Secret, read_secret
from spark_watchdog.power.base import PowerBackend, PowerTiming


@dataclass(frozen=True)
class PowerPath:
    """One rung of a node's ladder: the device config and where it sits in the file."""

    node: str
    index: int  # 0-based position in nodes[i].power
    key_path: str  # "nodes[2].power[0]", for messages
    device: PowerDevice

    @property
    def kind(self) -> str:
        return self.device.type

    @property
    def is_soft(self) -> bool:
        """A path that switches no power (SSH): it reboots a stuck host, it cannot reach
        a frozen one."""
        return not power_device_type(self.device).switches_power


def power_paths(config: ControllerConfig, node: NodeConfig) -> list[PowerPath]:
    position = config.nodes.index(node)
    return [
        PowerPath(node.name, i, f"nodes[{position}].power[{i}]", device)
        for i, device in enumerate(node.power)
    ]


def read_device_secrets(
    path: PowerPath, environ: Mapping[str, str] | None = None
) -> dict[str, Secret]:
    """The secrets the path's driver reads, by the keys its type lists (``--check`` and
    a start checked the same ones: config/secret_refs.py)."""
    secrets: dict[str, Secret] = {}
    for secret in power_device_type(path.device).secret_files:
        reference = getattr(path.device, secret.key)
        if secret.read and reference is not None:
            key_path = f"{path.key_path}.{secret.key}"
            secrets[secret.key] = read_secret(key_path, reference, environ, use=secret.use)
    return secrets


Builder = Callable[[Any, Mapping[str, Secret]], PowerBackend]


def _named_builder(factory: str) -> Builder:
    """The builder a table entry names ("module:function"), its module imported when a
    device of its type is first built (pysnmp is heavy; a controller without a PDU
    never loads it)."""
    module, _, function = factory.partition(":")

    def build(device: Any, secrets: Mapping[str, Secret]) -> PowerBackend:
        builder = getattr(importlib.import_module(module), function)
        return typing.cast(PowerBackend, builder(device, secrets))

    return build


# The on/off devices by their config class, from the table of power device types
# (config/power_device_types.py; SSH is the soft path: no backend).
BUILDERS: dict[type, Builder] = {
    device_type.config: _named_builder(device_type.factory)
    for device_type in POWER_DEVICE_TYPES
    if device_type.factory is not None
}


def preload_libraries(config: ControllerConfig) -> None:
    """Import the libraries of the configured paths that take long to import
    (python-kasa), at the start rather than at an incident's first command."""
    if any(isinstance(device, KasaDevice) for node in config.nodes for device in node.power):
        from spark_watchdog.power.kasa import load_library

        load_library()


def build_backend(path: PowerPath, secrets: Mapping[str, Secret]) -> PowerBackend:
    """The raw backend of a (non-SSH) power path; ``aclose()`` it when done."""
    builder = BUILDERS.get(type(path.device))
    if builder is None:
        raise TypeError(f"{path.key_path}: {path.kind} is not an on/off power device")
    return builder(path.device, secrets)


def timing_for(config: ControllerConfig, path: PowerPath) -> PowerTiming:
    policy = config.policy
    read_timeout = 10.0
    device: Any = path.device
    if hasattr(device, "timeout"):
        # SNMP reads may be retried: the read budget covers every try.
        tries = 1 + int(getattr(device, "retries", 0))
        read_timeout = max(read_timeout, float(device.timeout) * tries + 1.0)
    command_timeout = max(15.0, read_timeout)
    if isinstance(device, RedfishDevice):
        # A Redfish command is a GET of the action plus a POST, and 409 retries.
        command_timeout = max(command_timeout, 3 * float(device.timeout) + 10.0)
    return PowerTiming(
        poll_interval=policy.power_poll_interval,
        power_timeout=policy.power_timeout,
        min_command_interval=policy.min_command_interval,
        read_timeout=read_timeout,
        command_timeout=command_timeout,
    )
