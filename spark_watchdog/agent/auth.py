"""The bearer token that guards the agent's serving endpoints.

The controller sends ``Authorization: Bearer <token>`` (RFC 6750 §2.1) on every
``POST /v1/serving/*``. The token comes from ``serving.token_file`` (a file or
a systemd credential name, see :mod:`spark_watchdog.config.secrets`), read once
at start. It is compared in constant time (``hmac.compare_digest``), so the
time a wrong guess takes says nothing about how much of it was right, and it
never appears in a log line, an error or a repr.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from spark_watchdog.config.secrets import Secret, read_secret

# RFC 7235 §2.1: the auth scheme is case-insensitive.
_SCHEME = "bearer"


class BearerAuth:
    """Checks an ``Authorization`` header against the configured token."""

    __slots__ = ("_token",)

    def __init__(self, token: Secret) -> None:
        self._token = token.reveal().strip().encode()
        if not self._token:
            raise ValueError("the serving token is empty")

    @classmethod
    def from_file(cls, reference: str, environ: Mapping[str, str] | None = None) -> BearerAuth:
        """Read ``serving.token_file``; raises ConfigError naming the key, never the token."""
        return cls(read_secret("serving.token_file", reference, environ))

    def check(self, authorization: str | None) -> str | None:
        """None when the header carries the token; otherwise why not, without any
        word about the token itself."""
        if not authorization:
            return "missing Authorization: Bearer header"
        scheme, _, credentials = authorization.strip().partition(" ")
        if scheme.lower() != _SCHEME or not credentials.strip():
            return "expected Authorization: Bearer <token>"
        # compare_digest on bytes of possibly different lengths still takes time
        # that depends only on the length of the given value, not the content.
        if not hmac.compare_digest(credentials.strip().encode(), self._token):
            return "invalid bearer token"
        return None

    def __repr__(self) -> str:
        return "BearerAuth(<token hidden>)"
