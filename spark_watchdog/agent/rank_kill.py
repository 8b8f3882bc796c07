"""Kill a vLLM rank this agent did not start: every process group that holds a
process matching ``probes.vllm.process_match``.

The whole group, because the rank is an API server, an engine core and its
workers, and killing only one leaves the others holding the GPU's memory
(docs/design.md, "Serving restart"). The agent's own group, the init group
(1) and the session-less group 0 are never signalled.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import psutil


class _ProcessEntry(Protocol):
    info: dict[str, Any]


def matching_groups(
    match: str,
    proc_iter: Callable[[list[str]], Iterable[_ProcessEntry]] = psutil.process_iter,
    getpgid: Callable[[int], int] = os.getpgid,
) -> dict[int, list[int]]:
    """Process group id -> pids of the live processes in it whose command line has ``match``."""
    if not match:
        raise ValueError("match: expected a non-empty command-line fragment")
    me = os.getpid()
    spared = {0, 1, getpgid(me)}
    groups: dict[int, list[int]] = {}
    for entry in proc_iter(["pid", "cmdline", "status"]):
        info = entry.info
        pid = info.get("pid")
        if not isinstance(pid, int) or pid == me or info.get("status") == psutil.STATUS_ZOMBIE:
            continue
        if match not in " ".join(info.get("cmdline") or []):
            continue
        try:
            pgid = getpgid(pid)
        except (ProcessLookupError, PermissionError):
            continue
        if pgid not in spared:
            groups.setdefault(pgid, []).append(pid)
    return groups


def kill_groups(
    groups: dict[int, list[int]], killpg: Callable[[int, int], None] = os.killpg
) -> list[dict[str, Any]]:
    """SIGKILL each group; what was sent where, with the error when it could not be."""
    sent: list[dict[str, Any]] = []
    for pgid, pids in sorted(groups.items()):
        record: dict[str, Any] = {"pgid": pgid, "pids": sorted(pids)}
        try:
            killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            record["error"] = "gone before the signal"
        except PermissionError as exc:
            record["error"] = f"not permitted: {exc.strerror or exc}"
        sent.append(record)
    return sent
