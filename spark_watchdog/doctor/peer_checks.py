"""Controller: do the agents watch each other over a second path, and do they agree?

What the controller believes of a node it cannot reach comes from its peers
(docs/design.md, "Peers"). Each agent's ``/v1/state`` says whom it pulses and
through which address; this check reads them all and names what would leave
a broken management link looking like a freeze: no peers at all, a peer the
config does not know, a pulse that goes over the management address (not a
second path), and lists that disagree (A watches B, B does not watch A).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.look.http_client import HttpError, request
from spark_watchdog.doctor.controller_checks import AGENT_PATIENCE_S, state_url
from spark_watchdog.doctor.result import Finding, fail, ok, skip, warn

Snapshots = Mapping[str, Mapping[str, Any] | None]


async def check_peers(config: ControllerConfig) -> Finding:
    """Read every agent's state, then judge their peer lists together."""

    async def read(url: str) -> Mapping[str, Any] | None:
        try:
            body = (await request(url, timeout=AGENT_PATIENCE_S)).json()
        except (HttpError, ValueError):
            return None
        return body if isinstance(body, dict) else None

    states = await asyncio.gather(*(read(state_url(n)) for n in config.nodes))
    return judge_peers(config, {n.name: s for n, s in zip(config.nodes, states, strict=True)})


def _host(url: str) -> str | None:
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None


def judge_peers(config: ControllerConfig, snapshots: Snapshots) -> Finding:
    """The agents' peer lists, judged together (``None``: that agent did not answer)."""
    lists = _peer_lists(snapshots)
    if not any(lists.values()):
        return skip(
            "no agent watches its peers: a node whose management link breaks looks frozen "
            'and is power-cycled (docs/design.md, "Peers")'
        )
    management = {n.name: _host(n.agent) for n in config.nodes}
    unknown, same_path, one_way = [], [], []
    for node, peers in lists.items():
        for peer, via in peers.items():
            if peer not in management:
                unknown.append(f"{node} lists {peer}")
            elif via is not None and _host(via) == management[peer]:
                same_path.append(f"{node} pulses {peer} at {via}, its management address")
            elif snapshots.get(peer) is not None and node not in lists.get(peer, {}):
                one_way.append(f"{node} watches {peer}, {peer} does not watch {node}")
    if unknown:
        return fail(
            "peers that are not nodes of this config: " + "; ".join(unknown),
            "correct peers: in those agents' agent.yaml (each name a node of the controller's)",
        )
    if same_path or one_way:
        return warn(
            "; ".join(same_path + one_way),
            "give each agent every other node as a peer at its fabric address "
            "(ConnectX-7), not the management one",
        )
    watched = sum(len(p) for p in lists.values())
    return ok(f"{len([p for p in lists.values() if p])} agents watch {watched} peers")


def _peer_lists(snapshots: Snapshots) -> dict[str, dict[str, str | None]]:
    """Each answering agent's peers, by name, with the address it pulses them at."""
    lists: dict[str, dict[str, str | None]] = {}
    for node, snapshot in snapshots.items():
        if snapshot is None:
            continue
        peers = snapshot.get("peers")
        lists[node] = {}
        if not isinstance(peers, Mapping):
            continue
        for name, report in peers.items():
            via = report.get("via") if isinstance(report, Mapping) else None
            lists[node][str(name)] = via if isinstance(via, str) else None
    return lists
