"""Secrets come only from files or systemd credentials, never inline.

A ``*_file`` key names either an absolute path or a bare credential name,
which resolves in ``$CREDENTIALS_DIRECTORY`` (systemd ``LoadCredential=``,
systemd.exec(5)). The value never reaches a log line, an argv or a repr.

A secret file is a regular file of at most :data:`SECRET_MAX_BYTES`, mode
0600 or 0400, holding more than whitespace. :func:`check_secret` checks that
at start (and ``--check``) for every secret a config names
(:mod:`spark_watchdog.config.secret_refs`), so a missing PDU community is a
config error, not a failed power cycle in the middle of an incident.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

from spark_watchdog.config.files import FileRefused, read_regular_file
from spark_watchdog.errors import ConfigError

log = logging.getLogger("spark_watchdog.secrets")

# A token, a community, a password or an SSH key is far smaller than this;
# a bigger file (or /dev/zero) is a wrong path, not a secret.
SECRET_MAX_BYTES = 64 * 1024


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


class SecretFileError(ConfigError):
    """A secret file that cannot be used. ``detail`` names the key and the file (never
    the content), ``fix`` says what to do; the one problem is both."""

    def __init__(self, key_path: str, detail: str, fix: str) -> None:
        self.key_path = key_path
        self.detail = detail
        self.fix = fix
        super().__init__(key_path, [f"{detail}; {fix}"])


def _credential_fix(key_path: str, path: Path, credential: str | None) -> str:
    if credential is None:
        return (
            f"create it (`install -m 600 /dev/null {path}`, then write the secret into it), "
            f"or correct {key_path}"
        )
    return (
        f"load it into the unit (LoadCredential={credential}:/etc/spark-watchdog/credentials/"
        f"{credential}; deploy/install.sh writes one per file in that directory), "
        f"or correct {key_path}"
    )


def load_secret_file(
    key_path: str, path: Path, *, private: bool, credential: str | None = None
) -> str:
    """The secret in ``path`` for config key ``key_path``.

    Refused (:class:`SecretFileError`): a file that does not exist, is not a
    regular file, is over :data:`SECRET_MAX_BYTES`, is not UTF-8, or is empty
    or only whitespace. A file that group or others may use is refused too
    when ``private`` (at start and by ``--check``); otherwise it is a logged
    warning, so that a mode changed while running does not stop a recovery.
    ``credential`` is the credential name ``path`` was resolved from, for the fix.
    """
    try:
        raw, info = read_regular_file(path, SECRET_MAX_BYTES)
    except FileRefused as exc:
        if exc.missing:
            raise SecretFileError(
                key_path,
                f"{key_path}: secret file {path} does not exist",
                _credential_fix(key_path, path, credential),
            ) from None
        if exc.unreadable:
            fix = (
                "give it to the user the service runs as, keeping mode 600, or load it "
                "with LoadCredential= (systemd hands it to the service's dynamic user)"
            )
        else:
            fix = f"point {key_path} at a regular file that holds only the secret"
        raise SecretFileError(
            key_path, f"{key_path}: secret file {path} {exc.reason}", fix
        ) from None
    mode = stat.S_IMODE(info.st_mode)
    exposure = exposed_to(mode)
    if exposure is not None:
        detail = f"{key_path}: secret file {path} has mode {mode:04o}: {exposure} can use it"
        fix = f"`chmod 600 {path}`"
        if private:
            raise SecretFileError(key_path, detail, fix)
        log.warning("%s; %s", detail, fix)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretFileError(
            key_path,
            f"{key_path}: secret file {path} is not UTF-8 text",
            f"write the secret into {path} as text",
        ) from None
    # One trailing newline is how editors save files; it is not part of the secret.
    value = text[:-1] if text.endswith("\n") else text
    if not value.strip():
        what = "is empty" if not value else "holds only whitespace"
        raise SecretFileError(
            key_path, f"{key_path}: secret file {path} {what}", f"write the secret into {path}"
        )
    return value


# What a secret travels in, and so which characters it may hold
# (docs/power.md, "Secrets"): "header" a token in an HTTP header (Bearer), "basic" a password in
# HTTP Basic auth (requests encodes it as Latin-1), "nut" a line of upsd's
# protocol, "text" anything a file holds.
SecretUse = Literal["header", "basic", "nut", "text"]
_FITS: dict[str, tuple[str, Callable[[str], bool]]] = {
    "header": (
        "a token sent in an HTTP header may hold only visible ASCII (no space, no control "
        "character, nothing beyond ASCII such as a pasted …)",
        lambda c: "!" <= c <= "~",
    ),
    "basic": (
        "a password sent by HTTP Basic auth may hold only Latin-1 characters and no control "
        "character",
        lambda c: c.isprintable() and ord(c) < 256,
    ),
    "nut": (
        "upsd's protocol carries only printable ASCII: no line break, no control character, "
        "nothing beyond ASCII",
        lambda c: " " <= c <= "~",
    ),
}


def unfit_for(value: str, use: SecretUse) -> str | None:
    """Why ``value`` cannot travel as ``use`` (its first bad character's position and code
    point, never the secret itself), or None when it can."""
    if use not in _FITS:
        return None
    rule, fits = _FITS[use]
    for position, char in enumerate(value, start=1):
        if not fits(char):
            return f"holds U+{ord(char):04X} at character {position}: {rule}"
    return None


def _check_use(key_path: str, path: Path, value: str, use: SecretUse) -> None:
    why = unfit_for(value, use)
    if why is not None:
        raise SecretFileError(
            key_path,
            f"{key_path}: secret file {path} {why}",
            f"write the secret into {path} again, without that character",
        )


def _resolve(key_path: str, reference: str, environ: Mapping[str, str] | None) -> Path:
    try:
        return resolve_secret_path(reference, environ)
    except ConfigError as exc:
        raise ConfigError(key_path, [f"{key_path}: {p}" for p in exc.problems]) from None


def read_secret(
    key_path: str,
    reference: str,
    environ: Mapping[str, str] | None = None,
    *,
    private: bool = False,
    use: SecretUse = "text",
) -> Secret:
    """Read one secret for config key ``key_path``; errors name the key, never the value.

    ``private``: refuse a file group or others may use (see :func:`load_secret_file`);
    ``use``: refuse a value its protocol cannot carry (:func:`unfit_for`).
    """
    path = _resolve(key_path, reference, environ)
    credential = None if os.path.isabs(reference) else reference
    value = load_secret_file(key_path, path, private=private, credential=credential)
    _check_use(key_path, path, value, use)
    return Secret(value, str(path))


def check_secret(
    key_path: str,
    reference: str,
    environ: Mapping[str, str] | None = None,
    *,
    use: SecretUse = "text",
) -> Path:
    """Check at load what :func:`read_secret` will read later, strictly: it resolves, is a
    private regular file and holds a secret its protocol (``use``) can carry. Returns the
    resolved path; raises ConfigError."""
    path = _resolve(key_path, reference, environ)
    credential = None if os.path.isabs(reference) else reference
    value = load_secret_file(key_path, path, private=True, credential=credential)
    _check_use(key_path, path, value, use)
    return path
