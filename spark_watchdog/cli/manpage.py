"""The ``spark-watchdog(1)`` man page, generated from the parser.

``spark-watchdog man | man -l -`` reads it; the installer writes it to
``/usr/local/share/man/man1/spark-watchdog.1``.
"""

from __future__ import annotations

from datetime import date

from spark_watchdog import __version__
from spark_watchdog.cli.parser_tree import Command, Option

_SEE_ALSO = (
    "docs/install.md, docs/spark-prep.md, docs/doctor.md, docs/observability.md "
    "and docs/benchmarks.md in the source tree; systemd.exec(5), systemd-analyze(1)."
)


def _escape(text: str) -> str:
    lines = []
    for line in text.replace("\\", "\\e").splitlines():
        # A line starting with . or ' is a roff request: keep it text.
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return "\n".join(lines)


def _option(option: Option) -> str:
    flags = ", ".join(f"\\fB{f}\\fR" for f in option.flags)
    value = f" \\fI{option.metavar}\\fR" if option.metavar else ""
    return f".TP\n{_escape(flags + value)}\n{_escape(option.help or '')}"


def _section(command: Command) -> str:
    name = " ".join(("spark-watchdog", *command.path))
    parts = [f".SS {name}", _escape(command.description or command.help)]
    parts.append(f".PP\n.nf\n{_escape(command.usage)}\n.fi")
    parts += [_option(o) for o in command.options if o.flags != ("-h", "--help")]
    if command.epilog:
        parts.append(f".PP\n.nf\n{_escape(command.epilog)}\n.fi")
    return "\n".join(parts)


def man_page(root: Command, today: date | None = None) -> str:
    when = (today or date.today()).isoformat()
    commands = [c for c in root.walk() if c.path]
    summary = "\n".join(
        f".TP\n\\fB{' '.join(c.path)}\\fR\n{_escape(c.help)}" for c in root.subcommands
    )
    return "\n".join(
        [
            f'.TH SPARK-WATCHDOG 1 "{when}" "spark-watchdog {__version__}" "User Commands"',
            ".SH NAME",
            "spark-watchdog \\- freeze watchdog for vLLM on NVIDIA DGX Spark clusters",
            ".SH SYNOPSIS",
            "\\fBspark-watchdog\\fR \\fICOMMAND\\fR [\\fIOPTIONS\\fR]",
            ".SH DESCRIPTION",
            _escape(
                "A node agent on every DGX Spark (vLLM progress, a GPU heartbeat over NVML, "
                "journal boot boundaries), a controller on a management host that power-cycles "
                "a frozen host through its PDU outlet or BMC, verifies the new boot and restarts "
                "serving with a safe profile, and this command line to run and inspect both."
            ),
            ".SH COMMANDS",
            summary,
            ".SH COMMAND REFERENCE",
            *(_section(c) for c in commands),
            ".SH EXIT STATUS",
            "0 ok; 1 the thing checked is unhealthy or the action failed; "
            "2 usage or configuration error.",
            ".SH FILES",
            ".TP\n/etc/spark-watchdog/agent.yaml, /etc/spark-watchdog/controller.yaml\n"
            "Configuration (examples in config/).",
            ".TP\n/etc/spark-watchdog/credentials/\n"
            "Secrets, one file each, loaded with LoadCredential=.",
            ".TP\n/var/lib/spark-watchdog/history.db\nThe freeze history (SQLite).",
            ".SH SEE ALSO",
            _escape(_SEE_ALSO),
            "",
        ]
    )
