"""``spark-watchdog power``: read or switch one node's power path, verified.

    spark-watchdog power --config FILE NODE status|on|off|cycle [--dry-run] [--json] [--yes]
    spark-watchdog power --config FILE --check

Exit codes: 0 done and verified, 1 failed or unverified (or, with --check,
a device unreachable), 2 usage or config error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from typing import Any

from spark_watchdog import logs
from spark_watchdog.cli.history_cmd import seconds_at_least, whole_number
from spark_watchdog.config.controller import ControllerConfig, load_controller_config
from spark_watchdog.errors import ConfigError, PowerError, Unreachable, WatchdogError
from spark_watchdog.power.base import (
    PowerBackend,
    PowerResult,
    PowerState,
    PowerStep,
    VerifiedPower,
    close_quietly,
)
from spark_watchdog.power.paths import (
    PowerPath,
    build_backend,
    power_paths,
    read_device_secrets,
    timing_for,
)

ACTIONS = ("status", "on", "off", "cycle")
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "power",
        help="read or switch a node's power path (verified by reading back)",
        description=(
            "Read or switch a node's power through its configured power path: an SNMP PDU "
            "outlet, a smart plug, IPMI or Redfish. Every action is verified by reading the "
            "state back; a cycle is off, verify off, hold, on, verify on. A command whose "
            "outcome is unknown is never repeated."
        ),
        epilog=(
            "examples:\n"
            "  spark-watchdog power --config controller.yaml spark-3 status\n"
            "  spark-watchdog power --config controller.yaml spark-3 cycle --yes\n"
            "  spark-watchdog power --config controller.yaml spark-3 off --dry-run --json\n"
            "  spark-watchdog power --config controller.yaml --check\n"
            "exit codes: 0 done and verified, 1 failed or unverified, 2 usage or config error"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="controller YAML config")
    parser.add_argument("node", nargs="?", metavar="NODE", help="node name from the config")
    parser.add_argument(
        "action", nargs="?", choices=ACTIONS, metavar="ACTION", help="|".join(ACTIONS)
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="read every configured device (and outlet names); exit 1 if any is unreachable",
    )
    parser.add_argument(
        "--path",
        type=whole_number(1, 64),
        metavar="N",
        help="which power path of the node (1 = first in the config; default: the first "
        "path that can switch power)",
    )
    parser.add_argument(
        "--off-seconds",
        type=seconds_at_least(0.0),
        metavar="S",
        help="how long a cycle holds power off (default: policy.power_off_seconds)",
    )
    parser.add_argument("--dry-run", action="store_true", help="read and decide, send no command")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--yes", action="store_true", help="do not ask; required for on/off/cycle without a TTY"
    )
    parser.set_defaults(func=run)


def _usage(message: str) -> int:
    print(f"spark-watchdog power: {message}", file=sys.stderr)
    return EXIT_USAGE


def _progress(text: str) -> None:
    print(f"power: {text}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    # Power steps are printed as progress lines here; the library's own INFO
    # logs would say the same thing twice.
    logs.configure(logging.WARNING, to_journal=False)
    try:
        config = load_controller_config(args.config)
    except ConfigError as exc:
        return _usage(str(exc))
    if args.check:
        if args.node or args.action:
            return _usage("--check reads every device; give no NODE or ACTION with it")
        return asyncio.run(_check_all(config, args.json))
    if not args.node or not args.action:
        return _usage("expected NODE and ACTION (status, on, off or cycle), or --check")
    try:
        node = config.node(args.node)
    except KeyError as exc:
        return _usage(str(exc.args[0]))
    paths = power_paths(config, node)
    switchable = [p for p in paths if not p.is_soft]
    if args.path is not None:
        if not 1 <= args.path <= len(paths):
            return _usage(
                f"--path: node {node.name} has {len(paths)} power path(s); got {args.path}"
            )
        path = paths[args.path - 1]
        if path.is_soft:
            return _usage(
                f"--path {args.path} of {node.name} is ssh: it reboots a live host and cannot "
                "read or switch power; the controller uses it as a soft rung"
            )
    elif switchable:
        path = switchable[0]
    else:
        return _usage(f"node {node.name} has no power path that can switch power (PDU, plug, BMC)")
    off_seconds = config.policy.power_off_seconds if args.off_seconds is None else args.off_seconds
    if off_seconds < 0:
        return _usage(f"--off-seconds: expected ≥ 0, got {off_seconds:g}")
    if args.action != "status" and not args.dry_run and not args.yes:
        refusal = _confirm(node.name, args.action, path)
        if refusal is not None:
            return refusal
    return asyncio.run(_act(config, path, args.action, off_seconds, args.dry_run, args.json))


def _confirm(node: str, action: str, path: PowerPath) -> int | None:
    if not sys.stdin.isatty():
        return _usage(
            f"refusing to {action} {node} without --yes: stdin is not a terminal "
            "(add --yes, or --dry-run to see what would happen)"
        )
    print(
        f"About to {action} {node} through {path.key_path} ({path.kind}). "
        f"Type the node name to confirm: ",
        end="",
        file=sys.stderr,
        flush=True,
    )
    answer = sys.stdin.readline().strip()
    if answer != node:
        return _usage(f"not confirmed (expected {node!r}); nothing was sent")
    return None


async def _act(
    config: ControllerConfig,
    path: PowerPath,
    action: str,
    off_seconds: float,
    dry_run: bool,
    as_json: bool,
) -> int:
    try:
        backend = build_backend(path, read_device_secrets(path))
    except ConfigError as exc:
        return _usage(str(exc))
    ticker: asyncio.Task[None] | None = None

    async def on_step(step: PowerStep) -> None:
        nonlocal ticker
        _progress(f"{step.name}{f' ({step.detail})' if step.detail else ''} at +{step.at_s:.1f}s")
        if step.name == "hold_started":
            ticker = asyncio.create_task(_hold_ticker(off_seconds))
        elif step.name == "hold_done" and ticker is not None:
            ticker.cancel()

    power = VerifiedPower(backend, timing_for(config, path), dry_run=dry_run, on_step=on_step)
    started = time.monotonic()
    result: PowerResult | None = None
    error: PowerError | None = None
    try:
        if action == "status":
            state = await power.state()
            result = PowerResult(
                power.name, "status", state, state, True, time.monotonic() - started, dry_run
            )
        elif action == "on":
            result = await power.on()
        elif action == "off":
            result = await power.off()
        else:
            _progress(f"cycle with {off_seconds:g}s off")
            result = await power.cycle(
                off_seconds, from_off=True, timed=config.policy.self_timed_on
            )
    except PowerError as exc:
        error = exc
    except WatchdogError as exc:  # e.g. an outlet name the PDU does not have
        return _usage(str(exc))
    finally:
        if ticker is not None:
            ticker.cancel()
        await close_quietly(backend)
    return _report(path, action, result, error, time.monotonic() - started, dry_run, as_json)


async def _hold_ticker(off_seconds: float) -> None:
    started = time.monotonic()
    while True:
        await asyncio.sleep(10)
        left = off_seconds - (time.monotonic() - started)
        if left > 0:
            _progress(f"holding power off: {left:.0f}s left")


def _report(
    path: PowerPath,
    action: str,
    result: PowerResult | None,
    error: PowerError | None,
    elapsed: float,
    dry_run: bool,
    as_json: bool,
) -> int:
    if result is not None:
        body = result.to_json()
    else:
        assert error is not None
        steps = [s.to_json() for s in error.steps if isinstance(s, PowerStep)]
        body = {
            "device": error.device,
            "action": action,
            "state_before": None,
            "state_after": None,
            "verified": False,
            "elapsed_s": round(elapsed, 3),
            "dry_run": dry_run,
            "error": f"{type(error).__name__}: {error.message}",
            "steps": steps,
        }
    body = {"node": path.node, "path": path.index + 1, "type": path.kind, **body}
    ok = bool(body["verified"]) and not dry_run
    if dry_run and error is None:
        ok = True  # a dry run that could read the device did its job
    if as_json:
        print(json.dumps(body, indent=2))
    else:
        line = f"{path.node} {action} via {body['device']}: "
        if error is not None:
            line += f"FAILED ({body['error']})"
        elif dry_run:
            line += f"state {body['state_before']}; dry run, nothing sent"
        elif action == "status":
            line += f"{body['state_after']}"
        else:
            line += f"{body['state_before']} → {body['state_after']}, "
            line += f"verified in {body['elapsed_s']:.1f}s"
        print(line)
    return EXIT_OK if ok else EXIT_FAILED


async def _check_all(config: ControllerConfig, as_json: bool) -> int:
    rows: list[dict[str, Any]] = []
    for node in config.nodes:
        for path in power_paths(config, node):
            rows.append(await _check_one(config, path))
    if as_json:
        print(json.dumps({"devices": rows}, indent=2))
    else:
        header = ("NODE", "PATH", "TYPE", "STATE", "DEVICE / DETAIL")
        table = [header] + [
            (r["node"], str(r["path"]), r["type"], r["state"], r["detail"]) for r in rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(4)]
        for row in table:
            cells = [cell.ljust(w) for cell, w in zip(row[:4], widths, strict=True)]
            print("  ".join([*cells, row[4]]))
    return EXIT_FAILED if any(r["state"] in ("unreachable", "error") for r in rows) else EXIT_OK


async def _read_one(
    config: ControllerConfig, path: PowerPath, backend: PowerBackend, row: dict[str, Any]
) -> None:
    power = VerifiedPower(backend, timing_for(config, path))
    state = await power.state()
    detail = backend.name
    if path.kind == "snmp":
        from spark_watchdog.power.snmp_outlet import describe_snmp_backend

        outlets = await describe_snmp_backend(backend)
        row["outlets"] = [o.to_json() for o in outlets]
        labels = [f'{o.outlet} "{o.outlet_name}"' for o in outlets if o.outlet_name]
        if labels:
            detail += f" (outlet {', '.join(labels)}; {outlets[0].vendor})"
    row.update(state=state.value if isinstance(state, PowerState) else str(state), detail=detail)


async def _check_one(config: ControllerConfig, path: PowerPath) -> dict[str, Any]:
    row: dict[str, Any] = {"node": path.node, "path": path.index + 1, "type": path.kind}
    if path.is_soft:
        from spark_watchdog.power.ssh_banner import check_ssh_banner

        device: Any = path.device
        banner = await check_ssh_banner(device.host, device.port, timeout=2.0)
        row.update(
            state="ok" if banner.ok else "unreachable",
            detail=f"ssh {device.host}:{device.port}: {banner.banner or banner.outcome}",
        )
        return row
    try:
        backend = build_backend(path, read_device_secrets(path))
        try:
            await _read_one(config, path, backend, row)
        finally:
            await close_quietly(backend)
    except ConfigError as exc:
        row.update(state="error", detail=str(exc))
    except PowerError as exc:
        kind = "unreachable" if isinstance(exc, Unreachable) else "error"
        row.update(state=kind, detail=f"{type(exc).__name__}: {exc}")
    except WatchdogError as exc:
        row.update(state="error", detail=str(exc))
    return row
