"""Who may act through the operator's page: the controller's token, and only
from the page's own origin.

The token comes from ``listen.token_file`` (a file or a systemd credential
name, :mod:`spark_watchdog.config.secrets`), read once at start. An action
must carry it in ``Authorization: Bearer <token>`` (RFC 6750 §2.1), never in
a cookie, which a browser would send with a request forged by another site;
such a request also carries that site's ``Origin``, refused here. A token in
a URL (any part of it, however encoded) is refused on every path: URLs end
up in browser history, proxies' logs and ``Referer`` headers. The token is
compared in constant time and never appears in an answer, a log line or a
repr.
"""

from __future__ import annotations

from email.message import Message

from spark_watchdog.bearer import bearer_problem, credential_in_target, token_matcher
from spark_watchdog.config.secrets import Secret

# Fetch metadata (sent by every current browser): a request another site made.
_FOREIGN_SITES = frozenset({"cross-site", "same-site"})


class PageAuth:
    """Checks an action's headers; ``None`` token: actions are off."""

    __slots__ = ("_token",)

    def __init__(self, token: Secret | None) -> None:
        value = None if token is None else token.reveal().strip().encode()
        self._token = value or None

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def token_in_query(self, query: str) -> bool:
        """True when the query string carries a credential (a parameter named
        like one, ``Bearer …``, the token's value under any name), however
        encoded: :func:`spark_watchdog.bearer.credential_in_target`."""
        if not query:
            return False
        token = self._token
        return credential_in_target("?" + query, None if token is None else token_matcher(token))

    def foreign_origin(self, headers: Message) -> str | None:
        """Why the request comes from another origin than the page's; None when it does not."""
        site = (headers.get("Sec-Fetch-Site") or "").strip().lower()
        if site in _FOREIGN_SITES:
            return f"the request comes from another site (Sec-Fetch-Site: {site})"
        origin = headers.get("Origin")
        if origin is None:
            return None  # not a browser's cross-origin request (curl, the CLI)
        host = (headers.get("Host") or "").strip().lower()
        if origin.strip().lower() not in (f"http://{host}", f"https://{host}"):
            return f"Origin {origin.strip()[:100]!r} is not this controller's"
        return None

    def check(self, authorization: str | None) -> str | None:
        """None when the header carries the token; otherwise why not, without a
        word about the token itself."""
        if self._token is None:
            return "no token configured"
        return bearer_problem(authorization, self._token)

    def __repr__(self) -> str:
        return f"PageAuth({'<token hidden>' if self._token else 'no token'})"
