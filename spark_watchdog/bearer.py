"""The bearer-token check that the agent's serving endpoints and the
controller's page share (RFC 6750 §2.1: ``Authorization: Bearer <token>``).

The token is compared in constant time (``hmac.compare_digest``), so the time
a wrong guess takes says nothing about how much of it was right; the reason
given for a refusal never says a word about the token itself.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Callable
from urllib.parse import unquote_plus

# RFC 7235 §2.1: the auth scheme is case-insensitive.
_SCHEME = "bearer"


def bearer_problem(authorization: str | None, token: bytes) -> str | None:
    """None when ``authorization`` (the header's value) carries ``token``;
    otherwise why not."""
    if not authorization:
        return "missing Authorization: Bearer header"
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != _SCHEME or not credentials.strip():
        return "expected Authorization: Bearer <token>"
    # compare_digest on bytes of different lengths still takes time that
    # depends only on the length of the given value, not on its content.
    if not hmac.compare_digest(credentials.strip().encode(), token):
        return "invalid bearer token"
    return None


# -- a token in a URL ------------------------------------------------------------
#
# A URL stays in browser histories, proxy logs and Referer headers, so a
# credential in one is refused on every path (docs/page.md, "The token"),
# wherever in the target it hides: a path segment or its ``;name=value``
# parameters, any query parameter's name or value, the fragment, userinfo,
# percent-encoded once or many times, in any letter case.

# A name holding one of these (letters and digits only, lower case) names a credential.
_CREDENTIAL_WORDS = (
    "token",
    "auth",
    "bearer",
    "apikey",
    "password",
    "passwd",
    "secret",
    "credential",
)
_CREDENTIAL_NAMES = frozenset({"key", "pw", "pwd", "jwt", "sig", "signature"})
# A value that is an Authorization header's credentials (RFC 7235 §2.1).
_SCHEME_CREDENTIALS = re.compile(r"(?i)\b(?:bearer|basic)\s+\S")
_USERINFO = re.compile(r"(?i)^[a-z][a-z0-9+.-]*://[^/?#]*@")
_NOT_NAME = re.compile(r"[^a-z0-9]+")
# No client of these servers encodes a URL more than twice; a target that
# still decodes to something else after this many rounds hides what it holds.
_DECODING_ROUNDS = 8

# The refusal: it names no part of the URL.
TOKEN_IN_URL = (
    "a token never goes in a URL (browser history, proxy logs and Referer keep URLs); "
    "send it in an Authorization: Bearer header"
)


def decoded_target(target: str) -> str | None:
    """``target`` percent-decoded (``+`` as a space) until nothing changes;
    None when it still changes after ``_DECODING_ROUNDS`` rounds."""
    text = target
    for _ in range(_DECODING_ROUNDS):
        plain = unquote_plus(text, errors="replace")
        if plain == text:
            return text
        text = plain
    return None


def target_parts(text: str) -> list[tuple[str, str]]:
    """Every (name, value) a decoded request target carries: each path
    segment and its ``;`` parameters, each query and fragment parameter
    (split at ``&`` and ``;``), and the whole path, query and fragment as
    values of their own. A part with no ``=`` is a value with no name."""
    rest, _, fragment = text.partition("#")
    path, _, query = rest.partition("?")
    parts = [("", path), ("", query), ("", fragment)]
    pieces = [p for segment in path.split("/") for p in segment.split(";")]
    pieces += re.split(r"[&;]", query) + re.split(r"[&;]", fragment)
    for piece in pieces:
        name, equals, value = piece.partition("=")
        parts.append((name, value) if equals else ("", name))
    return parts


def credential_named(name: str) -> bool:
    """True when a URL parameter's name can only be a credential's."""
    compact = _NOT_NAME.sub("", name.lower())
    return compact in _CREDENTIAL_NAMES or any(word in compact for word in _CREDENTIAL_WORDS)


def credential_in_target(target: str, is_secret: Callable[[str], bool] | None = None) -> bool:
    """True when the request target ``target`` carries a credential: a part
    named like one, a value with an auth scheme (``Bearer …``), userinfo, a
    part ``is_secret`` recognises (the server's own token, compared in
    constant time), or more layers of percent-encoding than any client uses."""
    text = decoded_target(target)
    if text is None or _USERINFO.match(text):
        return True
    for name, value in target_parts(text):
        if credential_named(name) or _SCHEME_CREDENTIALS.search(value):
            return True
        if is_secret is not None and (is_secret(name) or is_secret(value)):
            return True
    return False


def token_matcher(token: bytes) -> Callable[[str], bool]:
    """Whether a part of a URL is ``token`` (stripped, compared in constant time)."""

    def is_token(text: str) -> bool:
        stripped = text.strip()
        return bool(stripped) and hmac.compare_digest(stripped.encode(errors="replace"), token)

    return is_token
