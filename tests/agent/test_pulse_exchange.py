"""A pulse exchange read as the peers write it: a peer's pulse client's request
is a plain GET the server answers on its lean path (spark_watchdog/http/lean.py
``lean_get``), the pulse it carries reaches ``pulse_in``, and the client reads
the server's answer (probes/pulse.py ``_complete``) header by header, as it
reads any HTTP/1 answer. The pulse itself is read by one match where it is in
the agent's own form (``parse_pulse``), exactly as its JSON reading reads it,
on what the real writers write and on thousands of mutations of it."""

from __future__ import annotations

import random
from typing import Any

import pytest

from spark_watchdog.http.handler import Routes, json_response
from spark_watchdog.http.lean import lean_get
from spark_watchdog.probes import pulse as pulse_module
from spark_watchdog.probes.pulse import OwnPulse, PulseClient, judge, parse_pulse, pulse_bytes

BOOT = "3f1c" * 8
ADDRESS = ("198.51.100.3", 40000)


def _mutations(seed: int, original: bytes, count: int) -> list[bytes]:
    """``original`` with one to three bytes replaced, inserted or removed."""
    rng = random.Random(seed)
    alphabet = b' \t\r\n:?/"\\{}0123456789aAzZ-,.\x00\xff'
    out = []
    for _ in range(count):
        data = bytearray(original)
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(data) + 1)
            kind = rng.choice(("replace", "insert", "remove"))
            byte = alphabet[rng.randrange(len(alphabet))]
            if kind == "insert" or at == len(data):
                data.insert(at, byte)
            elif kind == "replace":
                data[at] = byte
            else:
                del data[at]
        out.append(bytes(data))
    return out


def _routes(heard: list[tuple[bytes, Any]]) -> Routes:
    def pulse() -> tuple[int, str, bytes]:
        return json_response({"node": "spark-1", "seq": 9, "boot_id": BOOT})

    def state() -> tuple[int, str, bytes]:
        return 503, "application/json", b'{"error": "starting"}\n'

    return Routes(
        {"/v1/pulse": pulse, "/v1/state": state},
        pulse_in=lambda value, address: heard.append((value, address)),
    )


def _client_request(url: str, carried: bytes | None) -> bytes:
    """The bytes a peer agent's pulse client sends."""
    client = PulseClient("spark-1", url, 0.5, None if carried is None else (lambda: carried))
    return client._request()


CARRIED = pulse_bytes("spark-2", 41, BOOT)
REQUESTS = [
    _client_request("http://198.51.100.1:9101", CARRIED),
    _client_request("http://198.51.100.1:9101", None),
    _client_request("http://[fd00::1]:9101/", CARRIED),
    _client_request("http://spark-1.fabric:9101/base", CARRIED),  # /base/v1/pulse: no such route
]


@pytest.mark.parametrize("request_bytes", REQUESTS)
def test_what_a_peer_s_client_sends_is_a_plain_get_answered_on_the_lean_path(
    request_bytes: bytes,
) -> None:
    heard: list[tuple[bytes, Any]] = []
    answer = lean_get(request_bytes, _routes(heard), ADDRESS)
    if b"/base/" in request_bytes:
        assert answer is None  # a path that is no route: the full path's 404
        return
    assert answer is not None and answer.startswith(b"HTTP/1.1 200 OK\r\n")
    assert heard == ([(CARRIED, ADDRESS)] if b"Pulse:" in request_bytes else [])


def _random_pulse(rng: random.Random) -> bytes:
    letters = 'abz-._09 "\\/é\u2603\t'
    node = "".join(rng.choice(letters) for _ in range(rng.randint(0, 12)))
    seq = rng.choice([0, 1, 7, 10**17, 10**18 + 3, 2**63])
    boot: str | None = rng.choice([None, BOOT, "", "x" * 64, "x" * 65, 'a"b', "\u00e9"])
    run: str | None = rng.choice([None, "0123456789abcdef", "", "r" * 65, 'r"n', "\u00e9"])
    return pulse_bytes(node, seq, boot, run)


def test_a_pulse_is_read_by_one_match_as_json_reads_it() -> None:
    rng = random.Random(7)
    written = [_random_pulse(rng) for _ in range(2000)]
    written.append(pulse_bytes("spark-2", 41, BOOT))
    own = OwnPulse("spark-4", lambda: (12, BOOT), "0123456789abcdef")
    written.append(own.encoded())
    written.append(OwnPulse("spark-4", lambda: (12, BOOT)).encoded())  # an agent naming no run
    matched = 0
    for body in written + _mutations(8, CARRIED, 2000):
        if pulse_module._WRITTEN.fullmatch(body) is not None:
            matched += 1
        assert parse_pulse(body) == pulse_module._parse_any_pulse(body), body
    assert matched > 500
    assert parse_pulse(own.encoded()) == ("spark-4", 12, BOOT, "0123456789abcdef")
    # A seq past 18 digits is no pulse, in any form (a forged one blinds no peer).
    assert parse_pulse(b'{"node":"a","seq":' + b"9" * 31 + b',"boot_id":"b"}') is None
    assert parse_pulse(b'{"node": "a", "seq": 1000000000000000000, "boot_id": "b"}') is None


def _agent_answer(seq: int, boot_id: str | None = BOOT, run: str | None = "5eed") -> bytes:
    """What an agent's server answers to a pulse request: its own pulse, one line."""
    own = OwnPulse("spark-1", lambda: (seq, boot_id), run)

    def pulse() -> tuple[int, str, bytes]:
        return 200, "application/json", own.line()

    answer = lean_get(REQUESTS[0], Routes({"/v1/pulse": pulse}), ADDRESS)
    assert answer is not None
    return answer


@pytest.mark.parametrize(
    ("seq", "boot_id", "run"), [(9, BOOT, "5eed"), (0, None, "5eed"), (10**17, BOOT, None)]
)
def test_the_client_reads_the_agent_s_answer_once_it_is_whole(
    seq: int, boot_id: str | None, run: str | None
) -> None:
    answer = _agent_answer(seq, boot_id, run)
    for cut in range(len(answer)):  # an answer arriving in pieces
        assert pulse_module._complete(answer[:cut]) is None, cut
    complete = pulse_module._complete(answer)
    assert complete is not None
    status, body, close = complete
    assert (status, close) == (200, False)
    assert judge("spark-1", status, body) == ("ok", ("spark-1", seq, boot_id, run), None)
    # What follows the answer (the start of another) is not read as its body.
    assert pulse_module._complete(answer + b"HTTP/1.1 2") == (200, body, True)
