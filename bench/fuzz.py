"""Long fuzz runs of the parsers that read outside input (bench/fuzz_targets.py).

Each target runs for ``--runs`` executions (default 1,000,000), one target at
a time, each in a child process of its own: libFuzzer ends the process when
its run is done. With atheris installed (``pip install -e '.[fuzz]'``) the
engine is libFuzzer, coverage-guided over the project's code and the parsing
libraries (prometheus_client, pyasn1/pysnmp; not PyYAML, whose scanner would cost
the config target 2.5 times its executions); without it, or with
``--engine random``, a seeded random-mutation loop over the same seeds.

A finding is an exception the target does not document. Findings do not stop
a run: each distinct one (type and innermost project frame) is counted, and
its first input is written to ``--findings-dir``. Keep a fixed example of each
in tests/fuzz/corpus/<target>/ once it is fixed.

    .venv/bin/python -m bench.fuzz --json-out docs/results/fuzz.json
    .venv/bin/python -m bench.fuzz --targets metrics,snapshot --runs 20000
    .venv/bin/python -m bench.fuzz --targets config --max-seconds 900
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.fuzz_targets import TARGETS, Target, check, seeds

# Longest input per target: a bit above the largest realistic seed, so the
# mutations stay near real traffic instead of growing into megabytes.
MAX_LEN = {
    "metrics": 8192,
    "journal": 4096,
    "snmp": 2048,
    "snapshot": 4096,
    "config": 4096,
    "intake": 8192,
}
# Words libFuzzer splices into inputs (its -dict); the random engine uses them too.
DICTIONARY: dict[str, tuple[str, ...]] = {
    "metrics": (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:iteration_tokens_total_count",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "_created",
        "_bucket",
        'engine="',
        'model_name="',
        "# TYPE ",
        "# HELP ",
        " counter",
        " gauge",
        " histogram",
        "NaN",
        "+Inf",
        "1e308",
        "\\n",
        '\\"',
    ),
    "intake": (
        '"seq":',
        '"at_unix":',
        '"since":',
        '"progress_ago_s":',
        '"seconds_without_progress":',
        '"gpu_faults":{"faults":[{"id":1,"xid":43,"result":"stopped","at_unix":',
        '"memory_guard":{"last_kill":{"id":1,"result":"killed","at_unix":',
        '"peers":{"spark-2":{"seq":',
        '"agent_at_unix":',
        "1764000000",
        "1.7e15",
        "1e999",
        "-Infinity",
        "NaN",
        "99999999999999999999999999999",
        '"\\u0000"',
    ),
    "snapshot": (
        "HTTP/1.1 200 OK\r\n",
        "Content-Length: ",
        "\r\n\r\n",
        '"seq":',
        '"boot_id":',
        '"started_at":',
        '"probes":',
        '"vllm":',
        '"state":"stalled"',
        '"state":"dead"',
        '"seconds_without_progress":',
        '"stopping":{"system":true}',
        "1e999",
        "NaN",
        "[[[[",
        "null",
    ),
    "config": (
        "node:",
        "listen:",
        "probes:",
        "nodes:",
        "power:",
        "&a ",
        "*a",
        "<<: ",
        "!!python/object",
        ".nan",
        ".inf",
        "~",
        "- ",
        ": ",
    ),
}


def _instrumented_imports(name: str) -> None:
    """Import what the target runs, under atheris's coverage instrumentation."""
    import atheris

    with atheris.instrument_imports(
        include=["spark_watchdog", "bench", "prometheus_client", "pyasn1", "pysnmp"]
    ):
        import bench.fuzz_targets as targets

        if name == "metrics":
            import spark_watchdog.probes.vllm_metrics
        elif name == "journal":
            import spark_watchdog.probes.journal
        elif name == "snmp":
            import pyasn1.codec.ber.decoder  # noqa: F401

            import spark_watchdog.power.snmp
        elif name == "snapshot":
            import spark_watchdog.controller.look.http_client
            import spark_watchdog.controller.look.node_watch
        elif name == "config":
            import spark_watchdog.config.agent
            import spark_watchdog.config.controller
        elif name == "intake":
            import spark_watchdog.controller.look.intake
            import spark_watchdog.controller.look.node_watch
            import spark_watchdog.history.records  # noqa: F401
        targets.check(targets.TARGETS[name], b"")  # the harness's own lazy imports


