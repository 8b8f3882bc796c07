"""Time the parse of realistic vLLM /metrics payloads (about 30 KB and 220 KB).

The payloads are produced by prometheus_client with vLLM's real metric names
and label sets (``model_name``, ``engine``, ``finished_reason``), histogram
buckets as vLLM declares them, and as many engines as it takes to reach the
size. Each payload is parsed ``--repeat`` times with the probe's own parser.

    .venv/bin/python -m bench.metrics_parse --json-out docs/results/metrics_parse.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from spark_watchdog.probes.vllm_metrics import parse_metrics

LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def payload(engines: int) -> str:
    registry = CollectorRegistry()
    labels = ["model_name", "engine"]
    gauges = [
        Gauge(f"vllm:{name}", name, labels, registry=registry)
        for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc")
    ]
    counters = [
        Counter(f"vllm:{name}", name, labels, registry=registry)
        for name in (
            "prompt_tokens",
            "generation_tokens",
            "num_preemptions",
            "spec_decode_num_drafts",
            "spec_decode_num_draft_tokens",
            "spec_decode_num_accepted_tokens",
        )
    ]
    success = Counter("vllm:request_success", "ok", [*labels, "finished_reason"], registry=registry)
    histograms = [
        Histogram(f"vllm:{name}", name, labels, buckets=buckets, registry=registry)
        for name, buckets in (
            ("iteration_tokens_total", TOKEN_BUCKETS),
            ("time_to_first_token_seconds", LATENCY_BUCKETS),
            ("time_per_output_token_seconds", LATENCY_BUCKETS),
            ("e2e_request_latency_seconds", LATENCY_BUCKETS),
            ("request_queue_time_seconds", LATENCY_BUCKETS),
            ("request_inference_time_seconds", LATENCY_BUCKETS),
            ("request_prefill_time_seconds", LATENCY_BUCKETS),
            ("request_decode_time_seconds", LATENCY_BUCKETS),
            ("request_prompt_tokens", TOKEN_BUCKETS),
            ("request_generation_tokens", TOKEN_BUCKETS),
            ("request_params_max_tokens", TOKEN_BUCKETS),
            ("request_max_num_generation_tokens", TOKEN_BUCKETS),
            ("inter_token_latency_seconds", LATENCY_BUCKETS),
        )
    ]
    for e in range(engines):
        values = ("DeepSeek-V4.1-Flash", str(e))
        for gauge in gauges:
            gauge.labels(*values).set(3)
        for counter in counters:
            counter.labels(*values).inc(1000 + e)
        for reason in ("stop", "length", "abort"):
            success.labels(*values, reason).inc(7)
        for histogram in histograms:
            histogram.labels(*values).observe(0.9)
    return generate_latest(registry).decode()


def measure(engines: int, repeat: int) -> dict[str, float]:
    text = payload(engines)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        parse_metrics(text)
        times.append(time.perf_counter() - started)
    times.sort()
    return {
        "engines": engines,
        "bytes": len(text.encode()),
        "median_ms": round(statistics.median(times) * 1000, 2),
        "p95_ms": round(times[int(len(times) * 0.95) - 1] * 1000, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    # One engine is ~30 KB with vLLM's families; nine are ~230 KB.
    results = [measure(1, args.repeat), measure(9, args.repeat)]
    for r in results:
        print(
            f"{r['bytes'] / 1024:6.0f} KB ({r['engines']} engine(s)): "
            f"median {r['median_ms']} ms, p95 {r['p95_ms']} ms"
        )
    if args.json_out:
        args.json_out.write_text(
            json.dumps(
                {
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "machine": platform.platform(),
                    "python": platform.python_version(),
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
