"""The one-match readers of a pulse exchange read exactly what their general
readers read: a peer's request (spark_watchdog/http/lean.py ``exact_get``
against ``lean_get``), the pulse it carries and the one answered
(probes/pulse.py ``parse_pulse`` against its JSON reading), and the agent's
answer head (``_complete`` against its header-by-header reading). Each is
checked on what the real client and server write, and on thousands of
mutations of it: the one match answers the same or leaves it to the general
reader."""

from __future__ import annotations

import json
import random
import re
from typing import Any

import pytest

from spark_watchdog.http.handler import Routes, json_response
from spark_watchdog.http.lean import exact_get, lean_get
from spark_watchdog.probes import pulse as pulse_module
from spark_watchdog.probes.pulse import OwnPulse, PulseClient, parse_pulse, pulse_bytes

BOOT = "3f1c" * 8
_DATE = re.compile(rb"Date: [^\r]*\r\n")
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
def test_what_a_peer_s_client_sends_is_answered_by_one_match_as_lean_get_answers_it(
    request_bytes: bytes,
) -> None:
    exact_heard: list[tuple[bytes, Any]] = []
    lean_heard: list[tuple[bytes, Any]] = []
    exact = exact_get(request_bytes, _routes(exact_heard), ADDRESS)
    lean = lean_get(request_bytes, _routes(lean_heard), ADDRESS)
    assert (exact is None) == (lean is None)
    if b"/base/" in request_bytes:
        assert exact is None  # a path that is no route: the full path's 404
        return
    assert exact is not None and lean is not None
    assert _DATE.sub(b"", exact) == _DATE.sub(b"", lean)
    assert exact_heard == lean_heard
    assert exact_heard == ([(CARRIED, ADDRESS)] if b"Pulse:" in request_bytes else [])


def test_a_mutated_request_is_answered_as_lean_get_answers_it_or_left_to_it() -> None:
    matched = 0
    for data in _mutations(34, REQUESTS[0], 3000):
        exact_heard: list[tuple[bytes, Any]] = []
        lean_heard: list[tuple[bytes, Any]] = []
        exact = exact_get(data, _routes(exact_heard), ADDRESS)
        if exact is None:
            assert not exact_heard, data
            continue
        matched += 1
        lean = lean_get(data, _routes(lean_heard), ADDRESS)
        assert lean is not None, data
        assert _DATE.sub(b"", exact) == _DATE.sub(b"", lean), data
        assert exact_heard == lean_heard, data
    assert 0 < matched < 3000  # some mutations keep the shape (a digit of the pulse), most do not


def test_a_server_that_screens_its_paths_is_never_answered_by_the_match() -> None:
    heard: list[tuple[bytes, Any]] = []
    routes = _routes(heard)
    screened = Routes(routes.get, paths_of=object(), pulse_in=routes.pulse_in)  # type: ignore[arg-type]
    assert exact_get(REQUESTS[0], screened, ADDRESS) is None
    assert heard == []


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


def _answer(seq: int) -> bytes:
    """What an agent's server answers to a pulse request."""
    heard: list[tuple[bytes, Any]] = []
    answer = exact_get(REQUESTS[0], _routes(heard), ADDRESS)
    assert answer is not None
    return answer.replace(b'"seq": 9', b'"seq": %d' % seq)


def _outcome(read: Any, data: bytes) -> Any:
    try:
        return read(data)
    except Exception as exc:  # the kind of failure must match too
        return type(exc)


def test_the_agent_s_answer_is_read_by_one_match_as_header_by_header() -> None:
    answer = _answer(9)
    assert pulse_module._AGENT_HEAD.match(answer) is not None
    complete = pulse_module._complete(answer)
    assert complete is not None and json.loads(complete[1])["seq"] == 9
    assert complete == pulse_module._complete_any(answer)
    # Every prefix (an answer arriving in pieces) and what may follow it.
    for data in [answer[:cut] for cut in range(len(answer))] + [answer + b"HTTP/1.1 2"]:
        assert _outcome(pulse_module._complete, data) == _outcome(
            pulse_module._complete_any, data
        ), data
    for data in _mutations(11, answer, 3000):
        assert _outcome(pulse_module._complete, data) == _outcome(
            pulse_module._complete_any, data
        ), data


def _agent_answer(seq: int, boot_id: str | None = BOOT, run: str | None = "5eed") -> bytes:
    """What an agent's server answers to a pulse request: its own pulse, one line."""
    own = OwnPulse("spark-1", lambda: (seq, boot_id), run)

    def pulse() -> tuple[int, str, bytes]:
        return 200, "application/json", own.line()

    answer = exact_get(REQUESTS[0], Routes({"/v1/pulse": pulse}), ADDRESS)
    assert answer is not None
    return answer


def _read_generally(data: bytes) -> Any:
    """What the header-by-header reader and the pulse reader make of ``data``."""
    complete = _outcome(pulse_module._complete_any, data)
    if not isinstance(complete, tuple):
        return complete
    status, body, close = complete
    return status, parse_pulse(body), close


def test_the_agent_s_whole_answer_is_read_by_one_match_as_generally() -> None:
    answers = [_agent_answer(9), _agent_answer(0, None), _agent_answer(10**17, run=None)]
    for answer in answers:
        pulse = pulse_module._agent_pulse(answer)
        assert pulse is not None
        assert _read_generally(answer) == (200, pulse, False)
    matched = 0
    candidates = [answers[0][:cut] for cut in range(len(answers[0]))]
    candidates += [answers[0] + b"HTTP/1.1 2", answers[0][:-1] + b" \n"]
    for data in candidates + _mutations(12, answers[0], 3000):
        pulse = pulse_module._agent_pulse(data)
        if pulse is None:
            continue  # left to the general reader
        matched += 1
        assert _read_generally(data) == (200, pulse, False), data
    assert 0 < matched < 3000  # a digit of the seq or the date may change; most else not
