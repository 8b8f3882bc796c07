"""The CLI's argparse tree as plain data: what shell completion and the man
page are generated from, so neither can drift from the real parser."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

# Option metavars that name a file or directory: completed as paths.
PATH_METAVARS = frozenset({"FILE", "PATH", "DIR", "SRC", "WORKDIR"})


@dataclass
class Option:
    flags: tuple[str, ...]
    help: str
    metavar: str | None  # None: a flag that takes no value
    choices: tuple[str, ...] = ()

    @property
    def takes_path(self) -> bool:
        return self.metavar in PATH_METAVARS


@dataclass
class Command:
    path: tuple[str, ...]  # () for the program itself
    help: str
    description: str
    usage: str
    epilog: str
    options: list[Option] = field(default_factory=list)
    # Positional values the command accepts (choices), e.g. status|on|off|cycle.
    words: tuple[str, ...] = ()
    subcommands: list[Command] = field(default_factory=list)

    def walk(self) -> list[Command]:
        found = [self]
        for sub in self.subcommands:
            found += sub.walk()
        return found


def _text(value: object) -> str:
    return "" if value is None or value is argparse.SUPPRESS else str(value)


def tree(parser: argparse.ArgumentParser, path: tuple[str, ...] = (), help: str = "") -> Command:
    command = Command(
        path=path,
        help=help,
        description=_text(parser.description),
        usage=parser.format_usage().removeprefix("usage: ").strip(),
        epilog=_text(parser.epilog),
    )
    words: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: _text(a.help) for a in action._choices_actions}
            for name, sub in action.choices.items():
                command.subcommands.append(tree(sub, (*path, name), helps.get(name, "")))
        elif action.option_strings:
            if action.help is argparse.SUPPRESS:
                continue
            takes_value = action.nargs != 0
            metavar = action.metavar or (action.dest.upper() if takes_value else None)
            command.options.append(
                Option(
                    tuple(action.option_strings),
                    _text(action.help),
                    str(metavar) if takes_value and metavar is not None else None,
                    tuple(str(c) for c in action.choices or ()),
                )
            )
        elif action.choices:
            words += [str(c) for c in action.choices]
    command.words = tuple(words)
    return command
