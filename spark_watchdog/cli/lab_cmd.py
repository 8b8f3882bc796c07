"""``spark-watchdog lab ...``: the simulated cluster, its demos and scenarios.

The lab's modules (HTTP clients, stand-ins, journal writers) are imported only
when a lab command runs, so the agent's own process never carries them.

Exit codes of ``lab run``: 0 the scenario's expected outcome (and every
guarantee it checks held), 1 anything else, 2 usage (unknown scenario, too
few nodes), 3 the scenario is not available on this machine. ``lab demo``: 0
only when the story ended in ``recovered``. Ctrl-C or SIGTERM stop every lab
process and exit 130.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NOT_AVAILABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

# Kept in step with spark_watchdog.lab.stories.scenarios.SCENARIOS (a test checks it),
# so `--help` works without importing the lab.
SCENARIO_NAMES = (
    "freeze",
    "wedge",
    "crash",
    "crash-exit",
    "idle-wedge",
    "pdu-down",
    "controller-kill",
    "double-freeze",
    "gpu-hang",
    "clock-latch",
    "mem-collapse",
    "xid",
    "xid-freeze",
    "partition",
    "mgmt-partition",
    "fabric-partition",
    "reboot",
    "stuck-agent",
    "outlet-off",
    "colocated-head-freeze",
    "colocated-freeze",
    "colocated-fabric-cut",
    "colocated-mgmt-cut",
    "colocated-partition",
    "colocated-both-frozen",
    "colocated-both-frozen-all",
)
FAULT_NAMES = (
    "freeze",
    "thaw",
    "wedge",
    "crash",
    "crash-exit",
    "idle-wedge",
    "gpu-hang",
    "xid",
    "clock-latch",
    "mem-collapse",
    "pdu-down",
    "partition",
    "mgmt-partition",
    "fabric-partition",
    "heal",
    "controller-kill",
)


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "lab",
        help="simulated Spark nodes on this machine (demos, end-to-end tests)",
        description="Run the real watchdog code against simulated hardware on loopback.",
    )
    labs = parser.add_subparsers(dest="lab", metavar="LAB")
    labs.required = True
    _add_demo(labs)
    _add_run(labs)
    _add_up(labs)
    _add_inject(labs)
    _add_agent_demo(labs)


def _add_demo(labs: Any) -> None:
    demo = labs.add_parser(
        "demo",
        help="the whole story: a host freezes, is power-cycled, serving comes back safe",
        description=(
            "Four simulated Sparks, an SNMP PDU and the real controller on loopback. One "
            "host freezes after an Xid 31; the timeline shows the controller detect it, cycle "
            "its outlet, see the new boot and restart serving with the safe profile. The "
            "history database stays behind at the printed path. Exit 0 only if the story "
            "ended in recovered."
        ),
    )
    demo.add_argument("--nodes", type=int, default=4, metavar="N", help="nodes (default 4)")
    demo.add_argument("--dir", type=Path, metavar="DIR", help="lab directory (default: new)")
    demo.add_argument(
        "--json", action="store_true", help="print a JSON summary (the story goes to stderr)"
    )
    _add_head_rank(demo)
    _add_serving(demo)
    demo.set_defaults(func=_run_demo)


def _add_run(labs: Any) -> None:
    run = labs.add_parser(
        "run",
        help="one scenario, judged from the history and the PDU",
        description=(
            "Start a lab, inject one fault, wait for the outcome and judge it. Exit 0 when "
            "the outcome is the expected one, 1 otherwise, 3 when the scenario is not "
            "available here. `--list` shows every scenario and what it expects."
        ),
    )
    run.add_argument("--scenario", choices=SCENARIO_NAMES, metavar="NAME", help="see --list")
    run.add_argument("--list", action="store_true", help="list the scenarios and exit")
    run.add_argument(
        "--nodes",
        type=int,
        metavar="N",
        help="nodes (default 4; a colocated-* scenario has its own number)",
    )
    run.add_argument("--node", metavar="NAME", help="the node to fault (freeze only)")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("--dir", type=Path, metavar="DIR", help="lab directory (kept)")
    run.add_argument("--keep", action="store_true", help="keep the temporary lab directory")
    _add_head_rank(run)
    _add_serving(run)
    run.set_defaults(func=_run_scenario)


def _add_up(labs: Any) -> None:
    up = labs.add_parser(
        "up",
        help="keep a lab running until Ctrl-C; inject faults with `lab inject`",
        description=(
            "Start the simulated cluster, the PDU and the real controller (as its own "
            "process) and keep them running, narrating what the controller does, until "
            "Ctrl-C. A control endpoint on loopback takes faults from `spark-watchdog lab "
            "inject`; its URL and token are in a pointer file only you can read."
        ),
    )
    up.add_argument("--nodes", type=int, default=4, metavar="N", help="nodes (default 4)")
    up.add_argument("--dir", type=Path, metavar="DIR", help="lab directory (default: new)")
    up.add_argument(
        "--netns",
        action="store_true",
        help="each node in a network namespace of its own, with a management link and a "
        "fabric link (root; needed for `partition`, `mgmt-partition`, `fabric-partition`)",
    )
    up.add_argument(
        "--colocated",
        action="store_true",
        help="no controller on this machine: the controllers run on the nodes themselves, "
        "each inside its node (a freeze stops it, a power cut kills it, the boot starts it), "
        "with one shared config; implies --netns (each node needs an address of its own)",
    )
    up.add_argument(
        "--controllers",
        metavar="NODES",
        help="with --colocated: the nodes that run a controller, in order, comma-separated "
        "(default spark-1,spark-2)",
    )
    _add_serving(up)
    up.set_defaults(func=_run_up)


def _add_inject(labs: Any) -> None:
    inject = labs.add_parser(
        "inject",
        help="inject a fault into the running `lab up`",
        description="Inject a fault into the lab that `spark-watchdog lab up` keeps running.",
        epilog="faults: " + ", ".join(FAULT_NAMES),
    )
    inject.add_argument("fault", choices=FAULT_NAMES, metavar="FAULT")
    inject.add_argument(
        "node", nargs="?", metavar="NODE", help="e.g. spark-3 (serving faults: the head)"
    )
    inject.add_argument("--control", metavar="URL", help="control URL (default: the pointer file)")
    inject.add_argument("--token-file", metavar="FILE", help="control token (with --control)")
    inject.add_argument("--json", action="store_true", help="print the answer as JSON")
    inject.set_defaults(func=_run_inject)


def _add_agent_demo(labs: Any) -> None:
    agent_demo = labs.add_parser(
        "agent-demo",
        help="the real agent against a simulated vLLM rank: wedge, crash, restart",
        description=(
            "A vLLM stand-in with synthetic load, a node journal of real journal files "
            "(a clean boot, a boot that froze after Xid 31, the current boot), and the real "
            "agent as a subprocess under a notify socket. The engine wedges, dies and "
            "restarts; the agent must call each of those. Exits 0 only when every step "
            "happened."
        ),
    )
    agent_demo.add_argument(
        "--stall-after",
        type=float,
        default=6.0,
        metavar="SECONDS",
        help="the agent's stall_after for the demo (default 6; production default 15)",
    )
    agent_demo.add_argument("--keep", action="store_true", help="keep the work directory")
    agent_demo.add_argument(
        "--json", action="store_true", help="print the steps as JSON at the end"
    )
    agent_demo.set_defaults(func=_run_agent_demo)


def _add_head_rank(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vllm",
        choices=("standin", "real"),
        default="standin",
        help="the head's rank: the lab's stand-in (default) or the real vLLM CPU server "
        "(built by scripts/real_vllm_env.py)",
    )


def _add_serving(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--serving",
        choices=("process", "docker", "launcher"),
        default="process",
        help="how each node's rank runs: a process the agent forks (default), a container "
        "the agent creates (docker), or containers a cluster launcher starts (launcher); "
        "docker and launcher start a dockerd of the lab's own (root, docker.io)",
    )


def _run_agent_demo(args: argparse.Namespace) -> int:
    from spark_watchdog.lab.stories import agent_demo

    return agent_demo.run(args)


def _interrupt_once(signum: int, frame: FrameType | None) -> None:
    # The first Ctrl-C or SIGTERM starts the clean-up; a second one (an
    # impatient finger, or `timeout` passing its signal on) must not cut it short.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


@contextlib.contextmanager
def _lab_signals(log_file: Path | None) -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C (the lab's clean-up runs), once; the
    in-process controller logs to a file, not over the timeline."""
    import logging

    previous = {sig: signal.signal(sig, _interrupt_once) for sig in (signal.SIGINT, signal.SIGTERM)}
    handler: logging.Handler | None = None
    if log_file is not None:
        from spark_watchdog.lab.lab_controller import quiet_logging

        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler = quiet_logging(log_file)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is _interrupt_once:
            for sig, old in previous.items():
                signal.signal(sig, old)
        # else interrupted: the signals stay ignored until the process has
        # exited, so that a second one cannot cut short what is left of it
        # (the interpreter's own shutdown joins the lab's threads).
        if handler is not None:
            logging.getLogger().removeHandler(handler)
            handler.close()


