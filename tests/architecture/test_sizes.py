"""The package stays readable in pieces (docs/architecture.md, "Where each kind of change goes").

Two lines per kind of piece. The hard limit nothing passes: a module of 800 lines, a class of
400, a function of 60. The review line is where a reviewer looks, and new code stays under
it: a module of 600 lines, a class of 300, a function of 45. What already passed the review
line when it was drawn is listed in size_baseline.txt, next to this file, with its size: it
may not grow, and the list only shrinks (an item that shrank asks for its entry to be
lowered, an item under the line again or gone asks for its entry to leave). Nothing sits
within 5 % of a hard limit either, so no piece is carved down to the line to fit.

Regenerate the list after a split (the diff is what the review reads):

    .venv/bin/python tests/architecture/test_sizes.py --write

or only the entries of the modules under some paths, the rest kept as listed:

    .venv/bin/python tests/architecture/test_sizes.py --write spark_watchdog/agent/

and without --write it prints the whole table it would write.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

PACKAGE = Path(__file__).resolve().parents[2] / "spark_watchdog"
BASELINE = Path(__file__).with_name("size_baseline.txt")
LIMITS = {"module": 800, "class": 400, "function": 60}
REVIEW_LINES = {"module": 600, "class": 300, "function": 45}
NEAR_LIMIT = 0.95


class Piece(NamedTuple):
    """A module, or a class or function in one by its qualified name (`Agent.run`)."""

    kind: str
    where: str

    def __str__(self) -> str:
        return f"{self.kind} {self.where}"


Sizes = dict[Piece, int]


def _pieces(body: list[ast.stmt], module: str, prefix: str) -> Iterator[tuple[Piece, int]]:
    for node in body:
        if isinstance(node, ast.ClassDef):
            kind = "class"
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kind = "function"
        else:
            # A def under an if or a try is still the module's or the class's own.
            yield from _pieces(_nested(node), module, prefix)
            continue
        name = f"{prefix}{node.name}"
        yield Piece(kind, f"{module}::{name}"), (node.end_lineno or node.lineno) - node.lineno + 1
        yield from _pieces(node.body, module, f"{name}.")


def _nested(node: ast.stmt) -> list[ast.stmt]:
    blocks: list[ast.stmt] = []
    for field in ("body", "orelse", "finalbody", "handlers"):
        for child in getattr(node, field, []):
            if isinstance(child, ast.ExceptHandler):
                blocks.extend(child.body)
            elif isinstance(child, ast.stmt):
                blocks.append(child)
    return blocks


def measure(root: Path = PACKAGE) -> Sizes:
    """Every module, class and function under root with its length in lines; two defs of one
    qualified name in a module (a property's getter and setter) count as the longer."""
    sizes: Sizes = {}
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        module = path.relative_to(root.parent).as_posix()
        sizes[Piece("module", module)] = len(source.splitlines())
        for piece, length in _pieces(ast.parse(source).body, module, ""):
            sizes[piece] = max(length, sizes.get(piece, 0))
    return sizes


def past_hard_limits(sizes: Mapping[Piece, int]) -> list[str]:
    return [
        f"{piece}: {size} lines, over {LIMITS[piece.kind]}"
        for piece, size in sorted(sizes.items())
        if size > LIMITS[piece.kind]
    ]


def near_hard_limits(sizes: Mapping[Piece, int]) -> list[str]:
    return [
        f"{piece}: {size} lines of {LIMITS[piece.kind]}"
        for piece, size in sorted(sizes.items())
        if size >= NEAR_LIMIT * LIMITS[piece.kind]
    ]


def past_review(sizes: Mapping[Piece, int]) -> Sizes:
    return {piece: size for piece, size in sizes.items() if size > REVIEW_LINES[piece.kind]}


def grown(sizes: Mapping[Piece, int], baseline: Mapping[Piece, int]) -> list[str]:
    """New pieces past the review line, and listed pieces longer than their entry."""
    found: list[str] = []
    for piece, size in sorted(past_review(sizes).items()):
        listed = baseline.get(piece)
        if listed is None:
            found.append(
                f"{piece}: {size} lines, past the review line of {REVIEW_LINES[piece.kind]}"
            )
        elif size > listed:
            found.append(f"{piece}: {size} lines, grown from {listed}")
    return found


def to_ratchet(sizes: Mapping[Piece, int], baseline: Mapping[Piece, int]) -> list[str]:
    """Entries to lower (their piece shrank) or to remove (under the line again, or gone)."""
    found: list[str] = []
    for piece, listed in sorted(baseline.items()):
        size = sizes.get(piece)
        if size is None:
            found.append(f"{piece}: gone, remove its entry")
        elif size <= REVIEW_LINES[piece.kind]:
            found.append(f"{piece}: {size} lines, under the review line: remove its entry")
        elif size < listed:
            found.append(f"{piece}: {size} lines, lower its entry from {listed}")
    return found


def format_baseline(sizes: Mapping[Piece, int]) -> str:
    lines = [
        "# Past the review line of tests/architecture/test_sizes.py: may shrink, never grow.",
        "# Regenerate: .venv/bin/python tests/architecture/test_sizes.py --write",
    ]
    past = past_review(sizes)
    for piece in sorted(past, key=lambda piece: (piece.where, piece.kind)):
        lines.append(f"{piece.kind:<8} {past[piece]:>4}  {piece.where}")
    return "\n".join(lines) + "\n"


def parse_baseline(text: str) -> Sizes:
    baseline: Sizes = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        kind, size, where = line.split()
        baseline[Piece(kind, where)] = int(size)
    return baseline


def test_no_module_class_or_function_passes_its_hard_limit() -> None:
    assert past_hard_limits(measure()) == [], "split these (one job each)"


def test_nothing_new_passes_the_review_line_and_nothing_listed_grows() -> None:
    found = grown(measure(), parse_baseline(BASELINE.read_text()))
    assert found == [], "split these along a responsibility, or make the case in review"


def test_the_baseline_only_shrinks() -> None:
    found = to_ratchet(measure(), parse_baseline(BASELINE.read_text()))
    assert found == [], f"ratchet {BASELINE.name} (python {Path(__file__).name} --write)"


def test_nothing_sits_within_5_percent_of_a_hard_limit() -> None:
    assert near_hard_limits(measure()) == []


def _write(root: Path, name: str, source: str) -> None:
    path = root / "pkg" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)


