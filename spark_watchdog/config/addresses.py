"""Addresses, host names, ports and URLs, parsed when the config is loaded.

Each check raises :class:`~spark_watchdog.config.schema.InvalidSetting` naming
the key, so a bad value is a config error with its key path (exit 2), never a
traceback from ``urllib`` at the first request, and never a string handed on
to ``bind()``, ``ipmitool -H`` or ``ssh`` that is not an address at all.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import SplitResult, urlsplit

from spark_watchdog.config.schema import InvalidSetting

# RFC 1123 host names: dot-separated labels of letters, digits and '-', not
# starting or ending with '-', at most 63 characters each and 253 in all.
# "_" is not in RFC 1123, but names in /etc/hosts carry it and resolve; it is allowed.
_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")


def is_ip_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_host_name(text: str) -> bool:
    name = text[:-1] if text.endswith(".") else text
    if not name or len(name) > 253:
        return False
    labels = name.split(".")
    # An all-numeric dotted name (10.0.0.300) is a mistyped address, not a name.
    if all(label.isdigit() for label in labels):
        return False
    return all(_LABEL.match(label) for label in labels)


def check_host(key: str, host: str) -> None:
    """An IP address (IPv4, IPv6 without brackets) or a host name."""
    if is_ip_address(host) or is_host_name(host):
        return
    raise InvalidSetting(
        key,
        f'expected an IP address or a host name (letters, digits, "-" and "."), got "{host}"',
    )


def check_bind_address(key: str, address: str) -> None:
    """Where a server listens: an IP address (0.0.0.0 or :: for every interface) or a
    host name that resolves to one of this host's addresses (localhost)."""
    if is_ip_address(address) or is_host_name(address):
        return
    raise InvalidSetting(
        key,
        "expected an IP address to listen on (127.0.0.1, the management network's "
        f'address, 0.0.0.0 or ::) or a host name, got "{address}"',
    )


def _split(key: str, url: str, expected: str) -> SplitResult:
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise InvalidSetting(
            key, f"expected {expected} without spaces or control characters, got {url!r}"
        )
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed [
        raise InvalidSetting(key, f'expected {expected}, got "{url}" ({exc})') from None
    try:
        port = parts.port
    except ValueError:  # not a number, or out of 0-65535
        port = 0
    if port == 0:
        raise InvalidSetting(key, f'expected a port from 1 to 65535, got "{url}"')
    host = parts.hostname
    if not host:
        raise InvalidSetting(key, f'expected {expected}, got "{url}"')
    bracketed = parts.netloc.rpartition("@")[2].startswith("[")
    if bracketed:
        if ":" not in host or not is_ip_address(host):
            raise InvalidSetting(key, f'expected an IPv6 address inside [ ], got "{url}"')
    elif not (is_ip_address(host) and ":" not in host) and not is_host_name(host):
        raise InvalidSetting(
            key, f'expected {expected} with an IP address or a host name, got "{url}"'
        )
    return parts


def check_http_url(key: str, url: str, *, base: bool = True) -> None:
    """An ``http(s)://host[:port]`` URL. ``base``: the start of other URLs (an agent,
    a device, Alertmanager), so no query and no fragment; otherwise (a webhook) a
    query is allowed."""
    expected = "an http(s)://host[:port] URL"
    parts = _split(key, url, expected)
    if parts.scheme not in ("http", "https"):
        raise InvalidSetting(key, f'expected {expected}, got "{url}"')
    if parts.fragment or (base and parts.query):
        what = "a fragment (#…)" if parts.fragment else "a query (?…)"
        raise InvalidSetting(key, f'expected {expected} without {what}, got "{url}"')


def check_tcp_target(key: str, target: str) -> None:
    """``tcp://host:port``: a witness the controller connects to."""
    expected = "tcp://host:port"
    parts = _split(key, target, expected)
    if parts.scheme != "tcp" or parts.port is None or parts.path not in ("", "/"):
        raise InvalidSetting(key, f'expected {expected} (port 1 to 65535), got "{target}"')
    if parts.query or parts.fragment:
        raise InvalidSetting(key, f'expected {expected}, got "{target}"')
