"""Secret files (serving token, PDU community, BMC passwords, SSH key): private and readable.

A token readable by group or others lets any local user stop serving on
every node; a PDU write community lets them cut power. The content is read
only to learn that it is not empty, and never shown.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from spark_watchdog.config.agent import AgentConfig
from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.config.secrets import exposed_to, read_secret, resolve_secret_path
from spark_watchdog.doctor.result import Finding, fail, ok, skip
from spark_watchdog.errors import ConfigError

# Where a credential given by name is found outside the unit: the directory
# deploy/install.sh loads each credential from (LoadCredential=NAME:PATH), then
# systemd's own credential stores (systemd.exec(5), LoadCredential=).
CREDENTIAL_DIRS = (
    "etc/spark-watchdog/credentials",
    "etc/credstore",
    "run/credstore",
    "usr/lib/credstore",
)
# Power device keys that name a secret file (power/paths.py reads the first
# four; ssh hands key_file to ssh -i, which refuses a key others can read).
DEVICE_SECRET_KEYS = ("community_file", "auth_key_file", "priv_key_file", "password_file")


@dataclass(frozen=True)
class SecretReference:
    """A ``*_file`` key of a config and what it names (a path or a credential name)."""

    key_path: str  # "serving.token_file", "nodes[0].power[0].community_file"
    reference: str
    reads_content: bool = True  # False for an SSH key: ssh reads it, not us


def agent_secrets(config: AgentConfig) -> list[SecretReference]:
    token = config.serving.token_file
    return [] if token is None else [SecretReference("serving.token_file", token)]


def controller_secrets(config: ControllerConfig) -> list[SecretReference]:
    found: list[SecretReference] = []
    if config.serving.token_file is not None:
        found.append(SecretReference("serving.token_file", config.serving.token_file))
    for n, node in enumerate(config.nodes):
        for p, device in enumerate(node.power):
            for key in DEVICE_SECRET_KEYS:
                reference = getattr(device, key, None)
                if reference is not None:
                    found.append(SecretReference(f"nodes[{n}].power[{p}].{key}", reference))
            key_file = getattr(device, "key_file", None)
            if key_file is not None:
                found.append(SecretReference(f"nodes[{n}].power[{p}].key_file", key_file, False))
    return found


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _locate(
    secret: SecretReference, environ: Mapping[str, str] | None, root: Path
) -> Path | Finding:
    try:
        return resolve_secret_path(secret.reference, environ)
    except ConfigError as exc:
        if "/" in secret.reference:
            return fail(f"{secret.key_path}: {exc.problems[0]}", "give an absolute path")
    # A bare credential name outside the service: where systemd would find it.
    for folder in CREDENTIAL_DIRS:
        candidate = root / folder / secret.reference
        if candidate.exists():
            return candidate
    return skip(
        f'{secret.key_path}: "{secret.reference}" is a systemd credential name; systemd '
        "hands it to the service (LoadCredential=), and it is not in "
        f"{', '.join('/' + d for d in CREDENTIAL_DIRS)}, so doctor cannot look at it "
        "from outside the unit"
    )


def check_secret_file(
    secret: SecretReference,
    *,
    owners: Collection[int] | None = None,
    environ: Mapping[str, str] | None = None,
    root: Path = Path("/"),
) -> Finding:
    """Mode 0600 or 0400, owned by root (or whoever runs doctor: the service's user), not empty.

    ``owners`` are the acceptable owner uids (default: root and this process's uid).
    """
    allowed = set(owners) if owners is not None else {0, os.geteuid()}
    located = _locate(secret, environ, root)
    if isinstance(located, Finding):
        return located
    path = located
    try:
        info = path.stat()
    except FileNotFoundError:
        return fail(
            f"{secret.key_path}: {path} does not exist",
            f"create it (`install -m 600 -o root /dev/null {path}`, then write the secret "
            "into it), or correct the key",
        )
    except OSError as exc:
        return fail(f"{secret.key_path}: cannot stat {path}: {exc.strerror or exc}", "check it")
    if not stat.S_ISREG(info.st_mode):
        return fail(f"{secret.key_path}: {path} is not a regular file", "point it at a file")
    mode = stat.S_IMODE(info.st_mode)
    exposure = exposed_to(mode)
    if exposure is not None:
        return fail(
            f"{secret.key_path}: {path} has mode {mode:04o}: {exposure} can use it",
            f"`chmod 600 {path}`",
        )
    if info.st_uid not in allowed:
        expected = " or ".join(sorted({_owner(uid) for uid in allowed}))
        return fail(
            f"{secret.key_path}: {path} is owned by {_owner(info.st_uid)}, who can read it; "
            f"expected {expected}",
            f"`chown root: {path}` (or give it to the service's own user)",
        )
    if secret.reads_content:
        try:
            read_secret(secret.key_path, str(path))
        except ConfigError as exc:
            return fail(exc.problems[0], f"write the secret into {path}")
    elif info.st_size == 0:
        return fail(f"{secret.key_path}: {path} is empty", f"put the key into {path}")
    return ok(f"{secret.key_path}: {path}: mode {mode:04o}, owner {_owner(info.st_uid)}")
