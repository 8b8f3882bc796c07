"""What a launch hands on to Docker, checked when the config is loaded
(docs/serving.md, "Checked at load"), so that a bad value is a config error
naming its key (exit 2), never a refusal from the Docker Engine or its SDK in
the middle of an incident that names no key at all. (A NUL byte in any
string is the schema's to refuse, for every key.)

- Sizes are read with Docker's own grammar (``docker run --shm-size 16g``):
  a number, then ``b``, ``k``, ``m``, ``g`` or ``t`` (binary multiples; an
  ``i`` and a ``b`` may follow), within documented bounds.
- An image reference follows Docker's grammar (distribution's reference:
  lower-case path components, an optional registry host and port, tag and
  digest).
- A container user is ``NAME|UID[:GROUP|GID]``.
"""

from __future__ import annotations

import re

from spark_watchdog.config.schema import InvalidSetting

KIB = 1024
# /dev/shm below a MiB is a mistyped unit (Docker's own default is 64m); above a
# TiB is more than any node has memory.
SHM_SIZE_MIN = KIB**2
SHM_SIZE_MAX = KIB**4

_SIZE = re.compile(r"^(\d{1,15})(?:\.(\d{1,9}))? ?([bkmgt])?(i?)(b?)$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": KIB, "m": KIB**2, "g": KIB**3, "t": KIB**4}

# distribution/reference's grammar (the one the Docker Engine applies).
_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|-+)"
_PATH_COMPONENT = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_NAME = rf"(?:{_HOST}(?::[0-9]{{1,5}})?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"^(?P<name>{_NAME})(?::{_TAG})?(?:@{_DIGEST})?$")
_NAME_MAX = 255

_USER_PART = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}"
_USER = re.compile(rf"^{_USER_PART}(?::{_USER_PART})?$")


def size_bytes(key: str, text: str, minimum: int, maximum: int) -> int:
    """A size in Docker's grammar (``16g``, ``512m``, ``1.5GiB``), in bytes.

    :raises InvalidSetting: not such a size, or outside ``minimum``..``maximum``.
    """
    bounds = f"from {_shown_size(minimum)} to {_shown_size(maximum)}"
    match = _SIZE.match(text)
    if match is None:
        raise InvalidSetting(
            key,
            "expected a size as Docker reads it: a number, then b, k, m, g or t "
            f'(binary multiples; e.g. 16g), {bounds}, got "{printable(text)}"',
        )
    whole, fraction, unit, _, _ = match.groups()
    scale = _UNITS[(unit or "").lower()]
    value = int(whole) * scale + (int(fraction) * scale // 10 ** len(fraction) if fraction else 0)
    if not minimum <= value <= maximum:
        raise InvalidSetting(key, f'expected a size {bounds}, got "{text}"')
    return value


def _shown_size(size: int) -> str:
    for unit in ("t", "g", "m", "k"):
        if size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return f"{size}b"


def check_image_reference(key: str, text: str) -> None:
    """:raises InvalidSetting: ``text`` is not an image reference Docker accepts."""
    match = _REFERENCE.match(text)
    if match is None or len(match.group("name")) > _NAME_MAX:
        raise InvalidSetting(
            key,
            "expected an image reference as Docker reads it, [REGISTRY[:PORT]/]NAME[:TAG]"
            "[@DIGEST] with a lower-case NAME (e.g. nvcr.io/nvidia/vllm:25.11-py3), "
            f'got "{printable(text)}"',
        )


def check_container_user(key: str, text: str) -> None:
    """:raises InvalidSetting: ``text`` is not Docker's ``NAME|UID[:GROUP|GID]``."""
    if not _USER.match(text):
        raise InvalidSetting(
            key,
            "expected a user as docker run --user takes it, NAME or UID, optionally "
            f':GROUP or :GID (e.g. 1000:1000 or vllm), got "{printable(text)}"',
        )


def printable(text: str) -> str:
    """``text`` for an error message: control characters escaped, at most 200 characters."""
    shown = text if len(text) <= 200 else text[:200] + "…"
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in shown)
