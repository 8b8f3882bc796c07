"""Secrets come only from files or systemd credentials, never inline.

A ``*_file`` key names either an absolute path or a bare credential name,
which resolves in ``$CREDENTIALS_DIRECTORY`` (systemd ``LoadCredential=``,
systemd.exec(5)). The value never reaches a log line, an argv or a repr.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from spark_watchdog.errors import ConfigError

log = logging.getLogger("spark_watchdog.secrets")


class Secret:
    """A secret value; ``str()`` and ``repr()`` never show it."""

    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str) -> None:
        self._value = value
        self.source = source

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret(from {self.source})"

    __str__ = __repr__


def resolve_secret_path(reference: str, environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if os.path.isabs(reference):
        return Path(reference)
    credentials = env.get("CREDENTIALS_DIRECTORY")
    if not credentials:
        raise ConfigError(
            reference,
            [
                f'"{reference}" is neither an absolute path nor resolvable: '
                "$CREDENTIALS_DIRECTORY is not set (use an absolute path, or "
                "LoadCredential= in the unit)"
            ],
        )
    if "/" in reference or reference in (".", ".."):
        raise ConfigError(reference, [f'credential name "{reference}" must not contain "/"'])
    return Path(credentials) / reference


def exposed_to(mode: int) -> str | None:
    """Who besides the owner may read, write or run a secret file of ``mode``:
    ``"group"``, ``"others"``, ``"group and others"``, or None (0600 / 0400)."""
    group = bool(mode & stat.S_IRWXG)
    others = bool(mode & stat.S_IRWXO)
    if group and others:
        return "group and others"
    if group:
        return "group"
    return "others" if others else None


def read_secret(key_path: str, reference: str, environ: Mapping[str, str] | None = None) -> Secret:
    """Read one secret for config key ``key_path``; errors name the key, never the value."""
    path = resolve_secret_path(reference, environ)
    try:
        info = path.stat()
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(key_path, [f"{key_path}: secret file {path} does not exist"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            key_path, [f"{key_path}: cannot read secret file {path}: {exc}"]
        ) from None
    if exposed_to(info.st_mode) is not None:
        log.warning(
            "%s: secret file %s is readable by group or others (mode %o); chmod 600 it",
            key_path,
            path,
            stat.S_IMODE(info.st_mode),
        )
    # One trailing newline is how editors save files; it is not part of the secret.
    value = raw[:-1] if raw.endswith("\n") else raw
    if not value:
        raise ConfigError(key_path, [f"{key_path}: secret file {path} is empty"])
    return Secret(value, str(path))
