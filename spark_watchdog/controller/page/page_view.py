"""What the operator's page shows of each node beyond ``/v1/status``: the age
of each signal, the power path, and the serving profile asked for against
the one in force (``GET /v1/nodes``, docs/page.md).

Built on the controller's event loop (``page_api`` hands the call over), so
it reads the nodes' watches between two steps of a sweep, never in the
middle of one; nothing here writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol
from urllib.parse import urlsplit

from spark_watchdog.config.controller import ControllerConfig, NodeConfig
from spark_watchdog.controller.look.peer_evidence import Sighting
from spark_watchdog.history.records import KNOWN_INCIDENT_KINDS
from spark_watchdog.verdicts import for_the_page

# The power device settings the page shows: where the path goes, never a secret's file.
_DEVICE_FIELDS = ("type", "host", "port", "outlet", "outlets", "url", "ups", "device")


class WatchLike(Protocol):
    """What the page reads of a node's watch (controller/look/node_watch.py)."""

    config: NodeConfig
    snapshot: dict[str, Any] | None
    agent_answer_at: float | None
    banner_ok_at: float | None
    ssh_alive_at: float | None
    banner_checked_at: float | None
    peer_seen: Sighting | None

    def agent_silent_s(self, now: float) -> float: ...


def _age(now: float, at: float | None) -> float | None:
    return None if at is None else round(max(0.0, now - at), 2)


def _iso_seconds(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _section(value: Any, *keys: str) -> Mapping[str, Any]:
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    return value if isinstance(value, Mapping) else {}


def probe_ages(snapshot: Mapping[str, Any] | None, answered_age: float | None) -> dict[str, Any]:
    """Each probe's age as the controller sees it: how old the agent's last
    answer is, plus how old the probe's reading was in that answer (both on
    the node's clock, so a skewed clock does not count)."""
    ages: dict[str, Any] = {}
    sent_at = _iso_seconds(_section(snapshot).get("observed_at"))
    for probe in ("gpu", "vllm", "journal", "host"):
        observed = _iso_seconds(_section(snapshot, "probes", probe).get("observed_at"))
        if answered_age is None or sent_at is None or observed is None:
            ages[probe] = None
        else:
            ages[probe] = round(answered_age + max(0.0, sent_at - observed), 2)
    return ages


def _bare_url(url: str) -> str:
    """Scheme, host and path only: a URL may carry a user, a password or a key."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "(not shown)"
    return f"{parts.scheme}://{host}{port}{parts.path}"


def power_path(node: NodeConfig) -> list[dict[str, Any]]:
    """The node's power devices in the order tried, each by type and address."""
    path = []
    for device in node.power:
        shown = {}
        for key in _DEVICE_FIELDS:
            value = getattr(device, key, None)
            if key == "url" and isinstance(value, str):
                value = _bare_url(value)
            if value is not None:
                shown[key] = list(value) if isinstance(value, tuple) else value
        path.append(shown)
    return path


def serving_of(snapshot: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the node's agent says of its rank: the profile it runs, what was
    asked of vLLM and what vLLM reports in force."""
    serving = _section(snapshot, "serving")
    return {
        "state": serving.get("state"),
        "profile": serving.get("profile"),
        "requested": serving.get("requested"),
        "effective": serving.get("effective"),
        "effective_matches_profile": serving.get("effective_matches_profile"),
    }


def node_view(watch: WatchLike, now: float) -> dict[str, Any]:
    answered = _age(now, watch.agent_answer_at)
    return {
        "name": watch.config.name,
        "signals": {
            "agent_progress": round(watch.agent_silent_s(now), 2),
            "agent_answer": answered,
            "ssh_banner": _age(now, watch.banner_ok_at),
            "ssh_any": _age(now, watch.ssh_alive_at),
            # The freshest sighting over another path: a peer's pulse, the head's engine.
            "peers": None if watch.peer_seen is None else _age(now, watch.peer_seen.at),
            **probe_ages(watch.snapshot, answered),
        },
        "power": power_path(watch.config),
        "serving": serving_of(watch.snapshot),
    }


def nodes_view(
    config: ControllerConfig,
    watches: Iterable[WatchLike],
    now: float,
    profile: str | None,
    breaker_open: bool,
) -> dict[str, Any]:
    """``GET /v1/nodes``: every node, the profile the controller asks for,
    whether the circuit breaker is open (nothing is fenced; it latches into a
    cluster hold after ``guards.breaker_latch_after``), and the vocabularies
    the page draws with: each verdict's colour and words, the incident kinds."""
    return {
        "breaker_open": breaker_open,
        "serving_profile": {
            "asked": profile,
            "safe_profile": config.serving.safe_profile,
            "head": config.serving.head,
        },
        "nodes": [node_view(w, now) for w in watches],
        "verdicts": for_the_page(),
        "incident_kinds": list(KNOWN_INCIDENT_KINDS),
    }
