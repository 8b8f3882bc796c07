"""The controller's witness: can it still reach the network it fences on?

If the controller cannot reach its witness targets (the gateway, the PDU),
a silent node more likely means the controller lost the network, and
fencing would cut power to healthy hosts (docs/design.md, "Verdicts"). No
fencing then.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class WitnessReport:
    ok: bool
    reached: tuple[str, ...]
    missed: tuple[str, ...]


async def _reach(target: str, timeout: float) -> bool:
    parts = urlsplit(target)
    try:
        _, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname, parts.port), timeout
        )
    except (OSError, asyncio.TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def check_witness(targets: Sequence[str], timeout: float = 1.0) -> WitnessReport:
    """OK when at least one target answers; no targets configured counts as OK."""
    if not targets:
        return WitnessReport(True, (), ())
    results = await asyncio.gather(*(_reach(t, timeout) for t in targets))
    reached = tuple(t for t, ok in zip(targets, results, strict=True) if ok)
    missed = tuple(t for t, ok in zip(targets, results, strict=True) if not ok)
    return WitnessReport(bool(reached), reached, missed)
