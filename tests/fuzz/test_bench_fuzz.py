"""bench/fuzz.py itself: a short random-engine run writes the JSON the docs quote."""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench.fuzz import main, mutate


def test_a_short_run_counts_executions_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "fuzz.json"
    code = main(
        [
            "--targets",
            "metrics,snapshot",
            "--runs",
            "300",
            "--engine",
            "random",
            "--findings-dir",
            str(tmp_path / "findings"),
            "--json-out",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    assert code == 0, result
    assert result["engine"] == "random"
    assert [t["target"] for t in result["targets"]] == ["metrics", "snapshot"]
    for target in result["targets"]:
        assert target["executions"] == 300
        assert target["findings"] == 0
        assert target["executions_per_s"] > 0


def test_mutations_are_deterministic_for_a_seed() -> None:
    pool = [b"vllm:num_requests_running 1\n", b"HTTP/1.1 200 OK\r\n\r\n{}"]
    first = [mutate(random.Random(7), p, pool, ("NaN",)) for p in pool]
    again = [mutate(random.Random(7), p, pool, ("NaN",)) for p in pool]
    assert first == again
