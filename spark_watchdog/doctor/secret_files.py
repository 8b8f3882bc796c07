"""Secret files (serving token, PDU community, BMC passwords, SSH key): private and readable.

A token readable by group or others lets any local user stop serving on
every node; a PDU write community lets them cut power. The content is read
only to learn that it is not empty, and never shown. The checks are those
the daemons make at start (:func:`spark_watchdog.config.secrets.check_secret`),
plus the owner.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Collection, Mapping
from pathlib import Path

from spark_watchdog.config.secret_refs import (
    DEVICE_SECRET_KEYS,
    SecretReference,
    agent_secrets,
    controller_secrets,
)
from spark_watchdog.config.secrets import SecretFileError, load_secret_file, resolve_secret_path
from spark_watchdog.doctor.result import Finding, fail, ok, skip
from spark_watchdog.errors import ConfigError

__all__ = [
    "CREDENTIAL_DIRS",
    "DEVICE_SECRET_KEYS",
    "SecretReference",
    "agent_secrets",
    "check_secret_file",
    "controller_secrets",
]

# Where a credential given by name is found outside the unit: the directory
# deploy/install.sh loads each credential from (LoadCredential=NAME:PATH), then
# systemd's own credential stores (systemd.exec(5), LoadCredential=).
CREDENTIAL_DIRS = (
    "etc/spark-watchdog/credentials",
    "etc/credstore",
    "run/credstore",
    "usr/lib/credstore",
)


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
    """Mode 0600 or 0400, owned by root (or whoever runs doctor: the service's user), a
    regular file holding more than whitespace: a failure otherwise, as at start.

    ``owners`` are the acceptable owner uids (default: root and this process's uid).
    """
    allowed = set(owners) if owners is not None else {0, os.geteuid()}
    located = _locate(secret, environ, root)
    if isinstance(located, Finding):
        return located
    path = located
    # The same check, and the same messages, as at start and `--check`
    # (config.secrets.check_secret): a regular, private, non-blank file.
    credential = secret.reference if secret.is_credential_name else None
    try:
        load_secret_file(secret.key_path, path, private=True, credential=credential)
        info = path.stat()
    except SecretFileError as exc:
        return fail(exc.detail, exc.fix)
    except OSError as exc:
        return fail(f"{secret.key_path}: cannot stat {path}: {exc.strerror or exc}", "check it")
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in allowed:
        expected = " or ".join(sorted({_owner(uid) for uid in allowed}))
        return fail(
            f"{secret.key_path}: {path} is owned by {_owner(info.st_uid)}, who can read it; "
            f"expected {expected}",
            f"`chown root: {path}` (or give it to the service's own user)",
        )
    return ok(f"{secret.key_path}: {path}: mode {mode:04o}, owner {_owner(info.st_uid)}")