class Tally:
    """Executions and distinct findings of one target."""

    def __init__(self, target: Target, findings_dir: Path, stats_path: Path | None) -> None:
        self.target = target
        self.findings_dir = findings_dir
        self.stats_path = stats_path
        self.executions = 0
        self.started = time.monotonic()
        self.findings: dict[str, dict[str, Any]] = {}
        self._saved_at = 0.0

    def run(self, data: bytes) -> None:
        self.executions += 1
        exc = check(self.target, data)
        if exc is not None:
            self._note(exc, data)
        now = time.monotonic()
        if self.stats_path is not None and now - self._saved_at > 2.0:
            self.save()

    def _note(self, exc: BaseException, data: bytes) -> None:
        key = signature(exc)
        known = self.findings.get(key)
        if known is not None:
            known["count"] += 1
            return
        self.findings_dir.mkdir(parents=True, exist_ok=True)
        digest = f"{abs(hash(key)) & 0xFFFFFFFF:08x}"
        path = self.findings_dir / f"{self.target.name}-{digest}.bin"
        path.write_bytes(data)
        self.findings[key] = {
            "signature": key,
            "message": f"{type(exc).__name__}: {str(exc)[:300]}",
            "count": 1,
            "first_at_execution": self.executions,
            "input": str(path),
            "traceback": "".join(traceback.format_exception(exc))[-2000:],
        }
        self.save()

    def result(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started
        return {
            "target": self.target.name,
            "executions": self.executions,
            "seconds": round(elapsed, 1),
            "executions_per_s": round(self.executions / elapsed, 1) if elapsed > 0 else None,
            "findings": len(self.findings),
            "finding_details": list(self.findings.values()),
        }

    def save(self) -> None:
        self._saved_at = time.monotonic()
        if self.stats_path is not None:
            self.stats_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.stats_path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.result(), indent=2))
            os.replace(tmp, self.stats_path)


def signature(exc: BaseException) -> str:
    """Type and innermost frame in the project: the same bug, found twice, counts once."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "/spark_watchdog/" in f.filename] or frames
    where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else "?"
    return f"{type(exc).__name__} at {where}"


# -- engines --------------------------------------------------------------------


def child_atheris(
    name: str, runs: int, findings_dir: Path, stats_path: Path, max_seconds: int
) -> None:
    """Run inside the child: libFuzzer calls exit() when ``runs`` are done."""
    import atheris

    _instrumented_imports(name)
    tally = Tally(TARGETS[name], findings_dir, stats_path)
    work = Path(tempfile.mkdtemp(prefix=f"spark-watchdog-fuzz-{name}-"))
    corpus_dir = work / "corpus"
    corpus_dir.mkdir()
    for label, data in seeds(name):
        (corpus_dir / label).write_bytes(data[: MAX_LEN[name]])
    argv = [
        sys.argv[0],
        str(corpus_dir),
        f"-runs={runs}",
        f"-max_len={MAX_LEN[name]}",
        "-timeout=30",
        "-rss_limit_mb=4096",
        "-print_final_stats=1",
        f"-artifact_prefix={work}/",
        f"-seed={1 + sum(map(ord, name))}",
    ]
    if max_seconds > 0:
        argv.append(f"-max_total_time={max_seconds}")
    words = DICTIONARY.get(name)
    if words:
        dict_path = work / "words.dict"
        dict_path.write_text("".join(f'"{_dict_escape(w)}"\n' for w in words))
        argv.append(f"-dict={dict_path}")

    def one(data: bytes) -> None:
        tally.run(data)
        if tally.executions >= runs:
            tally.save()

    atheris.Setup(argv, one)
    try:
        atheris.Fuzz()
    finally:
        tally.save()


def _dict_escape(word: str) -> str:
    """libFuzzer's -dict syntax: printable ASCII as is, anything else as \\xNN."""
    return "".join(
        chr(b) if 32 <= b < 127 and b not in (0x22, 0x5C) else f"\\x{b:02x}" for b in word.encode()
    )


def mutate(rng: random.Random, data: bytes, pool: list[bytes], words: tuple[str, ...]) -> bytes:
    """A few libFuzzer-like mutations: flips, byte sets, inserts, deletes, splices, words."""
    out = bytearray(data)
    for _ in range(1 + rng.randrange(4)):
        op = rng.randrange(7)
        at = rng.randrange(len(out) + 1)
        if op == 0 and out:
            out[at % len(out)] ^= 1 << rng.randrange(8)
        elif op == 1 and out:
            out[at % len(out)] = rng.choice((0, 0xFF, 0x7F, 0x80, 0x0A, 0x22, rng.randrange(256)))
        elif op == 2:
            out[at:at] = bytes(rng.randrange(256) for _ in range(1 + rng.randrange(8)))
        elif op == 3 and out:
            del out[at : at + 1 + rng.randrange(16)]
        elif op == 4 and pool:
            other = rng.choice(pool)
            start = rng.randrange(len(other) + 1)
            out[at:at] = other[start : start + rng.randrange(64)]
        elif op == 5 and words:
            out[at:at] = rng.choice(words).encode()
        elif op == 6 and out:
            start = rng.randrange(len(out))
            out[at:at] = out[start : start + rng.randrange(32)] * (1 + rng.randrange(8))
    return bytes(out)


