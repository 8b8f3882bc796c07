"""Whether this host is the Spark a controller on the Sparks was told it runs on.

A controller started with the wrong ``--node`` (a drop-in copied from the
other Spark) would take its own host for another node's and could cut it:
the one thing a controller on a Spark never does. So before it starts, one of
the node's configured addresses (its agent's host, its ``ssh_host``, its
controller URLs) must be an address of this host
(docs/design.md, "Controllers on the Sparks").
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

import psutil

from spark_watchdog.config.colocated import controller_urls
from spark_watchdog.config.controller import ControllerConfig

Resolve = Callable[[str], set[str]]


def local_addresses() -> set[str]:
    """Every IP address on this host's interfaces."""
    found = set()
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family in (socket.AF_INET, socket.AF_INET6):
                found.add(_plain(address.address))
    return found


def resolve(host: str) -> set[str]:
    """The addresses ``host`` names (itself, for an address); none when it does not resolve."""
    try:
        return {_plain(str(info[4][0])) for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):
        return set()


def _plain(address: str) -> str:
    """An address without its IPv6 zone, in one spelling."""
    try:
        return str(ipaddress.ip_address(address.split("%", 1)[0]))
    except ValueError:
        return address


def node_hosts(config: ControllerConfig, node: str) -> list[str]:
    """The hosts the config reaches ``node`` at."""
    config_node = config.node(node)
    hosts = [urlsplit(config_node.agent).hostname, config_node.ssh_host]
    assert config.colocated is not None
    for placed in config.colocated.controllers:
        if placed.node == node:
            urls = controller_urls(placed, config_node.agent, config.listen.port)
            hosts += [urlsplit(u).hostname for u in urls]
    return [h for h in dict.fromkeys(hosts) if h]


def not_here(
    config: ControllerConfig,
    node: str,
    here: Iterable[str] | None = None,
    resolver: Resolve = resolve,
) -> str | None:
    """Why this host is not ``node`` (None: one of its addresses is this host's)."""
    mine = set(local_addresses() if here is None else here)
    hosts = node_hosts(config, node)
    for host in hosts:
        if resolver(host) & mine:
            return None
    return (
        f"this host has none of {node}'s addresses ({', '.join(hosts)}): --node names "
        "another Spark, or the config reaches this one at an address it does not have; "
        "a controller that took its own host for another node's could cut it"
    )
