"""``spark-watchdog probe journal``: how did each boot end, and what did the kernel say?

Exit codes (DESIGN.md §7): 0 when the journal was read and the newest past boot
ended cleanly (or there is no past boot); 1 when the newest past boot ended
uncleanly (power loss, freeze) or the journal could not be read at all; 2 for
usage errors. Damaged files next to readable ones are reported but do not by
themselves make the exit code 1: the question answered is how the last boot ended.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

from spark_watchdog.probes.journal import (
    EVIDENCE_KINDS,
    BootRecord,
    JournalProbe,
    JournalReport,
    normalise_boot_id,
)

EXIT_OK = 0
EXIT_UNHEALTHY = 1

_EPILOG = """\
exit codes:
  0  the journal was read and the newest past boot ended with journald's
     "Journal stopped" (a clean shutdown), or there is no past boot
  1  the newest past boot ended uncleanly (power loss, freeze, crash), or no
     journal file could be read (state unavailable or error)
  2  usage error (e.g. --directory is not a directory)

Damaged journal files next to readable ones are listed (state "degraded") but
do not change the exit code by themselves. Without --current-boot the running
kernel's boot id (/proc/sys/kernel/random/boot_id) marks the current boot; a
journal copied from another machine then has no current boot, and its newest
boot counts as past.
"""


def _directory(text: str) -> str:
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"not a directory: {text}")
    return text


def _boot_id(text: str) -> str:
    try:
        return normalise_boot_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f'expected an integer ≥ {minimum}, got "{text}"')
        return value

    return parse


_P = TypeVar("_P", bound=argparse.ArgumentParser)


def add_parser(subparsers: argparse._SubParsersAction[_P]) -> None:
    """Add ``journal`` to the ``spark-watchdog probe`` subcommands (any parser class)."""
    parser = subparsers.add_parser(
        "journal",
        help="list boots, how each ended, and the kernel lines before it died",
        description=(
            "Read the system journal (or DIR) and list its boots oldest first: first and "
            "last entry, whether each past boot ended with a clean shutdown, and evidence "
            "from its end (NVRM Xid, NV_ERR_NO_MEMORY, fallen off the bus, AER, soft "
            "lockup, hung task, and its last lines)."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--directory",
        type=_directory,
        metavar="DIR",
        help="read the journal files in DIR (and its machine-id subdirectories) "
        "instead of the system journal",
    )
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    parser.add_argument(
        "--current-boot",
        type=_boot_id,
        metavar="ID",
        help="treat boot ID as the running one (default: this kernel's boot id)",
    )
    parser.add_argument(
        "--tail",
        type=_count(0),
        default=20,
        metavar="N",
        help="last entries of each boot to show as evidence (default 20)",
    )
    parser.add_argument(
        "--evidence-per-kind",
        type=_count(1),
        default=20,
        metavar="N",
        help="newest lines kept per evidence kind; all are counted (default 20)",
    )
    parser.add_argument(
        "--max-boots",
        type=_count(1),
        default=20,
        metavar="N",
        help="analyse only the newest N boots (default 20)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    probe = JournalProbe(
        args.directory,
        tail_entries=args.tail,
        evidence_per_kind=args.evidence_per_kind,
        max_boots=args.max_boots,
        current_boot_id=args.current_boot,
    )
    report = probe.read()
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(render_table(report))
    return exit_code(report)


def exit_code(report: JournalReport) -> int:
    if report.state in ("unavailable", "error"):
        return EXIT_UNHEALTHY
    previous = report.previous_boot
    if previous is not None and previous.clean_shutdown is False:
        return EXIT_UNHEALTHY
    return EXIT_OK


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S")


def _ending(boot: BootRecord) -> str:
    if boot.current:
        return "current"
    return "clean" if boot.clean_shutdown else "UNCLEAN"


def _top_evidence(boot: BootRecord, most: int = 3) -> str:
    found = [(n, kind) for kind, n in boot.evidence_counts.items() if n > 0]
    found.sort(key=lambda item: (-item[0], EVIDENCE_KINDS.index(item[1])))
    return ", ".join(f"{kind}:{n}" for n, kind in found[:most]) or "-"


def _clip(text: str, width: int = 110) -> str:
    line = text.replace("\n", " ⏎ ")
    return line if len(line) <= width else line[: width - 1] + "…"


def render_table(report: JournalReport) -> str:
    lines = [f"journal: {report.source} (state {report.state})"]
    if report.message:
        lines.append(f"  {report.message}")
    if report.boots:
        lines.append("")
        lines.append(
            f"{'BOOT':<10}{'FIRST ENTRY (UTC)':<21}{'LAST ENTRY (UTC)':<21}{'END':<9}EVIDENCE"
        )
        for boot in report.boots:
            lines.append(
                f"{boot.boot_id[:8]:<10}{_when(boot.first_entry):<21}{_when(boot.last_entry):<21}"
                f"{_ending(boot):<9}{_top_evidence(boot)}"
            )
    previous = report.previous_boot
    if previous is not None and previous.clean_shutdown is False:
        lines += ["", f"previous boot {previous.boot_id} ended UNCLEAN:"]
        if _next_boot_logged_unclean(report, previous):
            lines.append("  journald found its journal file uncleanly shut down at the next boot")
        kernel = [e for e in previous.evidence if e.kind != "tail"][-8:]
        if kernel:
            lines.append("  last kernel evidence:")
            lines += [f"    {_when(e.time)}  {e.kind:<16} {_clip(e.message)}" for e in kernel]
        tail = [e for e in previous.evidence if e.kind == "tail"][-8:]
        if tail:
            lines.append("  its last lines:")
            lines += [f"    {_when(e.time)}  {_clip(e.message)}" for e in tail]
    for error in report.file_errors:
        lines.append(f"file error: {error.path}: {error.reason}")
    return "\n".join(lines)


def _next_boot_logged_unclean(report: JournalReport, boot: BootRecord) -> bool:
    boots = list(report.boots)
    index = boots.index(boot)
    return index + 1 < len(boots) and boots[index + 1].uncleanly_shut_down_logged
