"""Where a request's head ends in the bytes a connection has sent so far.

The HTTP server (:mod:`spark_watchdog.http.server`) reads every connection
without blocking and keeps what has arrived; this tells it whether to wait for
more, to hand the bytes to the request handler, or to refuse a head that will
never fit. The limits are http.server's own (a line of at most 65,536 bytes,
at most 100 header lines), checked as the bytes come, so the handler answers
the same errors it always did, and a head that breaks one is answered at once
instead of being waited for. docs/design.md, "The HTTP servers".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# http.server reads the request line, and http.client each header line, with
# readline(65537): a longer line is a 414 or a 431.
MAX_LINE_BYTES = 65536
# http.client's limit on header lines.
MAX_HEADERS = 100
# A whole head, request line and headers; a connection holds at most this
# much before its request is in. Real heads (the controller's poll, a
# Prometheus scrape, curl) are a few hundred bytes.
MAX_HEAD_BYTES = 2 * MAX_LINE_BYTES


class Scan(enum.Enum):
    PARTIAL = "partial"  # no verdict yet: wait for more bytes
    WHOLE = "whole"  # the head ends at `end`
    BROKEN = "broken"  # it breaks a line rule: the handler answers from the bytes as they are
    TOO_LARGE = "too large"  # past MAX_HEAD_BYTES without its end: refuse it


@dataclass(frozen=True)
class HeadScan:
    scan: Scan
    # Where the head ends (WHOLE), just past its empty line.
    end: int = 0
    # Where the request line ends, just past its newline (WHOLE).
    line_end: int = 0


_PARTIAL = HeadScan(Scan.PARTIAL)
_BROKEN = HeadScan(Scan.BROKEN)
_TOO_LARGE = HeadScan(Scan.TOO_LARGE)


def scan_head(data: bytes | bytearray) -> HeadScan:
    """Whether ``data`` (what a connection sent since its last request) holds
    a whole request head, a broken one, or not yet either."""
    line_end = data.find(b"\n")
    if line_end < 0:
        return _BROKEN if len(data) > MAX_LINE_BYTES else _PARTIAL
    if line_end + 1 > MAX_LINE_BYTES or len(data[:line_end].split()) != 3:
        # Too long, or not METHOD PATH VERSION (HTTP/0.9, garbage, a blank
        # line): http.server answers these from the request line alone.
        return _BROKEN
    start = line_end + 1
    headers = 0
    while True:
        end = data.find(b"\n", start)
        if end < 0:
            if len(data) - start > MAX_LINE_BYTES:
                return _BROKEN
            return _TOO_LARGE if len(data) > MAX_HEAD_BYTES else _PARTIAL
        line = data[start : end + 1]
        if len(line) > MAX_LINE_BYTES:
            return _BROKEN
        if line in (b"\r\n", b"\n"):
            if end + 1 > MAX_HEAD_BYTES:
                return _TOO_LARGE
            return HeadScan(Scan.WHOLE, end + 1, line_end + 1)
        headers += 1
        if headers > MAX_HEADERS:
            return _BROKEN
        start = end + 1
