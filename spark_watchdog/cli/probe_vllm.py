"""``spark-watchdog probe vllm``: is this vLLM head making progress?"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any

from spark_watchdog.probes.vllm import ProgressTracker, VllmScraper, VllmStatus, check_base_url

# Without --watch / --stall-after: watch this long and judge over that window.
QUICK_WINDOW = 2.0
# Sample at most this far apart while watching.
SAMPLE_EVERY = 1.0
MAX_BODY_BYTES = 8 * 1024 * 1024
HEALTHY = frozenset({"progressing", "idle"})

_EPILOG = f"""\
A single scrape cannot show progress, so the probe always watches a window:
  no --watch, no --stall-after   watch {QUICK_WINDOW:g} s and call it stalled if requests
                                 ran and no engine step or token appeared in it
  --watch W                      watch W s; stalled = no progress for the whole W
  --stall-after S                watch S s; stalled = no progress for S
  --watch W --stall-after S      watch W s; stalled = no progress for S (S <= W)
The agent's default rule is --stall-after 15. Samples are taken every
{SAMPLE_EVERY:g} s at most (or every S/2 when S is shorter).

states: progressing, idle (exit 0); stalled, dead (/health 503), unreachable
(no usable answer) (exit 1). Usage errors exit 2."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``vllm`` subcommand to ``spark-watchdog probe``."""
    parser = subparsers.add_parser(
        "vllm",
        help="check that vLLM serving makes progress, not only that /health says 200",
        description="Scrape a vLLM head's /health and /metrics for a while and say whether "
        "serving is progressing, idle, stalled (requests running, counters frozen), dead "
        "or unreachable.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--url", required=True, type=_http_url, help="the head's base URL, e.g. http://HEAD:8000"
    )
    parser.add_argument(
        "--watch", type=_seconds, metavar="SECONDS", help="how long to watch before judging"
    )
    parser.add_argument(
        "--stall-after",
        type=_seconds,
        metavar="SECONDS",
        help="no progress this long with requests running = stalled",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=2.0,
        metavar="SECONDS",
        help="deadline for each scrape, /health and /metrics together (default: 2)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    watch, stall_after = args.watch, args.stall_after
    if watch is None and stall_after is None:
        watch = stall_after = QUICK_WINDOW
    elif watch is None:
        watch = stall_after
    elif stall_after is None:
        stall_after = watch
    if stall_after > watch:
        print(
            f"probe vllm: --stall-after {stall_after:g} is longer than --watch {watch:g}: "
            "a stall could never be seen; expected --stall-after <= --watch",
            file=sys.stderr,
        )
        return 2
    scraper = VllmScraper(args.url, args.timeout, MAX_BODY_BYTES)
    tracker = ProgressTracker(stall_after)
    every = min(SAMPLE_EVERY, stall_after / 2)
    samples = 0
    first: VllmStatus | None = None
    start = time.monotonic()
    while True:
        sample = scraper.scrape()
        status = tracker.update(sample, sample.observed_at)
        samples += 1
        if first is None:
            first = status
        elapsed = sample.observed_at - start
        if not args.json:
            print(_progress_line(elapsed, watch, status, first), file=sys.stderr)
        if elapsed >= watch:
            break
        # The last sample lands exactly at the end of the window, so a stall
        # of exactly --stall-after (= --watch) is seen.
        next_at = start + min(samples * every, watch)
        while (left := next_at - time.monotonic()) > 0:
            time.sleep(left)
    if args.json:
        report: dict[str, Any] = status.to_json()
        report.update(watched_seconds=round(elapsed, 3), stall_after=stall_after, samples=samples)
        print(json.dumps(report, indent=2))
    else:
        print(_summary(status, first, elapsed))
    return 0 if status.state in HEALTHY else 1


def _progress_line(elapsed: float, watch: float, status: VllmStatus, first: VllmStatus) -> str:
    return (
        f"[{elapsed:5.1f}/{watch:g} s] {status.state:<11} running={_shown(status.running)} "
        f"waiting={_shown(status.waiting)} "
        f"steps={_delta(first.engine_steps, status.engine_steps)} "
        f"tokens={_delta(first.generation_tokens, status.generation_tokens)}"
    )


def _summary(status: VllmStatus, first: VllmStatus, elapsed: float) -> str:
    lines = [
        f"vLLM at {status.url}: {status.state}",
        f"  {status.reason}",
        f"  /health: {_shown(status.health_status)}",
        f"  requests running: {_shown(status.running)}, waiting: {_shown(status.waiting)}",
        f"  engine steps: {_shown(status.engine_steps)} "
        f"({_delta(first.engine_steps, status.engine_steps)} in {elapsed:.1f} s)",
        f"  generated tokens: {_shown(status.generation_tokens)} "
        f"({_delta(first.generation_tokens, status.generation_tokens)} in {elapsed:.1f} s)",
    ]
    if status.seconds_without_progress is not None:
        lines.append(f"  seconds without progress: {status.seconds_without_progress:.1f}")
    if len(status.engines) > 1:
        lines += [f"  engine {e.engine}: {e.state}: {e.reason}" for e in status.engines.values()]
    if status.error and status.error not in status.reason:
        lines.append(f"  error: {status.error}")
    return "\n".join(lines)


def _shown(value: int | None) -> str:
    return "-" if value is None else str(value)


def _delta(before: int | None, after: int | None) -> str:
    if before is None or after is None:
        return _shown(after)
    return f"{after - before:+d}"


def _http_url(text: str) -> str:
    try:
        check_base_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("url: ")) from exc
    return text


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value
