"""Code cites documents that ship with the project, by file and heading.

Comments and docstrings point at the design and at the outside facts as
``(docs/<name>.md, "<Heading>")``. These tests fail, naming file:line, when a
file under the scanned folders still cites a document that is not in the
repository (the old design and facts notes), when a reference names a file
under docs/ that does not exist or a heading that file does not have, and when
a reference is split across lines so that it cannot be checked.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("spark_watchdog", "bench", "tests", "deploy", "config", "scripts")
SKIPPED_DIRS = frozenset({"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"})

# Citations of documents outside the repository. Spelled in pieces so that
# this file, which is scanned too, does not match them itself.
STALE = ("DESIGN \N{SECTION SIGN}", "FACTS" + ".md", "FACTS" + ' "')

# docs/facts.md, "NVML on GB10"  ->  ("docs/facts.md", "NVML on GB10")
REFERENCE = re.compile(r'\b(docs/[\w./-]+?\.md), "([^"\n]+)"')
# A reference whose heading went to the next line: the scan cannot check it.
SPLIT_REFERENCE = re.compile(r'\bdocs/[\w./-]+?\.md,(?:\s*|\s*"[^"\n]*)$')

HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def text_files(root: Path) -> Iterator[Path]:
    """Every text file under the scanned folders of ``root``, in a stable order."""
    for folder in SCANNED:
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if not path.is_file() or SKIPPED_DIRS.intersection(path.relative_to(root).parts):
                continue
            data = path.read_bytes()
            if b"\0" in data[:8192]:
                continue
            try:
                data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            yield path


def lines_of(root: Path) -> Iterator[tuple[str, int, str]]:
    """(file relative to ``root``, line number, line) for every scanned line."""
    for path in text_files(root):
        where = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        for number, line in enumerate(text.splitlines(), start=1):
            yield where, number, line


def headings(doc: Path) -> list[str]:
    """The markdown headings of ``doc``, leaving out fenced code blocks."""
    found: list[str] = []
    fenced = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced and (match := HEADING.match(line)):
            found.append(match.group(1))
    return found


def stale_citations(root: Path) -> list[str]:
    """``file:line: text`` for each line that cites a document not in the repository."""
    return [
        f"{where}:{number}: {line.strip()}"
        for where, number, line in lines_of(root)
        if any(stale in line for stale in STALE)
    ]


def broken_references(root: Path) -> list[str]:
    """``file:line: why`` for each reference that names no existing file and heading."""
    cache: dict[str, list[str] | None] = {}
    problems: list[str] = []
    for where, number, line in lines_of(root):
        if SPLIT_REFERENCE.search(line):
            problems.append(
                f'{where}:{number}: reference split across lines (keep docs/<name>.md, "<Heading>"'
                f" on one line): {line.strip()}"
            )
        for doc_name, wanted in REFERENCE.findall(line):
            if doc_name not in cache:
                doc = root / doc_name
                cache[doc_name] = headings(doc) if doc.is_file() else None
            found = cache[doc_name]
            if found is None:
                problems.append(f"{where}:{number}: {doc_name} does not exist")
            elif not any(wanted in heading for heading in found):
                problems.append(f'{where}:{number}: {doc_name} has no heading with "{wanted}"')
    return problems


def references(root: Path) -> list[tuple[str, str]]:
    return [pair for _, _, line in lines_of(root) for pair in REFERENCE.findall(line)]


def test_no_citation_of_documents_outside_the_repository() -> None:
    found = stale_citations(ROOT)
    assert not found, "cites a document that is not in the repository:\n" + "\n".join(found)


def test_every_reference_names_an_existing_doc_and_heading() -> None:
    problems = broken_references(ROOT)
    assert not problems, "broken doc references:\n" + "\n".join(problems)


def test_the_code_does_cite_the_docs() -> None:
    # A scan that finds nothing (a wrong root, a changed form) would pass the
    # tests above without checking anything.
    cited = {doc for doc, _ in references(ROOT)}
    assert {"docs/design.md", "docs/facts.md"} <= cited


# --- the checks themselves can fail -------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "facts.md").write_text(
        "# Facts\n\n## vLLM\n\n### Safe configs\n\n```\n## Not a heading\n```\n",
        encoding="utf-8",
    )
    (tmp_path / "spark_watchdog").mkdir()
    return tmp_path


def _write(root: Path, name: str, text: str) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def test_a_stale_citation_is_reported_with_file_and_line(tree: Path) -> None:
    _write(tree, "spark_watchdog/a.py", "x = 1\n# restart order (" + STALE[0] + "5)\n")
    _write(tree, "deploy/rules.yml", "# see " + STALE[1] + "\n")
    _write(tree, "tests/t.py", '"""What a GB10 answers (' + STALE[2] + 'GB10")."""\n')
    found = stale_citations(tree)
    assert [f.split(": ", 1)[0] for f in found] == [
        "spark_watchdog/a.py:2",
        "tests/t.py:1",
        "deploy/rules.yml:1",
    ]


def test_a_reference_to_a_missing_heading_or_file_is_reported(tree: Path) -> None:
    # Put together here so that the scan of this very file does not see them.
    facts, design = "docs/" + "facts.md", "docs/" + "design.md"
    _write(
        tree,
        "spark_watchdog/a.py",
        f'# ok ({facts}, "Safe configs"), ({facts}, "vLLM")\n'
        f'# ({facts}, "Not a heading")\n'
        f'# ({design}, "Verdicts")\n'
        f"# split ({facts},\n"
        '# "Safe configs")\n',
    )
    problems = broken_references(tree)
    assert [p.split(": ", 1)[0] for p in problems] == [
        "spark_watchdog/a.py:2",
        "spark_watchdog/a.py:3",
        "spark_watchdog/a.py:4",
    ]
    assert 'no heading with "Not a heading"' in problems[0]
    assert "docs/design.md does not exist" in problems[1]
    assert "split across lines" in problems[2]


def test_binary_files_are_not_scanned(tree: Path) -> None:
    (tree / "tests").mkdir()
    (tree / "tests" / "blob.journal").write_bytes(b"\0\0" + STALE[1].encode())
    assert stale_citations(tree) == []
