"""Read a YAML config file, turning every failure into a ConfigError."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from spark_watchdog.errors import ConfigError


def read_yaml(path: str | Path) -> Any:
    """Parse ``path``; a missing file or a YAML syntax error is a ConfigError."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, ["file not found; pass an existing --config FILE"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, [f"cannot read the file: {exc}"]) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [f"{where}not valid YAML ({problem})"]) from None
