"""Text from outside, made safe to print on a terminal or write in a log line. Pure.

A hold reason typed on the page, a node name, an agent's answer, a history
record or a device's error can carry control characters: ESC sequences that
retitle or clear a terminal, a carriage return that overwrites the line with
a forged one, bidi overrides that show text in another order than it is.
Every one of them is written visibly instead (docs/bad-input.md):

- C0 controls, DEL and C1 controls as ``\\xNN`` (``\\n``, ``\\r``, ``\\t`` by
  their names), so ``\\x1b]0;pwned\\x07`` reads as those characters;
- bidi embeddings, overrides and isolates (U+202A to U+202E, U+2066 to U+2069), the
  directional marks (U+200E, U+200F, U+061C) and the line and paragraph
  separators (U+2028, U+2029) as ``\\uNNNN``.

:func:`escape` is for a value put into a line: it escapes newlines too, so a
value never starts a line of its own. :func:`escape_lines` is for a whole
text whose newlines (and tabs) the program wrote itself.
"""

from __future__ import annotations

import re
from typing import Any, TextIO

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
_UNSAFE = "\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069"
_ANY_UNSAFE = re.compile(f"[{_UNSAFE}]")


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape(value: Any) -> str:
    """``str(value)`` with every control, bidi and line-breaking character
    written visibly: one line, shown as it is."""
    return _ANY_UNSAFE.sub(_visible, str(value))


def escape_lines(text: str) -> str:
    """``text`` with every control, bidi and line-breaking character written
    visibly except its newlines and tabs (the program's own line breaks)."""
    return _ANY_UNSAFE.sub(lambda m: m.group() if m.group() in "\n\t" else _visible(m), text)


class EscapedStream:
    """A text stream (stdout, stderr) that writes everything through
    :func:`escape_lines`: whatever a command prints, no control character
    reaches the terminal but the newlines and tabs it wrote."""

    def __init__(self, inner: TextIO) -> None:
        self._inner = inner

    @property
    def inner(self) -> TextIO:
        return self._inner

    def write(self, text: str) -> int:
        self._inner.write(escape_lines(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def unescaped(stream: TextIO) -> TextIO:
    """The stream under an :class:`EscapedStream` (``stream`` itself otherwise),
    for the program's own terminal controls (a progress line that erases itself)."""
    return stream.inner if isinstance(stream, EscapedStream) else stream
