"""Every seed and every kept finding of every fuzz target runs clean.

A kept finding (tests/fuzz/corpus/<target>/finding-*) is the input that once
made its parser raise something undocumented; it must stay fixed.
"""

from __future__ import annotations

import pytest

from bench.fuzz_targets import TARGETS, check, corpus, seeds

CASES = [(name, label, data) for name in TARGETS for label, data in seeds(name)]


@pytest.mark.parametrize(
    ("name", "label", "data"), CASES, ids=[f"{n}/{lab}" for n, lab, _ in CASES]
)
def test_stored_input_runs_clean(name: str, label: str, data: bytes) -> None:
    finding = check(TARGETS[name], data)
    assert finding is None, f"{name}/{label}: {type(finding).__name__}: {finding}"


def test_every_target_has_seeds_and_the_findings_are_kept() -> None:
    for name in TARGETS:
        assert seeds(name), f"no seeds for {name}"
    kept = [label for name in TARGETS for label, _ in corpus(name) if label.startswith("finding-")]
    assert kept, "the fixed findings are kept as examples in tests/fuzz/corpus"
