"""Every child process the product starts is bounded in bytes and time, its
whole process group killed at the deadline: it goes through child_run, or is
one of the few that cannot, each with its own bound written here
(docs/bad-input.md, "Child processes")."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "spark_watchdog"

# What starts a process.
STARTERS = {
    ("subprocess", "run"),
    ("subprocess", "Popen"),
    ("subprocess", "call"),
    ("subprocess", "check_call"),
    ("subprocess", "check_output"),
    ("subprocess", "getoutput"),
    ("asyncio", "create_subprocess_exec"),
    ("asyncio", "create_subprocess_shell"),
    ("os", "system"),
    ("os", "popen"),
}
# The modules that start children of their own, and why each is bounded.
OWN_BOUNDS = {
    # The runner itself.
    "child_run.py",
    # The rank: its output goes to the serving log file, never into memory; it
    # is stopped by its process group (agent/rank_kill.py).
    "agent/rank_process.py",
    # The NVML worker: a long-lived child answering one line per read, read
    # with a length limit and a deadline, killed when late (probes/gpu.py).
    "probes/gpu.py",
    # A launcher may leave the cluster running behind it: its output goes to a
    # temporary file (a pipe would hold it), its group is killed at the
    # deadline, and only the tail is read back.
    "controller/serving/launcher_commands.py",
}


def _starts(path: Path) -> list[int]:
    """The lines of ``path`` that start a process."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        if isinstance(owner, ast.Name) and (owner.id, node.func.attr) in STARTERS:
            found.append(node.lineno)
    return found


def test_every_child_process_goes_through_the_bounded_runner() -> None:
    unbounded = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("lab/") or relative in OWN_BOUNDS:
            continue  # the lab runs the hardware's stand-ins, not the product
        unbounded += [f"spark_watchdog/{relative}:{line}" for line in _starts(path)]
    assert not unbounded, "start these through spark_watchdog/child_run.py:\n" + "\n".join(
        unbounded
    )


def test_the_check_finds_a_child_started_directly(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import asyncio, subprocess\n"
        "subprocess.run(['true'])\n"
        "async def f():\n"
        "    await asyncio.create_subprocess_exec('true')\n"
    )
    assert _starts(sample) == [2, 4]