def _function(name: str, lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 1))
    return f"{indent}def {name}() -> None:\n{body}"


def test_a_function_is_measured_by_its_qualified_name(tmp_path: Path) -> None:
    _write(tmp_path, "a.py", "class Big:\n" + _function("run", 61, indent="    "))
    sizes = measure(tmp_path / "pkg")
    assert sizes[Piece("function", "pkg/a.py::Big.run")] == 61
    assert sizes[Piece("class", "pkg/a.py::Big")] == 62
    assert past_hard_limits(sizes) == ["function pkg/a.py::Big.run: 61 lines, over 60"]


def test_a_new_piece_past_the_review_line_is_found(tmp_path: Path) -> None:
    _write(tmp_path, "a.py", _function("fine", 45) + _function("long_one", 46))
    found = grown(measure(tmp_path / "pkg"), {})
    assert found == ["function pkg/a.py::long_one: 46 lines, past the review line of 45"]


def test_a_listed_piece_that_grew_is_found(tmp_path: Path) -> None:
    _write(tmp_path, "a.py", _function("long_one", 50))
    baseline = {Piece("function", "pkg/a.py::long_one"): 49}
    assert grown(measure(tmp_path / "pkg"), baseline) == [
        "function pkg/a.py::long_one: 50 lines, grown from 49"
    ]
    assert to_ratchet(measure(tmp_path / "pkg"), baseline) == []


def test_a_listed_piece_that_shrank_asks_for_its_entry_lowered(tmp_path: Path) -> None:
    _write(tmp_path, "a.py", _function("long_one", 48))
    baseline = {Piece("function", "pkg/a.py::long_one"): 50}
    assert grown(measure(tmp_path / "pkg"), baseline) == []
    assert to_ratchet(measure(tmp_path / "pkg"), baseline) == [
        "function pkg/a.py::long_one: 48 lines, lower its entry from 50"
    ]


def test_a_stale_entry_must_leave_the_baseline(tmp_path: Path) -> None:
    _write(tmp_path, "a.py", _function("short_now", 40))
    baseline = {
        Piece("function", "pkg/a.py::short_now"): 50,
        Piece("class", "pkg/gone.py::Moved"): 320,
    }
    assert to_ratchet(measure(tmp_path / "pkg"), baseline) == [
        "class pkg/gone.py::Moved: gone, remove its entry",
        "function pkg/a.py::short_now: 40 lines, under the review line: remove its entry",
    ]


def test_a_piece_within_5_percent_of_its_hard_limit_is_found(tmp_path: Path) -> None:
    _write(tmp_path, "a.py", _function("carved", 57) + _function("roomy", 56))
    assert near_hard_limits(measure(tmp_path / "pkg")) == [
        "function pkg/a.py::carved: 57 lines of 60"
    ]


def test_the_baseline_reads_back_what_it_wrote(tmp_path: Path) -> None:
    _write(tmp_path, "a.py", _function("long_one", 50) + _function("short", 10))
    sizes = measure(tmp_path / "pkg")
    assert parse_baseline(format_baseline(sizes)) == {Piece("function", "pkg/a.py::long_one"): 50}


def test_a_refresh_under_a_path_keeps_the_other_entries(tmp_path: Path) -> None:
    _write(tmp_path, "a.py", _function("mine", 47))
    _write(tmp_path, "b.py", _function("theirs", 52))
    listed = {
        Piece("function", "pkg/a.py::mine"): 50,
        Piece("function", "pkg/b.py::theirs"): 50,
        Piece("function", "pkg/a.py::gone"): 50,
    }
    assert refreshed(measure(tmp_path / "pkg"), listed, ["pkg/a.py"]) == {
        Piece("function", "pkg/a.py::mine"): 47,
        Piece("function", "pkg/b.py::theirs"): 50,
    }


def refreshed(
    sizes: Mapping[Piece, int], baseline: Mapping[Piece, int], under: Sequence[str]
) -> Sizes:
    """The baseline with the entries of the modules under these paths measured
    again, the others kept as listed (where others are changing theirs)."""

    def mine(piece: Piece) -> bool:
        return any(piece.where.split("::")[0].startswith(path) for path in under)

    kept = {piece: size for piece, size in baseline.items() if not mine(piece)}
    return kept | {piece: size for piece, size in past_review(sizes).items() if mine(piece)}


def main(argv: list[str]) -> int:
    if argv[:1] not in ([], ["--write"]) or any(arg.startswith("-") for arg in argv[1:]):
        print("usage: test_sizes.py [--write [PATH ...]]", file=sys.stderr)
        return 2
    sizes = measure()
    if argv[1:]:
        sizes = refreshed(sizes, parse_baseline(BASELINE.read_text()), argv[1:])
    table = format_baseline(sizes)
    if not argv:
        print(table, end="")
        return 0
    BASELINE.write_text(table)
    print(f"wrote {BASELINE} ({len(table.splitlines()) - 2} entries)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
