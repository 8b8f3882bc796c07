"""vLLM's own argument parser on a flag given twice: it reads the last one, whole.

A cluster launcher appends the profile's ``{vllm_args}`` to its recipe, so
after one restart the head's command carries ``--speculative-config`` and
``--compilation-config`` twice; the next restart merges the profile into the
last of each (spark_watchdog/profiles.py). That rests on which occurrence vLLM
reads: asked here of the real parser (``FlexibleArgumentParser`` with the
server's arguments), not reasoned from argparse.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from spark_watchdog.controller.serving.cluster_launcher import launcher_values, substitute
from spark_watchdog.profiles import BUILTIN_PROFILES, PLAIN, SAFE

# Importing vLLM takes a while on a loaded machine: generous, not a measure.
PARSE_TIMEOUT_S = 600.0

# Builds vLLM's server argument parser, parses each argv of the JSON list on
# stdin and prints what it read of the two JSON flags.
_PARSE = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser

def mode_name(value):
    return None if value is None else getattr(value, "name", str(value))

out = []
for argv in json.load(sys.stdin):
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    compilation = args.compilation_config
    out.append({
        "mode": getattr(compilation, "mode", None),
        "cudagraph_mode": mode_name(getattr(compilation, "cudagraph_mode", None)),
        "speculative": args.speculative_config,
    })
print(json.dumps(out))
"""

RECIPE_SPEC = '{"method":"ngram","prompt_lookup_max":4,"enable_adaptive_verification":true}'
RECIPE = [
    "--model",
    "m",
    "--speculative-config",
    RECIPE_SPEC,
    '--compilation-config={"mode":3,"cudagraph_mode":"FULL_AND_PIECEWISE"}',
]


def _parsed(python: Path, argvs: list[list[str]]) -> list[dict[str, Any]]:
    ran = subprocess.run(
        [str(python), "-c", _PARSE],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=PARSE_TIMEOUT_S,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    found: list[dict[str, Any]] = json.loads(ran.stdout.strip().splitlines()[-1])
    return found


def test_vllm_reads_the_last_of_a_repeated_flag_and_the_merge_writes_there(
    vllm_python: Path,
) -> None:
    twice = [
        "--model",
        "m",
        "--compilation-config",
        '{"mode":3}',
        '--compilation-config={"cudagraph_mode":"FULL_DECODE_ONLY"}',
        "--speculative-config",
        RECIPE_SPEC,
        "--speculative-config",
        '{"method":"ngram","prompt_lookup_max":2}',
    ]
    # The launcher's start: the recipe with {vllm_args} appended, first as the
    # operator started it (plain), then restarted with safe twice over.
    start = [*RECIPE, "{vllm_args}"]
    first = substitute(start, launcher_values(BUILTIN_PROFILES[PLAIN]))
    second = substitute(start, launcher_values(BUILTIN_PROFILES[SAFE], first))
    third = substitute(start, launcher_values(BUILTIN_PROFILES[SAFE], second))

    read_twice, read_second, read_third = _parsed(vllm_python, [twice, second, third])

    # The last occurrence, whole: nothing of the first is merged in.
    assert read_twice == {
        "mode": None,
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "speculative": {"method": "ngram", "prompt_lookup_max": 2},
    }
    # After restart upon restart vLLM runs the recipe's config with the profile in.
    assert third == second and read_third == read_second
    assert read_second == {
        "mode": 3,
        "cudagraph_mode": "FULL_DECODE_ONLY",
        "speculative": {
            "method": "ngram",
            "prompt_lookup_max": 4,
            "enable_adaptive_verification": False,
        },
    }
