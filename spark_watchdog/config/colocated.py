"""Controllers on the Sparks themselves: their order, and how long the next one waits.

One config is shared by every Spark; which node a controller runs on comes
from ``spark-watchdog controller --node`` (default: the host's short name).
The rules these settings feed are written in docs/design.md, "Controllers on the Sparks".
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from spark_watchdog.config.addresses import check_http_url
from spark_watchdog.config.schema import InvalidSetting, setting

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")

# Below this a later controller's wait may not cover the first one's last look
# and command (docs/design.md, "Controllers on the Sparks").
MIN_FENCE_DELAY_S = 10.0


@dataclass(frozen=True, kw_only=True)
class PlacedController:
    """One controller of the order: the node it runs on, and where it is heard."""

    node: str = setting()
    # Every path the others hear it on: its management address and, where the
    # Sparks are cabled, its fabric one. None: http://<its agent's host>:<listen.port>.
    urls: tuple[str, ...] | None = setting(None)

    def __post_init__(self) -> None:
        if not _NODE_NAME.match(self.node):
            raise InvalidSetting("node", f'expected a node name, got "{self.node}"')
        if self.urls is not None:
            if not self.urls:
                raise InvalidSetting("urls", "expected at least one URL, or leave it out")
            for i, url in enumerate(self.urls):
                check_http_url(f"urls[{i}]", url)
                if "@" in (urlsplit(url).netloc or ""):
                    raise InvalidSetting(
                        f"urls[{i}]",
                        "expected no user or password: the other controllers ask its "
                        "/v1/status without one, and the URL is shown there",
                    )


@dataclass(frozen=True, kw_only=True)
class ColocatedConfig:
    # The controllers, in order of responsibility: for each node, the first
    # listed that does not run on it acts for it.
    controllers: tuple[PlacedController, ...] = setting()
    # Seconds every controller before the next has been silent, on every URL,
    # before the next one acts in its place.
    takeover_after: float = setting(30.0, above=0, maximum=3600)
    # Seconds a controller waits before it acts on a node that runs a controller
    # placed before it: in mutual suspicion the earlier one acts first.
    fence_delay: float = setting(20.0, minimum=MIN_FENCE_DELAY_S, maximum=3600)

    def __post_init__(self) -> None:
        if not self.controllers:
            raise InvalidSetting("controllers", "expected at least one controller")
        seen: dict[str, int] = {}
        for i, placed in enumerate(self.controllers):
            if placed.node in seen:
                raise InvalidSetting(
                    f"controllers[{i}].node",
                    f'"{placed.node}" already has place {seen[placed.node] + 1} in the order '
                    f"(controllers[{seen[placed.node]}]): one place per controller",
                )
            seen[placed.node] = i
        if self.takeover_after < self.fence_delay:
            raise InvalidSetting(
                "takeover_after",
                f"expected at least fence_delay ({self.fence_delay:g} s), "
                f"got {self.takeover_after:g}",
            )

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(p.node for p in self.controllers)


def controller_urls(placed: PlacedController, agent: str, port: int) -> tuple[str, ...]:
    """Where the controller on ``placed.node`` is heard: its urls, else its agent's
    host (``agent``: its agent's URL) on the listen port ``port``."""
    if placed.urls is not None:
        return placed.urls
    host = urlsplit(agent).hostname or ""
    shown = f"[{host}]" if ":" in host else host
    return (f"http://{shown}:{port}",)


@dataclass(frozen=True)
class Around:
    """What the rest of the controller's config says that the order is checked against."""

    nodes: Mapping[str, tuple[str, str | None]]  # name -> (agent URL, ssh_host)
    freeze_after: float
    listen_address: str
    listen_port: int
    witness: tuple[str, ...]
    postgres: bool  # the history is a PostgreSQL one (the pair's)


def check_colocated(colocated: ColocatedConfig, around: Around) -> None:
    """The order against the nodes, the timings, the listen address and the witness."""
    if around.postgres:
        raise InvalidSetting(
            "colocated",
            "controllers on the Sparks keep each its own history file; the PostgreSQL "
            "pair is the other way to run two controllers: choose one",
        )
    _check_order(colocated, list(around.nodes))
    least = around.freeze_after + colocated.fence_delay
    if colocated.takeover_after < least:
        raise InvalidSetting(
            "colocated.takeover_after",
            f"expected at least detection.freeze_after + colocated.fence_delay ({least:g} s): "
            "the next controller must not take over before the first one's cut has landed, "
            f"got {colocated.takeover_after:g}",
        )
    address = around.listen_address
    if address == "localhost" or _loopback(address):
        raise InvalidSetting(
            "listen.address",
            f"{address} is this host only, so the other controllers would never "
            "hear this one and would act in its place: listen on the node's address or 0.0.0.0",
        )
    _check_witness(colocated, around)


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _check_order(colocated: ColocatedConfig, names: list[str]) -> None:
    for i, placed in enumerate(colocated.controllers):
        if placed.node not in names:
            raise InvalidSetting(
                f"colocated.controllers[{i}].node",
                f'expected one of the node names ({", ".join(names)}), got "{placed.node}"',
            )
    for i, name in enumerate(names):
        if not [c for c in colocated.order if c != name]:
            raise InvalidSetting(
                "colocated.controllers",
                f"nothing could recover {name} (nodes[{i}]): its own controller is the only "
                "one, and a controller never cuts its own host; add a controller on another node",
            )


def _check_witness(colocated: ColocatedConfig, around: Around) -> None:
    """No witness on a controller node's own address: it cannot witness its own isolation."""
    own_hosts: dict[str, str] = {}
    for placed in colocated.controllers:
        agent, ssh_host = around.nodes[placed.node]
        hosts = [urlsplit(agent).hostname, ssh_host]
        hosts += [urlsplit(u).hostname for u in controller_urls(placed, agent, around.listen_port)]
        for host in hosts:
            if host:
                own_hosts.setdefault(host.lower(), placed.node)
    for i, target in enumerate(around.witness):
        host = (urlsplit(target).hostname or "").lower()
        if host in own_hosts:
            raise InvalidSetting(
                f"witness[{i}]",
                f"{host} is {own_hosts[host]}'s own address, and {own_hosts[host]} runs a "
                "controller: a node cannot witness its own isolation; name the gateway or "
                "the power device",
            )
