"""What the CLI prints from outside reaches the terminal escaped (spark_watchdog/terminal.py):
a hold reason typed on the page cannot retitle, clear or forge a line; errors
are redacted and escaped, and name no library's internals."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
import requests
from hypothesis import given
from hypothesis import strategies as st
from web_tier import start_page_controller, wait_until

from spark_watchdog.cli import say
from spark_watchdog.cli.main import main
from spark_watchdog.errors import ConfigError, Refused
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.terminal import escape, escape_lines

EVIL = "\x1b]0;pwned\x07\x1b[2J\rspark-2 healthy"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J\\rspark-2 healthy"
BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}
MARKS = {"\u200e", "\u200f", "\u061c", "\u2028", "\u2029"}


def _unsafe(text: str, allowed: str = "") -> list[str]:
    """Every character of ``text`` that a terminal would act on rather than show."""
    return [
        c
        for c in text
        if c not in allowed and (unicodedata.category(c) == "Cc" or c in BIDI or c in MARKS)
    ]


def _assert_no_forged_line(out: str) -> None:
    assert _unsafe(out, "\n") == [], out
    assert SHOWN in out
    # The forged text stays inside the hold's own line.
    assert not any(line.lstrip().startswith("spark-2 healthy") for line in out.splitlines())


def test_status_from_the_history_prints_a_hold_reason_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "history.db"
    with HistoryStore(db) as store:
        store.hold("spark-2", EVIL, by="page")
    code = main(["status", "--db", str(db), "--url", "http://127.0.0.1:9"])
    out, _ = capsys.readouterr()
    assert code == 0
    _assert_no_forged_line(out)
    assert f"hold spark-2: {SHOWN}" in out
    # JSON was already escaped by json.dumps, and stays as it was.
    main(["status", "--db", str(db), "--url", "http://127.0.0.1:9", "--json"])
    shown = capsys.readouterr().out
    assert json.loads(shown)["holds"][0]["reason"] == EVIL
    assert _unsafe(shown, "\n") == []


def test_status_from_a_running_controller_prints_a_page_hold_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    controller = start_page_controller(tmp_path / "c", token="page-" + "5" * 32, nodes=2)
    try:
        answer = requests.post(
            controller.url + "/v1/actions/hold",
            json={"node": "spark-2", "reason": EVIL},
            headers=controller.auth(),
            timeout=20,
        )
        assert answer.status_code == 200, answer.text

        def held() -> bool:
            status = requests.get(controller.url + "/v1/status", timeout=20).json()
            return any(n.get("held_reason") == EVIL for n in status["nodes"])

        wait_until(held, 60, "the page's hold in the controller's status")
        capsys.readouterr()
        main(["status", "--url", controller.url])
        out, _ = capsys.readouterr()
    finally:
        controller.thread.stop()
    assert "source: controller" in out
    _assert_no_forged_line(out)
    assert f"[held: {SHOWN}]" in out


def test_history_show_and_hold_print_outside_text_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "history.db"
    with HistoryStore(db) as store:
        incident = store.open_incident(
            "host_frozen", ["spark-3"], detected_at=1e9, evidence={"reasons": [EVIL]}
        )
        store.add_step(incident.id, "off_requested", node="spark-3")
    main(["show", str(incident.id), "--db", str(db)])
    out, _ = capsys.readouterr()
    assert _unsafe(out, "\n") == [] and f"evidence  {SHOWN}" in out
    main(["hold", "spark-3", "--reason", EVIL, "--db", str(db)])
    out, _ = capsys.readouterr()
    assert out == f"held spark-3: {SHOWN}\n"


def test_a_cli_error_is_redacted_escaped_and_plain(capsys: pytest.CaptureFixture[str]) -> None:
    url = "http://admin:hunter2@ctl\x1b]0;x\x07:notaport/?access_token=abc123"
    code = main(["status", "--url", url])
    _, err = capsys.readouterr()
    assert code == 2
    assert "hunter2" not in err and "abc123" not in err
    assert _unsafe(err, "\n") == [] and "\\x1b]0;x\\x07" in err
    assert err.startswith("spark-watchdog: --url http://***@ctl")


def test_errors_name_no_library_internals_and_keep_a_config_error_s_lines() -> None:
    kasa = Refused(
        "kasa plug spark-1",
        "_RetryableError: Unable to query the device 10.0.0.5:9999: 0 bytes read",
    )
    assert say.shown_error(kasa) == [
        "kasa plug spark-1: Unable to query the device 10.0.0.5:9999: 0 bytes read"
    ]
    config = ConfigError("c.yaml", ["power[0].url: http://u:pw@pdu\x1b[2J/x", "nodes: empty"])
    assert say.shown_error(config) == [
        "c.yaml: 2 problem(s):",
        "  power[0].url: http://***@pdu\\x1b[2J/x",
        "  nodes: empty",
    ]


@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_escaped_text_holds_no_control_bidi_or_line_break(text: str) -> None:
    one_line = escape(text)
    assert _unsafe(one_line) == []
    assert len(one_line.splitlines()) <= 1
    assert _unsafe(escape_lines(text), "\n\t") == []


@given(st.text(alphabet=st.characters(exclude_categories=["Cc", "Cf", "Zl", "Zp"]), max_size=200))
def test_printable_text_is_shown_as_it_is(text: str) -> None:
    assert escape(text) == text == escape_lines(text)