def child_random(
    name: str, runs: int, findings_dir: Path, stats_path: Path, seed: int, max_seconds: int
) -> None:
    rng = random.Random(seed + sum(map(ord, name)))
    limit = MAX_LEN[name]
    pool = [data[:limit] for _, data in seeds(name)] or [b""]
    words = DICTIONARY.get(name, ())
    tally = Tally(TARGETS[name], findings_dir, stats_path)
    for data in pool:
        tally.run(data)
    deadline = time.monotonic() + max_seconds if max_seconds > 0 else float("inf")
    while tally.executions < runs and time.monotonic() < deadline:
        data = mutate(rng, rng.choice(pool), pool, words)[:limit]
        tally.run(data)
        # Keep a few mutants around so mutations can stack, as a corpus would.
        if rng.random() < 0.01:
            pool.append(data)
            if len(pool) > 512:
                pool.pop(rng.randrange(len(pool)))
    tally.save()


# -- the parent -----------------------------------------------------------------


def have_atheris() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def run_target(
    name: str, runs: int, engine: str, findings_dir: Path, seed: int, max_seconds: int = 0
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        stats = Path(tmp) / "stats.json"
        cmd = [
            sys.executable,
            "-m",
            "bench.fuzz",
            "--child",
            name,
            "--engine",
            engine,
            "--runs",
            str(runs),
            "--findings-dir",
            str(findings_dir),
            "--stats",
            str(stats),
            "--seed",
            str(seed),
            "--max-seconds",
            str(max_seconds),
        ]
        started = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        result: dict[str, Any] = (
            json.loads(stats.read_text())
            if stats.exists()
            else {"target": name, "executions": 0, "findings": 0, "finding_details": []}
        )
    done = re.search(r"Done (\d+) runs in (\d+) second", proc.stderr)
    if done:
        result["libfuzzer_runs"] = int(done.group(1))
    cov = re.findall(r"cov: (\d+) ft: (\d+)", proc.stderr)
    if cov:
        result["coverage_edges"], result["coverage_features"] = map(int, cov[-1])
    result["wall_s"] = round(wall, 1)
    result["engine"] = engine
    result["exit_code"] = proc.returncode
    if proc.returncode != 0:
        result["stderr_tail"] = proc.stderr[-2000:]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma-separated")
    parser.add_argument("--runs", type=int, default=1_000_000, help="executions per target")
    parser.add_argument("--engine", choices=("auto", "atheris", "random"), default="auto")
    parser.add_argument("--seed", type=int, default=1, help="for the random engine")
    parser.add_argument(
        "--max-seconds",
        type=int,
        default=0,
        help="stop a target after this long even if --runs are not done (0: no limit)",
    )
    parser.add_argument("--findings-dir", type=Path, default=Path("build/fuzz-findings"))
    parser.add_argument("--json-out", type=Path)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--stats", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    engine = args.engine
    if engine == "auto":
        engine = "atheris" if have_atheris() else "random"
    if args.child:
        import logging

        logging.disable(logging.CRITICAL)  # the targets log warnings for odd answers
        if engine == "atheris":
            child_atheris(args.child, args.runs, args.findings_dir, args.stats, args.max_seconds)
        else:
            child_random(
                args.child, args.runs, args.findings_dir, args.stats, args.seed, args.max_seconds
            )
        return 0

    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; known: {', '.join(TARGETS)}")
    results = []
    for name in names:  # one at a time: the machine is shared
        result = run_target(name, args.runs, engine, args.findings_dir, args.seed, args.max_seconds)
        results.append(result)
        rate = result.get("executions_per_s")
        print(
            f"{name:9} {result['executions']:>9} executions  "
            f"{rate if rate is not None else '-':>8} exec/s  "
            f"{result['findings']} finding(s)  [{engine}, exit {result['exit_code']}]",
            flush=True,
        )
        for finding in result["finding_details"]:
            print(f"    {finding['signature']}: {finding['message']}  -> {finding['input']}")
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(
            json.dumps(
                {
                    "benchmark": "fuzz",
                    "command": "python -m bench.fuzz " + " ".join(argv or sys.argv[1:]),
                    "engine": engine,
                    "runs_per_target": args.runs,
                    "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "python": platform.python_version(),
                    "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                    "targets": results,
                },
                indent=2,
            )
            + "\n"
        )
    return 1 if any(r["findings"] or r["exit_code"] != 0 for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
