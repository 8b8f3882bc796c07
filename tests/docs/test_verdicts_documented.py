"""Every verdict of the verdict table (spark_watchdog/verdicts.py) is documented,
and the page carries no list of its own.

A new verdict is a row in the table, the detector's rule, and these docs:
docs/design.md's "Verdicts", the verdict metric in docs/observability.md and
the API's enum in docs/api/controller.openapi.yaml. Each test fails naming
what a new row left out.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from spark_watchdog.verdicts import TABLE, Colour

ROOT = Path(__file__).resolve().parents[2]


def section(doc: str, heading: str) -> str:
    text = (ROOT / "docs" / doc).read_text()
    found = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## )", text, re.S | re.M)
    assert found is not None, f"docs/{doc} has no section {heading!r}"
    return found.group(1)


def missing_in(text: str) -> list[str]:
    return [r.name for r in TABLE if f"`{r.name}`" not in text]


def test_design_s_verdicts_name_every_verdict() -> None:
    assert not missing_in(section("design.md", "Verdicts")), "docs/design.md, Verdicts"


def test_a_verdict_left_out_of_the_design_is_found() -> None:
    text = section("design.md", "Verdicts").replace("`gpu_fault`", "gpu fault")
    assert missing_in(text) == ["gpu_fault"]


def test_the_verdict_metric_names_every_label() -> None:
    row = next(
        line
        for line in (ROOT / "docs" / "observability.md").read_text().splitlines()
        if line.startswith("| `spark_watchdog_node_verdict` |")
    )
    listed = re.search(r"\(([a-z_, ]+)\) \|$", row)
    assert listed is not None, row
    assert listed.group(1).split(", ") == [r.name for r in TABLE if r.metric]


def test_the_api_s_verdict_enum_is_the_table() -> None:
    doc = yaml.safe_load((ROOT / "docs" / "api" / "controller.openapi.yaml").read_text())
    schema = doc["components"]["schemas"]["Node"]["properties"]["verdict"]
    assert schema["enum"] == [r.name for r in TABLE]
    colours = doc["components"]["schemas"]["Nodes"]["properties"]["verdicts"]
    assert colours["additionalProperties"]["properties"]["colour"]["enum"] == [
        c.value for c in Colour
    ]


@pytest.mark.parametrize("name", ["page.js", "index.html"])
def test_the_page_keeps_no_list_of_verdicts(name: str) -> None:
    """Its colours and words come with /v1/nodes; a node state it words (booting,
    held) is no verdict list."""
    text = (ROOT / "spark_watchdog" / "controller" / "page" / "web" / name).read_text()
    quoted = [r.name for r in TABLE if not r.node_state and re.search(rf"[\"'>]{r.name}\b", text)]
    assert not quoted
