"""Reading vLLM's ``/metrics`` body (Prometheus text) into per-engine numbers.

Only the handful of series that tell "serving is progressing" from "serving is
wedged" are kept (docs/facts.md, "Metrics"): the running / waiting gauges, the
engine-step heartbeat and the token counters, plus KV-cache usage for the
report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from spark_watchdog.errors import MetricsFormatError

# Sample names, not family names: the parser strips ``_total`` from a counter's
# family name but keeps it on the samples (docs/facts.md, "Prometheus text format").
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# The histogram's _count advances once per engine step, chunked prefill
# included, so it is the heartbeat that moves even while no token is emitted.
ENGINE_STEPS = "vllm:iteration_tokens_total_count"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
# Name used by vLLM releases before the V1 metrics rename.
KV_CACHE_USAGE_OLD = "vllm:gpu_cache_usage_perc"

# sample name -> EngineSample field
_FIELDS = {
    RUNNING: "running",
    WAITING: "waiting",
    ENGINE_STEPS: "engine_steps",
    GENERATION_TOKENS: "generation_tokens",
    PROMPT_TOKENS: "prompt_tokens",
    KV_CACHE_USAGE: "kv_cache_usage",
    KV_CACHE_USAGE_OLD: "kv_cache_usage",
}

# A vLLM without data parallelism may leave the label out: that is engine 0.
DEFAULT_ENGINE = "0"


@dataclass(frozen=True)
class EngineSample:
    """One engine's numbers from one ``/metrics`` body, summed over ``model_name``.

    ``None`` means the series was absent from the body, which is not the same as 0.
    """

    engine: str
    running: int | None = None
    waiting: int | None = None
    engine_steps: int | None = None
    generation_tokens: int | None = None
    prompt_tokens: int | None = None
    kv_cache_usage: float | None = None
    models: tuple[str, ...] = field(default_factory=tuple)


def parse_metrics(text: str) -> dict[str, EngineSample]:
    """Parse a ``/metrics`` body into ``{engine label: EngineSample}``.

    An engine appears when one of the series read here carries its label; a body
    without any of them gives ``{}``. Raises
    :class:`MetricsFormatError` for an empty body or text that is not Prometheus
    exposition, naming the offending line where it can be found.
    """
    if not text.strip():
        raise MetricsFormatError("empty /metrics body; expected Prometheus text exposition")
    totals: dict[str, dict[str, float]] = {}
    models: dict[str, list[str]] = {}
    # Only the series kept here make an engine appear: an info-style series
    # without an engine label must not invent an engine "0".
    for key, name, labels, value in _kept_samples(text):
        engine = labels.get("engine", DEFAULT_ENGINE)
        model = labels.get("model_name")
        seen = models.setdefault(engine, [])
        if model is not None and model not in seen:
            seen.append(model)
        if not math.isfinite(value):
            raise MetricsFormatError(
                f"{name}{_label_text(labels)} is {value}; expected a finite number"
            )
        per_engine = totals.setdefault(engine, {})
        if key == "kv_cache_usage":
            # A fraction of one cache: adding two models' (or the old and the
            # new name's) values would exceed 1. Report the fullest.
            per_engine[key] = max(per_engine.get(key, 0.0), value)
        else:
            per_engine[key] = per_engine.get(key, 0.0) + value
            if not math.isfinite(per_engine[key]):
                # Each value is finite, their sum over model_name is not.
                raise MetricsFormatError(
                    f"{name} of engine {engine!r} adds up to {per_engine[key]} over its "
                    "series; expected counts that sum to a finite number"
                )
    engines: dict[str, EngineSample] = {}
    for engine, names in models.items():
        values = totals[engine]
        engines[engine] = EngineSample(
            engine=engine,
            running=_count(values, "running"),
            waiting=_count(values, "waiting"),
            engine_steps=_count(values, "engine_steps"),
            generation_tokens=_count(values, "generation_tokens"),
            prompt_tokens=_count(values, "prompt_tokens"),
            kv_cache_usage=values.get("kv_cache_usage"),
            models=tuple(names),
        )
    return engines


def models_seen(engines: Iterable[EngineSample]) -> tuple[str, ...]:
    """Every ``model_name`` across engines, in the order first seen."""
    seen: list[str] = []
    for sample in engines:
        seen.extend(m for m in sample.models if m not in seen)
    return tuple(seen)


def _kept_samples(text: str) -> list[tuple[str, str, dict[str, str], float]]:
    """(field, sample name, labels, value) for the samples this module keeps.

    Matching exact sample names leaves out ``_created`` (a creation timestamp,
    present or not depending on the client library:
    docs/facts.md, "Prometheus text format") and the histogram's ``_bucket`` /
    ``_sum``.
    """
    try:
        samples = [
            sample
            for family in text_string_to_metric_families(_needed_lines(text))
            for sample in family.samples
        ]
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        # The parser does not say where it failed; look for the line only now,
        # so a good body is parsed once.
        raise MetricsFormatError(_locate(text, exc)) from exc
    return [
        (_FIELDS[sample.name], sample.name, sample.labels, sample.value)
        for sample in samples
        if sample.name in _FIELDS
    ]


# A sample line: a metric name, optional labels, a value, an optional timestamp.
_SAMPLE_LINE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?[ \t]+\S+(?:[ \t]+\S+)?$")


def _needed_lines(text: str) -> str:
    """Only the sample lines this module reads, for the full parser.

    A vLLM body is mostly histogram buckets nobody here reads; handing the
    parser only the handful of needed series cuts a 220 KB scrape from ~60 ms
    to a few (docs/benchmarks.md). Every other line still has to look like
    Prometheus text, so a garbled body is still refused. Comment lines (HELP,
    TYPE) are dropped: the kept samples are matched by their full names.
    """
    kept: list[str] = []
    for number, line in enumerate(_lines(text), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name = stripped.split("{", 1)[0].split(None, 1)[0]
        if name in _FIELDS:
            kept.append(stripped)
        elif not _SAMPLE_LINE.match(stripped):
            raise MetricsFormatError(
                f"/metrics line {number} is not Prometheus text: {_excerpt(stripped)}"
            )
    return "\n".join(kept) + "\n"


def _lines(text: str) -> list[str]:
    """The text format's lines: split at ``\\n`` only, as the parser does.

    ``str.splitlines`` also splits at ``\\x0b``, ``\\x1c``, ``\\x85``, U+2028 and
    others, which may stand inside a label value or a HELP text; splitting
    there would refuse a valid body and count lines differently from the
    parser.
    """
    return text.split("\n")


def _locate(text: str, exc: Exception) -> str:
    for number, line in enumerate(_lines(text), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            for _family in text_string_to_metric_families(stripped + "\n"):
                pass
        except (ValueError, IndexError, KeyError, TypeError) as line_exc:
            return (
                f"/metrics line {number} is not Prometheus text ({_reason(line_exc)}): "
                f"{_excerpt(stripped)}"
            )
    return f"/metrics body is not Prometheus text exposition ({_reason(exc)})"


def _reason(exc: Exception) -> str:
    return str(exc) or type(exc).__name__


def _excerpt(line: str, limit: int = 120) -> str:
    return repr(line if len(line) <= limit else line[:limit] + "...")


def _label_text(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    return "{" + inner + "}"


def _count(values: dict[str, float], key: str) -> int | None:
    value = values.get(key)
    # Counters and these gauges hold whole numbers; the text format writes 12.0.
    return None if value is None else round(value)
