"""How the stand-in plug's request handlers (lab/hardware/plug_standin.py,
plug_tasmota.py) end a request: one answer, or a connection closed without
a word."""

from __future__ import annotations


class Answer(Exception):
    """Raised inside a handler to send one answer: JSON, or plain text for a str."""

    def __init__(self, status: int, body: object, headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = headers or {}


class NoAnswer(Exception):
    """Raised inside a handler to close the connection without a word."""