def _lab_errors(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A lab that could not start (a port taken, an agent that never answered)
    is reported in one line, after its clean-up already ran."""

    @functools.wraps(fn)
    def wrapper(args: argparse.Namespace) -> int:
        from spark_watchdog.errors import WatchdogError
        from spark_watchdog.lab.session import LabTimeout

        try:
            return fn(args)
        except BrokenPipeError:
            raise  # `... | head`: main() knows this one
        except (OSError, TimeoutError, RuntimeError, ValueError, LabTimeout, WatchdogError) as exc:
            print(f"spark-watchdog lab: {type(exc).__name__}: {exc}", file=sys.stderr)
            return EXIT_FAILED

    return wrapper


def _nodes_ok(nodes: int) -> bool:
    if 2 <= nodes <= 8:
        return True
    print("spark-watchdog lab: --nodes: expected 2 to 8", file=sys.stderr)
    return False


@_lab_errors
def _run_demo(args: argparse.Namespace) -> int:
    if not _nodes_ok(args.nodes):
        return EXIT_USAGE
    if not _real_vllm_ok(args.vllm):
        return EXIT_NOT_AVAILABLE
    if not _serving_ok(args.serving, args.vllm):
        return EXIT_NOT_AVAILABLE
    from spark_watchdog.lab.stories.demo import run_demo

    workdir = args.dir or Path(tempfile.mkdtemp(prefix="spark-watchdog-demo-"))
    try:
        with _lab_signals(workdir / "controller.log"):
            return run_demo(
                workdir.resolve(),
                nodes=args.nodes,
                as_json=args.json,
                vllm=args.vllm,
                serving=args.serving,
            )
    except KeyboardInterrupt:
        print(
            f"\ninterrupted; every lab process stopped (lab directory {workdir})", file=sys.stderr
        )
        return EXIT_INTERRUPTED


def _real_vllm_ok(vllm: str) -> bool:
    """With --vllm real, the vLLM CPU build must be here; say how to get it if not."""
    if vllm != "real":
        return True
    from spark_watchdog.lab.hardware.real_vllm import RealVllmMissing, find_python

    try:
        find_python()
    except RealVllmMissing as exc:
        print(f"spark-watchdog lab: --vllm real: {exc}", file=sys.stderr)
        return False
    return True


def _serving_ok(serving: str, vllm: str = "standin") -> bool:
    """With --serving docker or launcher, this machine must run a dockerd of the lab's own."""
    if serving == "process":
        return True
    from spark_watchdog.lab.hardware.dockerd import docker_unavailable
    from spark_watchdog.lab.rank_containers import serving_conflict

    why = docker_unavailable() or serving_conflict(serving, vllm=vllm)
    if why is not None:
        print(f"spark-watchdog lab: --serving {serving}: {why}", file=sys.stderr)
        return False
    return True


def _list_scenarios() -> int:
    import textwrap

    from spark_watchdog.lab.stories.scenarios import SCENARIOS

    indent = " " * 17
    for scenario in SCENARIOS.values():
        print(f"{scenario.name:<16} expects {' or '.join(scenario.expected)}: {scenario.summary}")
        print(textwrap.fill(scenario.doc, 100, initial_indent=indent, subsequent_indent=indent))
    return EXIT_OK


def _scenario_refused(args: argparse.Namespace) -> int | None:
    """The exit status when ``lab run``'s arguments cannot run a scenario here, else None."""
    if args.scenario is None:
        print("spark-watchdog lab run: give --scenario NAME (see --list)", file=sys.stderr)
        return EXIT_USAGE
    from spark_watchdog.lab.stories.colocated_scenarios import ColocatedScenario
    from spark_watchdog.lab.stories.scenarios import SCENARIOS

    scenario = SCENARIOS[args.scenario]
    if isinstance(scenario, ColocatedScenario):
        if args.nodes not in (None, scenario.nodes) or (args.vllm, args.serving) != (
            "standin",
            "process",
        ):
            print(
                f"spark-watchdog lab run: scenario {scenario.name} runs on {scenario.nodes} "
                "nodes with the lab's own ranks (no --vllm real, no --serving), its "
                "controllers on them",
                file=sys.stderr,
            )
            return EXIT_USAGE
        args.nodes = scenario.nodes
    if args.nodes is None:
        args.nodes = 4
    if not _nodes_ok(args.nodes):
        return EXIT_USAGE
    if args.nodes < scenario.min_nodes:
        print(
            f"spark-watchdog lab run: scenario {scenario.name} needs at least "
            f"{scenario.min_nodes} nodes",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.node is not None and args.scenario != "freeze":
        print("spark-watchdog lab run: --node applies to the freeze scenario", file=sys.stderr)
        return EXIT_USAGE
    if not _real_vllm_ok(args.vllm):
        return EXIT_NOT_AVAILABLE
    if not _serving_ok(args.serving, args.vllm):
        return EXIT_NOT_AVAILABLE
    return None


@_lab_errors
def _run_scenario(args: argparse.Namespace) -> int:
    if args.list:
        return _list_scenarios()
    refused = _scenario_refused(args)
    if refused is not None:
        return refused
    from spark_watchdog.lab.stories.scenarios import run_scenario
    from spark_watchdog.lab.timeline import Narrator

    keep = args.keep or args.dir is not None
    workdir = args.dir or Path(tempfile.mkdtemp(prefix=f"spark-watchdog-lab-{args.scenario}-"))
    workdir = workdir.resolve()
    stream = sys.stderr if args.json else sys.stdout

    def echo(line: str) -> None:
        print(line, file=stream, flush=True)

    try:
        with _lab_signals(workdir / "controller.log"):
            result = run_scenario(
                args.scenario,
                workdir=workdir,
                nodes=args.nodes,
                narrator=Narrator(echo=echo),
                node=args.node,
                vllm=args.vllm,
                serving=args.serving,
            )
    except KeyboardInterrupt:
        print("\ninterrupted; every lab process stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    if not keep:
        result.history = None
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        _print_result(result.to_json())
    if result.outcome == "not_available":
        return EXIT_NOT_AVAILABLE
    return EXIT_OK if result.ok else EXIT_FAILED


def _print_result(report: dict[str, Any]) -> None:
    verdict = "as expected" if report["ok"] else "NOT as expected"
    print(
        f"\nscenario {report['scenario']}: {report['outcome']} ({verdict}: "
        f"expects {' or '.join(report['expected'])})"
    )
    for key in ("detected_after_s", "recovered_after_s"):
        if report[key] is not None:
            print(f"  {key:<20} {report[key]:.1f}")
    print(
        f"  {'power_actions':<20} {report['power_actions']} "
        f"({', '.join(report['pdu_commands']) or 'none'}); "
        f"false: {report['false_power_actions']}"
    )
    print(f"  {'serving_restarts':<20} {report['serving_restarts']}")
    print(f"  {'incidents':<20} {report['incident_ids'] or 'none'}")
    if report["alerts"]:
        print(f"  {'alerts':<20} {', '.join(report['alerts'])}")
    for note in report["notes"]:
        print(f"  note: {note}")
    for problem in report["problems"]:
        print(f"  PROBLEM: {problem}")
    if report["history"]:
        print(f"  history: spark-watchdog history --db {report['history']}")


@_lab_errors
def _run_up(args: argparse.Namespace) -> int:
    if not _nodes_ok(args.nodes):
        return EXIT_USAGE
    from spark_watchdog.lab.netns import netns_unavailable
    from spark_watchdog.lab.rank_containers import serving_conflict
    from spark_watchdog.lab.up import run_up

    controllers = _controllers(args)
    if isinstance(controllers, int):
        return controllers
    netns = args.netns or controllers is not None
    if (conflict := serving_conflict(args.serving, netns=netns)) is not None:
        print(f"spark-watchdog lab up: {conflict}", file=sys.stderr)
        return EXIT_USAGE
    if netns and (why := netns_unavailable()) is not None:
        flag = "--colocated (network namespaces)" if controllers else "--netns"
        print(f"spark-watchdog lab up: {flag} is not available here: {why}", file=sys.stderr)
        return EXIT_NOT_AVAILABLE
    if not _serving_ok(args.serving):
        return EXIT_NOT_AVAILABLE

    workdir = (args.dir or Path(tempfile.mkdtemp(prefix="spark-watchdog-lab-up-"))).resolve()
    with _lab_signals(None):
        return run_up(
            workdir, args.nodes, netns=netns, serving=args.serving, controllers=controllers
        )


def _controllers(args: argparse.Namespace) -> tuple[str, ...] | int | None:
    """The nodes that run a controller with --colocated (None: the lab machine
    runs it), or the exit status of a usage error."""
    if args.controllers is None:
        return ("spark-1", "spark-2") if args.colocated else None
    if not args.colocated:
        print("spark-watchdog lab up: --controllers goes with --colocated", file=sys.stderr)
        return EXIT_USAGE
    names = tuple(n.strip() for n in str(args.controllers).split(",") if n.strip())
    known = {f"spark-{i + 1}" for i in range(args.nodes)}
    if len(names) < 2 or len(set(names)) != len(names) or not set(names) <= known:
        print(
            "spark-watchdog lab up: --controllers: expected two or more different nodes of "
            f"{', '.join(sorted(known))}, comma-separated",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return names


def _run_inject(args: argparse.Namespace) -> int:
    from spark_watchdog.lab.up import InjectError, inject

    token = None
    if args.token_file is not None:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            print(f"spark-watchdog lab inject: --token-file: {exc}", file=sys.stderr)
            return EXIT_USAGE
    if (args.control is None) != (token is None):
        print(
            "spark-watchdog lab inject: give --control and --token-file together", file=sys.stderr
        )
        return EXIT_USAGE
    try:
        answer = inject(args.fault, args.node, control=args.control, token=token)
    except InjectError as exc:
        print(f"spark-watchdog lab inject: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print(f"injected {answer.get('injected')}: {answer.get('what')}")
    return EXIT_OK
