"""The bearer-token check that the agent's serving endpoints and the
controller's page share (RFC 6750 §2.1: ``Authorization: Bearer <token>``).

The token is compared in constant time (``hmac.compare_digest``), so the time
a wrong guess takes says nothing about how much of it was right; the reason
given for a refusal never says a word about the token itself.
"""

from __future__ import annotations

import hmac

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
