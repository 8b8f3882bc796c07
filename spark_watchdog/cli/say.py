"""How the CLI prints an error: one place, so every command's errors read the same.

Every message is redacted first (URL userinfo, credential parameters, auth
schemes' credentials: :func:`spark_watchdog.redact.plain_error`, which also
drops libraries' private exception names) and then escaped for the terminal
(:func:`spark_watchdog.terminal.escape`): a node name, a device's answer or a
path from outside cannot move the cursor, retitle the terminal or start a
line of its own. A config error keeps its own layout, one problem a line.
"""

from __future__ import annotations

import sys
from typing import TextIO

from spark_watchdog.errors import ConfigError
from spark_watchdog.redact import plain_error
from spark_watchdog.terminal import escape

PROGRAM = "spark-watchdog"


def shown_error(error: BaseException | str) -> list[str]:
    """The lines that say ``error``: redacted, escaped, each its own line."""
    text = plain_error(str(error))
    if isinstance(error, ConfigError):
        return [escape(line) for line in text.split("\n")]
    return [escape(text)]


def error(error: BaseException | str, stream: TextIO | None = None) -> None:
    """Print ``error`` on stderr as ``spark-watchdog: ...``."""
    lines = shown_error(error)
    out = sys.stderr if stream is None else stream
    print(f"{PROGRAM}: {lines[0]}", *lines[1:], sep="\n", file=out)
