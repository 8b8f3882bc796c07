"""Examples shown at the end of each command's ``--help`` (and in the man
page), for the commands whose own epilog has none."""

from __future__ import annotations

import argparse

EXAMPLES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("probe", "journal"): (
        "spark-watchdog probe journal",
        "spark-watchdog probe journal --directory /var/log/journal --json",
    ),
    ("probe", "vllm"): (
        "spark-watchdog probe vllm --url http://127.0.0.1:8000",
        "spark-watchdog probe vllm --url http://127.0.0.1:8000 --watch 30 --json",
    ),
    ("probe", "gpu"): ("spark-watchdog probe gpu", "spark-watchdog probe gpu --json --deadline 3"),
    ("status",): (
        "spark-watchdog status --config /etc/spark-watchdog/controller.yaml",
        "spark-watchdog status --url http://127.0.0.1:9721 --json",
    ),
    ("show",): (
        "spark-watchdog show 12",
        "spark-watchdog show 12 --json | jq .steps",
        "spark-watchdog show spark-2#12",
    ),
    ("boots",): ("spark-watchdog boots spark-3", "spark-watchdog boots spark-3 --json"),
    ("hold",): (
        'spark-watchdog hold spark-3 --reason "reseating the power cable"',
        'spark-watchdog hold --all --reason "upgrading vLLM"',
    ),
    ("release",): ("spark-watchdog release spark-3", "spark-watchdog release --all"),
    ("serving", "profile"): (
        "spark-watchdog serving profile",
        "spark-watchdog serving profile safe",
    ),
    ("serving", "restart"): (
        "spark-watchdog serving restart",
        "spark-watchdog serving restart --profile plain --json",
    ),
    ("ha", "status"): (
        "spark-watchdog ha status",
        "spark-watchdog ha status --config /etc/spark-watchdog/controller.yaml --json",
    ),
    ("ha", "step-down"): ("spark-watchdog ha step-down",),
    ("lab", "demo"): ("spark-watchdog lab demo", "spark-watchdog lab demo --json > demo.json"),
    ("lab", "run"): (
        "spark-watchdog lab run --list",
        "spark-watchdog lab run --scenario controller-kill",
        "spark-watchdog lab run --scenario wedge --json",
    ),
    ("lab", "up"): ("spark-watchdog lab up", "spark-watchdog lab up --netns --dir /tmp/lab"),
    ("lab", "inject"): (
        "spark-watchdog lab inject freeze spark-3",
        "spark-watchdog lab inject wedge",
        "spark-watchdog lab inject heal",
    ),
    ("lab", "agent-demo"): (
        "spark-watchdog lab agent-demo",
        "spark-watchdog lab agent-demo --json",
    ),
}


def attach(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> None:
    """Append the examples to the epilog of every command listed above."""
    lines = EXAMPLES.get(path)
    if lines:
        block = "examples:\n" + "\n".join(f"  {line}" for line in lines)
        parser.epilog = f"{parser.epilog}\n\n{block}" if parser.epilog else block
        parser.formatter_class = argparse.RawDescriptionHelpFormatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                attach(sub, (*path, name))
