"""The bearer token that guards the agent's serving endpoints.

The controller sends ``Authorization: Bearer <token>`` (RFC 6750 §2.1) on every
``POST /v1/serving/*``. The token comes from ``serving.token_file`` (a file or
a systemd credential name, see :mod:`spark_watchdog.config.secrets`), read once
at start. It is compared in constant time (``hmac.compare_digest``), so the
time a wrong guess takes says nothing about how much of it was right, and it
never appears in a log line, an error or a repr.
"""

from __future__ import annotations

from collections.abc import Mapping

from spark_watchdog.bearer import bearer_problem
from spark_watchdog.config.secrets import Secret, read_secret


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
        return bearer_problem(authorization, self._token)

    def __repr__(self) -> str:
        return "BearerAuth(<token hidden>)"
