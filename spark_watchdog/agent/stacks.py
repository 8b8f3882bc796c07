"""The Python stacks of a rank's processes, taken before the agent stops it.

A stalled rank is killed and restarted, and with it goes the only place that
knew where it was stuck. So before a stop signals the group, the agent runs
py-spy (``py-spy dump --pid PID``: it reads the process from outside, the
process does nothing and needs no preparation) on each of the group's
processes, within one time budget, and keeps the result in the serving status
(``stacks``) and the serving log; the controller copies it into the incident
(docs/design.md, "Serving restart").

py-spy is optional (``pip install 'spark-watchdog[stacks]'``): without it, or
when it cannot read a process (another Python build, no ptrace rights), the
dump says so in a note and the stop goes on. Command lines are shown with
secret values hidden; a stack itself holds function names, files and lines
only (no ``--locals``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil

from spark_watchdog.agent.probe_runner import iso_time
from spark_watchdog.child_run import completed
from spark_watchdog.redact import redact_argv

# At most this many processes, and this many bytes of each one's stack.
MAX_PROCESSES = 8
MAX_STACK_BYTES = 8 * 1024
# Of py-spy's output, this much is read (its header repeats the whole argv).
OUTPUT_BYTES = 64 * 1024

Runner = Callable[[list[str], float], "subprocess.CompletedProcess[str]"]


def find_py_spy() -> str | None:
    """py-spy on PATH, or beside this Python (a venv's bin)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if os.access(beside, os.X_OK) else None


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """py-spy, bounded in bytes and killed with its process group at the deadline:
    a py-spy stuck reading a rank in the driver must not hold the stop forever,
    and one that floods must not fill the agent's memory."""
    return completed(argv, timeout, OUTPUT_BYTES)


def _command(pid: int, secret_flags: Sequence[str]) -> str:
    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.Error:
        return "?"
    return " ".join(redact_argv(argv, secret_flags))[:300]


def dump_stacks(
    pids: Sequence[int],
    budget_s: float,
    *,
    secret_flags: Sequence[str] = (),
    find: Callable[[], str | None] = find_py_spy,
    run: Runner = _run,
) -> dict[str, Any]:
    """Each process's stack, or why not; never longer than ``budget_s`` in all."""
    began = time.monotonic()
    tool = find()
    record: dict[str, Any] = {"at": iso_time(time.time()), "tool": tool, "processes": []}
    if tool is None:
        record["note"] = "py-spy is not installed (pip install 'spark-watchdog[stacks]'): no stacks"
        return _done(record, began)
    chosen = list(pids)[:MAX_PROCESSES]
    if len(pids) > len(chosen):
        record["note"] = f"{len(pids)} processes; the first {MAX_PROCESSES} dumped"
    for pid in chosen:
        entry: dict[str, Any] = {"pid": pid, "command": _command(pid, secret_flags)}
        left = budget_s - (time.monotonic() - began)
        if left <= 0.2:
            entry["error"] = "skipped: the time budget is spent"
            record["processes"].append(entry)
            continue
        try:
            done = run([tool, "dump", "--pid", str(pid), "--nonblocking"], left)
        except subprocess.TimeoutExpired:
            entry["error"] = f"py-spy did not finish within {left:.1f} s"
        except OSError as exc:
            entry["error"] = f"py-spy could not run: {exc.strerror or exc}"
        else:
            if done.returncode == 0:
                entry["stack"] = _bounded(done.stdout)
            else:
                # stderr only: stdout starts with the raw command line.
                first = done.stderr.strip().splitlines()
                entry["error"] = first[0][:300] if first else f"py-spy exited {done.returncode}"
        record["processes"].append(entry)
    return _done(record, began)


def _bounded(text: str) -> str:
    # py-spy's header repeats the whole command line (secrets and all): drop it,
    # the entry's command is the redacted one.
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Python v")), None)
    if start is None:
        # No header end: keep only the frames, never a line that may be the argv.
        lines = [line for line in lines if line.startswith(("Thread ", "    "))]
    else:
        lines = lines[start + 1 :]
    text = "\n".join(lines).strip("\n") + "\n"
    data = text.encode()
    if len(data) <= MAX_STACK_BYTES:
        return text
    return data[:MAX_STACK_BYTES].decode(errors="ignore") + "\n... (cut)"


def _done(record: dict[str, Any], began: float) -> dict[str, Any]:
    record["duration_s"] = round(time.monotonic() - began, 3)
    return record


def as_log_lines(record: dict[str, Any]) -> str:
    """The dump as the serving log shows it."""
    lines = [f"stacks before the stop ({record.get('note') or 'py-spy dump'}):"]
    for entry in record.get("processes", []):
        lines.append(f"  pid {entry.get('pid')}: {entry.get('command')}")
        body = entry.get("stack") or f"(no stack: {entry.get('error')})"
        lines.extend(f"    {line}" for line in str(body).splitlines())
    return "\n".join(lines)
