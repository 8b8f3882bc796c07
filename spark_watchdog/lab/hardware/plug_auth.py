"""How the plug stand-in (lab/hardware/plug_standin.py) checks credentials, as
the plugs do: HTTP digest with SHA-256 (Shelly Gen2+, RFC 7616), HTTP Basic
(Shelly Gen1), a user and password in the query (Tasmota)."""

from __future__ import annotations

import base64
import hashlib
import hmac
from urllib.request import parse_http_list, parse_keqv_list


def digest_fields(header: str | None) -> dict[str, str] | None:
    """The fields of a ``Digest`` Authorization header (None: not one)."""
    if not header or not header.lower().startswith("digest "):
        return None
    return parse_keqv_list(parse_http_list(header[len("digest ") :]))


def digest_ok(
    fields: dict[str, str], method: str, uri: str, realm: str, user: str, password: str
) -> bool:
    """The digest answers the challenge for ``user``/``password`` (its nonce checked apart)."""
    if fields.get("username") != user:
        return False
    if fields.get("realm") != realm or fields.get("uri") != uri:
        return False
    if fields.get("qop") != "auth" or fields.get("algorithm", "SHA-256") != "SHA-256":
        return False

    def sha256(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    ha1 = sha256(f"{user}:{realm}:{password}")
    ha2 = sha256(f"{method}:{uri}")
    expected = sha256(
        f"{ha1}:{fields.get('nonce', '')}:{fields.get('nc', '')}:{fields.get('cnonce', '')}"
        f":auth:{ha2}"
    )
    return hmac.compare_digest(expected, fields.get("response", ""))


def basic_ok(header: str | None, user: str, password: str) -> bool:
    """An HTTP Basic Authorization header for ``user``/``password``."""
    if not header or not header.lower().startswith("basic "):
        return False
    try:
        decoded = base64.b64decode(header[len("basic ") :], validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return False
    given_user, _, given = decoded.partition(":")
    return given_user == user and hmac.compare_digest(given.encode(), password.encode())


def query_credentials_ok(query: dict[str, list[str]], user: str, password: str) -> bool:
    """``user`` and ``password`` in the query string, as Tasmota takes them."""
    given_user = query.get("user", [""])[0]
    given = query.get("password", [""])[0]
    return given_user == user and hmac.compare_digest(given, password)
