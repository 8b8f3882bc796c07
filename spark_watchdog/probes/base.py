"""What every probe's report has in common."""

from __future__ import annotations

from typing import Any, Protocol


class ProbeReport(Protocol):
    """A probe's observation: a ``state`` word plus JSON-ready details."""

    @property
    def state(self) -> str: ...

    def to_json(self) -> dict[str, Any]:
        """A JSON-serialisable mapping that includes ``"state"``."""
        ...
