"""Turn a node's configured power devices into backends, reading their secrets.

The backends are imported only when a device of their type is configured:
pysnmp in particular is heavy and only the SNMP module may import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spark_watchdog.config.controller import (
    ControllerConfig,
    ExecDevice,
    HomeAssistantDevice,
    IpmiDevice,
    KasaDevice,
    NodeConfig,
    NutDevice,
    PowerDevice,
    RedfishDevice,
    ShellyDevice,
    ShellyGen1Device,
    SnmpDevice,
    SshDevice,
    TasmotaDevice,
)
from spark_watchdog.config.secret_refs import DEVICE_SECRET_KEYS, device_secret_use
from spark_watchdog.config.secrets import Secret, read_secret
from spark_watchdog.power.base import PowerBackend, PowerTiming

# The device keys naming a secret file: one list for --check and for the reads here.
_SECRET_KEYS = DEVICE_SECRET_KEYS


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
        """SSH reboots a stuck host; it cannot reach a frozen one."""
        return isinstance(self.device, SshDevice)


def power_paths(config: ControllerConfig, node: NodeConfig) -> list[PowerPath]:
    position = config.nodes.index(node)
    return [
        PowerPath(node.name, i, f"nodes[{position}].power[{i}]", device)
        for i, device in enumerate(node.power)
    ]


def read_device_secrets(
    path: PowerPath, environ: Mapping[str, str] | None = None
) -> dict[str, Secret]:
    secrets: dict[str, Secret] = {}
    for key in _SECRET_KEYS:
        reference = getattr(path.device, key, None)
        if reference is not None:
            use = device_secret_use(path.kind, key)
            secrets[key] = read_secret(f"{path.key_path}.{key}", reference, environ, use=use)
    return secrets


# Each builder imports its backend's module when a device of its type is
# first built (pysnmp is heavy; a controller without a PDU never loads it).


def _snmp(device: SnmpDevice, secrets: Mapping[str, Secret]) -> PowerBackend:
    from spark_watchdog.power.snmp_outlet import build_snmp_backend

    return build_snmp_backend(device, secrets)


def _ipmi(device: IpmiDevice, secrets: Mapping[str, Secret]) -> PowerBackend:
    from spark_watchdog.power.ipmi import build_ipmi_backend

    return build_ipmi_backend(device, secrets)


def _redfish(device: RedfishDevice, secrets: Mapping[str, Secret]) -> PowerBackend:
    from spark_watchdog.power.redfish import build_redfish_backend

    return build_redfish_backend(device, secrets)


def _shelly(device: ShellyDevice, secrets: Mapping[str, Secret]) -> PowerBackend:
    from spark_watchdog.power.plugs import build_shelly_backend

    return build_shelly_backend(device, secrets)


def _shelly_gen1(device: ShellyGen1Device, secrets: Mapping[str, Secret]) -> PowerBackend:
    from spark_watchdog.power.shelly_gen1 import build_shelly_gen1_backend

    return build_shelly_gen1_backend(device, secrets)


def _tasmota(device: TasmotaDevice, secrets: Mapping[str, Secret]) -> PowerBackend:
    from spark_watchdog.power.plugs import build_tasmota_backend

    return build_tasmota_backend(device, secrets)


def _home_assistant(device: HomeAssistantDevice, secrets: Mapping[str, Secret]) -> PowerBackend:
    from spark_watchdog.power.home_assistant import build_home_assistant_backend

    return build_home_assistant_backend(device, secrets)


def _nut(device: NutDevice, secrets: Mapping[str, Secret]) -> PowerBackend:
    from spark_watchdog.power.nut import build_nut_backend

    return build_nut_backend(device, secrets)


def _kasa(device: KasaDevice, secrets: Mapping[str, Secret]) -> PowerBackend:
    from spark_watchdog.power.kasa import build_kasa_backend

    return build_kasa_backend(device, secrets)


def _exec(device: ExecDevice, secrets: Mapping[str, Secret]) -> PowerBackend:
    from spark_watchdog.power.exec_path import build_exec_backend

    return build_exec_backend(device, secrets)


# The on/off devices by their config class (SSH is the soft path: no backend).
BUILDERS: dict[type, Callable[[Any, Mapping[str, Secret]], PowerBackend]] = {
    SnmpDevice: _snmp,
    IpmiDevice: _ipmi,
    RedfishDevice: _redfish,
    ShellyDevice: _shelly,
    ShellyGen1Device: _shelly_gen1,
    TasmotaDevice: _tasmota,
    HomeAssistantDevice: _home_assistant,
    NutDevice: _nut,
    KasaDevice: _kasa,
    ExecDevice: _exec,
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
