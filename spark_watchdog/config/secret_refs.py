"""Every secret file a config names, checked when the config is loaded.

The agent and the controller read their secrets when they need them (the
serving token at a restart, a PDU community at a power cycle). Checking them
only then turns a missing file into a failed recovery during an incident; so
``agent --check``, ``controller --check`` (the unit's ``ExecStartPre``) and
the start of either daemon check each one first with
:func:`~spark_watchdog.config.secrets.check_secret`: it exists, is a regular
file, is readable, is mode 0600 or 0400, and holds more than whitespace.

A bare credential name resolves in ``$CREDENTIALS_DIRECTORY``, which systemd
sets for the unit's commands (``ExecStartPre`` and ``ExecStart`` alike). Where
it is not set (an operator running ``--check`` in a shell), ``--check`` cannot
see the credential: it lists those names as not checked and does not fail for
them, since the unit's own ``ExecStartPre`` checks them again; the start of a
daemon without it fails, as it could never read them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from spark_watchdog.config.agent import AgentConfig
from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.config.power_device_types import POWER_DEVICE_TYPES, power_device_type
from spark_watchdog.config.secrets import SecretUse, check_secret
from spark_watchdog.errors import ConfigError

# Power device keys that name a secret file we read (an SSH key is not among
# them: ssh -i reads it, and refuses a key others can read). Each type lists
# its own, with what each travels in (config/power_device_types.py); here, all
# of them in one tuple.
DEVICE_SECRET_KEYS = tuple(
    dict.fromkeys(
        secret.key
        for device_type in POWER_DEVICE_TYPES
        for secret in device_type.secret_files
        if secret.read
    )
)


@dataclass(frozen=True)
class SecretReference:
    """A ``*_file`` key of a config and what it names (a path or a credential name)."""

    key_path: str  # "serving.token_file", "nodes[0].power[0].community_file"
    reference: str
    reads_content: bool = True  # False for an SSH key: ssh reads it, not us
    use: SecretUse = "text"  # what it travels in: which characters it may hold

    @property
    def is_credential_name(self) -> bool:
        return not os.path.isabs(self.reference)


def agent_secrets(config: AgentConfig) -> list[SecretReference]:
    found: list[SecretReference] = []
    if config.serving.token_file is not None:
        found.append(SecretReference("serving.token_file", config.serving.token_file, use="header"))
    api_key = config.probes.vllm.canary.api_key_file
    if api_key is not None:
        found.append(SecretReference("probes.vllm.canary.api_key_file", api_key, use="header"))
    return found


def controller_secrets(config: ControllerConfig) -> list[SecretReference]:
    found: list[SecretReference] = []
    if config.history_password_file is not None:
        found.append(SecretReference("history_password_file", config.history_password_file))
    if config.serving.token_file is not None:
        found.append(SecretReference("serving.token_file", config.serving.token_file, use="header"))
    if config.listen.token_file is not None:
        found.append(SecretReference("listen.token_file", config.listen.token_file, use="header"))
    launcher_ssh = config.serving.launcher.ssh
    if launcher_ssh is not None:
        found.append(SecretReference("serving.launcher.ssh.key_file", launcher_ssh.key_file, False))
    for n, node in enumerate(config.nodes):
        for p, device in enumerate(node.power):
            for secret in power_device_type(device).secret_files:
                reference = getattr(device, secret.key)
                if reference is not None:
                    key_path = f"nodes[{n}].power[{p}].{secret.key}"
                    found.append(SecretReference(key_path, reference, secret.read, secret.use))
    return found


@dataclass(frozen=True)
class SecretsChecked:
    """What :func:`check_secrets` looked at, and the credential names it could not see."""

    checked: tuple[SecretReference, ...]
    not_checked: tuple[SecretReference, ...]

    def notes(self) -> list[str]:
        """One line about the credential names not checked, or none."""
        if not self.not_checked:
            return []
        names = ", ".join(f'{s.key_path} ("{s.reference}")' for s in self.not_checked)
        return [
            f"not checked: {names}: systemd credential name(s), and $CREDENTIALS_DIRECTORY "
            "is not set here; the unit sets it (LoadCredential=), and its start checks them"
        ]


def check_secrets(
    source: str,
    secrets: Iterable[SecretReference],
    environ: Mapping[str, str] | None = None,
    *,
    credentials_required: bool,
) -> SecretsChecked:
    """Check every secret in ``secrets``; raise one ConfigError for ``source`` listing
    every problem. ``credentials_required`` False (``--check``): a credential name is
    skipped, not refused, where $CREDENTIALS_DIRECTORY is not set (module doc)."""
    env = os.environ if environ is None else environ
    have_credentials = bool(env.get("CREDENTIALS_DIRECTORY"))
    problems: list[str] = []
    checked: list[SecretReference] = []
    skipped: list[SecretReference] = []
    for secret in secrets:
        if secret.is_credential_name and not have_credentials and not credentials_required:
            skipped.append(secret)
            continue
        try:
            check_secret(secret.key_path, secret.reference, env, use=secret.use)
        except ConfigError as exc:
            problems += exc.problems
            continue
        checked.append(secret)
    if problems:
        raise ConfigError(source, problems)
    return SecretsChecked(tuple(checked), tuple(skipped))
