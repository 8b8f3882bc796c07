"""Fixtures for every test."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_log_handler_outlives_its_test() -> Iterator[None]:
    """A CLI command run in-process installs spark_watchdog's root handler
    (spark_watchdog.logs.configure) on the stream pytest captured for that
    test; once the test ends the stream is closed, and a later test's log
    line would end in logging's "--- Logging error ---" traceback."""
    yield
    root = logging.getLogger()
    for handler in list(root.handlers):
        if getattr(handler, "_spark_watchdog", False):
            root.removeHandler(handler)
