"""What the rank really runs: its effective ``cudagraph_mode`` and
``enable_adaptive_verification``, read from the engine's own startup line
(docs/design.md, "Serving restart").

vLLM's engine core prints ``Initializing a V1 LLM engine (vX) with config:
... speculative_config=..., compilation_config=...``. Some builds silently
force FULL_AND_PIECEWISE while adaptive verification is on (vllm #56626), so
what the argv asked for is not proof of what runs. Only the log written since
the start is read, incrementally and in bounded chunks (:class:`LogScanner`),
whatever runtime the rank runs in.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from spark_watchdog.profiles import (
    COMPILATION_FLAG,
    CUDAGRAPH_MODE_BY_VALUE,
    SPECULATIVE_FLAG,
    EffectiveConfig,
    flag_json,
    normalise_cudagraph_mode,
)

# Bounds on reading the serving log: per status call, and for one line. vLLM's
# config line is a few KB; a rank that floods its log must not stall the agent.
LOG_READ_LIMIT = 256 * 1024
LOG_LINE_LIMIT = 1024 * 1024

# --- the effective config, from the rank's startup line ------------------------

# The line that carries the engine's resolved config. V1 prints "Initializing a
# V1 LLM engine (v0.10.0) with config: ...", V0 "Initializing an LLM engine ...".
_CONFIG_LINE = "with config:"
# The key on its own: not the tail of another (draft_cudagraph_mode, a.cudagraph_mode).
_KEY = r"""(?<![\w.])['"]?{}['"]?\s*[:=]\s*"""
# The mode is read from the compilation config when the line names one: another
# part of the line (a draft model's own config) may carry a mode of its own.
_COMPILATION_SECTION = re.compile(r"""['"]?compilation_config['"]?\s*[:=]""")
# Three shapes seen in vLLM's config line across versions:
#   'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>   (repr, v0.11+)
#   "cudagraph_mode":[2,1]                                          (JSON, v0.10)
#   cudagraph_mode=CUDAGraphMode.PIECEWISE / "cudagraph_mode":"FULL"
_MODE_NAME = re.compile(
    _KEY.format("cudagraph_mode") + r"""['"]?<?(?:CUDAGraphMode\.)?([A-Z][A-Z_]+)\b"""
)
_MODE_VALUE = re.compile(
    _KEY.format("cudagraph_mode") + r"(\[\s*\d\s*,\s*\d\s*\]|\(\s*\d\s*,\s*\d\s*\)|\d)(?!\d)"
)
_ADAPTIVE = re.compile(_KEY.format("enable_adaptive_verification") + r"(True|False|true|false)\b")


def parse_effective(line: str) -> EffectiveConfig | None:
    """The effective config in one log line, or None if it is not a config line."""
    if _CONFIG_LINE not in line:
        return None
    mode: str | None = None
    section = _COMPILATION_SECTION.search(line)
    where = line[section.end() :] if section is not None else line
    named = _MODE_NAME.search(where)
    if named is not None:
        mode = named.group(1)
    else:
        valued = _MODE_VALUE.search(where)
        if valued is not None:
            mode = CUDAGRAPH_MODE_BY_VALUE.get(re.sub(r"[\s\[\]()]", "", valued.group(1)))
    adaptive_match = _ADAPTIVE.search(line)
    adaptive = None if adaptive_match is None else adaptive_match.group(1).lower() == "true"
    return EffectiveConfig(mode, adaptive)


def requested_config(argv: list[str]) -> EffectiveConfig:
    """What ``argv`` asks vLLM for, in the terms :func:`parse_effective` reports."""
    compilation = flag_json(argv, COMPILATION_FLAG) or {}
    speculative = flag_json(argv, SPECULATIVE_FLAG) or {}
    mode = compilation.get("cudagraph_mode")
    adaptive = speculative.get("enable_adaptive_verification")
    return EffectiveConfig(
        normalise_cudagraph_mode(mode) if mode is not None else None,
        adaptive if isinstance(adaptive, bool) else None,
    )


class LogScanner:
    """Reads a log from ``offset`` on, a bounded chunk per :meth:`poll`, and keeps
    the last effective config line seen. A log that shrank was rotated or
    truncated: reading starts again at its beginning."""

    def __init__(
        self,
        path: Path,
        offset: int,
        read_limit: int = LOG_READ_LIMIT,
        line_limit: int = LOG_LINE_LIMIT,
    ) -> None:
        self.path = path
        self.offset = offset
        self.read_limit = read_limit
        self.line_limit = line_limit
        self.effective = EffectiveConfig()
        self._partial = b""
        self._skipping = False  # inside a line longer than line_limit

    def poll(self) -> None:
        try:
            with self.path.open("rb") as handle:
                size = os.fstat(handle.fileno()).st_size
                if size < self.offset:
                    self.offset, self._partial, self._skipping = 0, b"", False
                handle.seek(self.offset)
                chunk = handle.read(self.read_limit)
        except OSError:
            return  # gone or unreadable: status says what it knew
        self.offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            if self._skipping:
                self._skipping = False
                continue
            self._scan(raw)
        if len(self._partial) > self.line_limit:
            self._partial, self._skipping = b"", True

    def _scan(self, raw: bytes) -> None:
        if _CONFIG_LINE.encode() not in raw:
            return
        found = parse_effective(raw.decode("utf-8", "replace"))
        if found is not None:
            self.effective = found
