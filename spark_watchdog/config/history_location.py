"""Where the controller keeps its freeze history: ``history:`` is the path of
an SQLite file, or a ``postgresql://`` URL (docs/design.md, "Freeze history").

A URL never holds the password (a URL shows in process lists, logs and
``status``): it comes from ``history_password_file``, a file or a systemd
credential like every other secret.
"""

from __future__ import annotations

import urllib.parse

SCHEMES = ("postgresql", "postgres")


def is_postgres_url(location: str) -> bool:
    return urllib.parse.urlsplit(location).scheme in SCHEMES


def safe_url(location: str) -> str:
    """The URL as logs and errors show it: no password, no query."""
    parts = urllib.parse.urlsplit(location)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    user = f"{parts.username}@" if parts.username else ""
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ":?"
    return f"{parts.scheme}://{user}{host}{port}{parts.path}"


def check_url(location: str) -> list[str]:
    """What is wrong with a history URL (empty: nothing)."""
    parts = urllib.parse.urlsplit(location)
    problems = []
    if parts.scheme not in SCHEMES:
        problems.append(f"expected a postgresql:// URL, got scheme {parts.scheme!r}")
    if parts.password is not None or "password" in urllib.parse.parse_qs(parts.query):
        problems.append(
            "the URL holds a password; put it in a file and name it in "
            "history_password_file (a URL shows up in process lists and logs)"
        )
    if not parts.path.strip("/"):
        problems.append("the URL names no database (postgresql://user@host:5432/DATABASE)")
    try:
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as exc:
        problems.append(f"bad port: {exc}")
    return problems
