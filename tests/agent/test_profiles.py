"""Profile merging into the operator's argv: tables for the cases, hypothesis for the laws."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_watchdog.profiles import (
    BUILTIN_PROFILES,
    COMPILATION_FLAG,
    SPECULATIVE_FLAG,
    Profile,
    ProfileError,
    apply_profile,
    flag_json,
    merge_patch,
)

SAFE = BUILTIN_PROFILES["safe"]
BASE = ["vllm", "serve", "org/model", "--tensor-parallel-size", "4"]
SPEC = '{"method":"dspark","num_speculative_tokens":5,"enable_adaptive_verification":true}'


def _json_after(argv: list[str], flag: str) -> Any:
    return json.loads(argv[argv.index(flag) + 1])


def test_safe_merges_into_both_flags_and_keeps_everything_else() -> None:
    argv = [*BASE, SPECULATIVE_FLAG, SPEC, COMPILATION_FLAG, '{"mode":3}', "--port", "8000"]
    out = apply_profile(argv, SAFE)
    assert out[:5] == BASE and out[-2:] == ["--port", "8000"]
    assert len(out) == len(argv)  # merged in place, nothing appended
    assert _json_after(out, SPECULATIVE_FLAG) == {
        "method": "dspark",
        "num_speculative_tokens": 5,
        "enable_adaptive_verification": False,
    }
    assert _json_after(out, COMPILATION_FLAG) == {"mode": 3, "cudagraph_mode": "FULL_DECODE_ONLY"}


def test_equals_spelling_is_kept() -> None:
    out = apply_profile([*BASE, f"{SPECULATIVE_FLAG}={SPEC}"], SAFE)
    spec = next(a for a in out if a.startswith(SPECULATIVE_FLAG + "="))
    assert json.loads(spec.split("=", 1)[1])["enable_adaptive_verification"] is False
    assert _json_after(out, COMPILATION_FLAG) == {"cudagraph_mode": "FULL_DECODE_ONLY"}


def test_missing_compilation_config_is_appended_but_speculation_is_not_switched_on() -> None:
    out = apply_profile(BASE, SAFE)
    # No --speculative-config: speculative decoding is off, and vLLM rejects a
    # speculative config without a method or model. Only the compilation flag goes in.
    assert out == [*BASE, COMPILATION_FLAG, '{"cudagraph_mode":"FULL_DECODE_ONLY"}']


def test_a_profile_that_names_a_method_does_add_the_speculative_flag() -> None:
    profile = Profile("spec", speculative_config={"method": "ngram", "prompt_lookup_max": 4})
    out = apply_profile(BASE, profile)
    assert _json_after(out, SPECULATIVE_FLAG) == {"method": "ngram", "prompt_lookup_max": 4}


def test_extra_args_are_appended_last_and_plain_changes_nothing() -> None:
    profile = Profile("x", compilation_config={"mode": 0}, extra_args=("--max-num-seqs", "8"))
    out = apply_profile(BASE, profile)
    assert out[-2:] == ["--max-num-seqs", "8"]
    assert apply_profile(BASE, BUILTIN_PROFILES["plain"]) == BASE


def test_null_removes_a_key_and_objects_merge_deeply() -> None:
    argv = [*BASE, COMPILATION_FLAG, '{"pass_config":{"a":1,"b":2},"level":3}']
    profile = Profile("x", compilation_config={"pass_config": {"b": None, "c": 3}, "level": None})
    assert _json_after(apply_profile(argv, profile), COMPILATION_FLAG) == {
        "pass_config": {"a": 1, "c": 3}
    }


@pytest.mark.parametrize(
    ("argv", "profile", "message"),
    [
        (
            [*BASE, SPECULATIVE_FLAG, "{method: dspark}"],
            SAFE,
            "--speculative-config: expected a JSON object, got '{method: dspark}'",
        ),
        (
            [*BASE, COMPILATION_FLAG, "3"],
            SAFE,
            "--compilation-config: expected a JSON object, got '3'",
        ),
        ([*BASE, SPECULATIVE_FLAG], SAFE, "--speculative-config is the last argument"),
        ([*BASE, "-O3"], SAFE, "the command sets it as '-O3'"),
        (
            [*BASE, "--compilation-config.cudagraph_mode", "FULL"],
            SAFE,
            "'--compilation-config.cudagraph_mode'",
        ),
    ],
)
def test_commands_a_profile_cannot_merge_into_are_named(
    argv: list[str], profile: Profile, message: str
) -> None:
    with pytest.raises(ProfileError) as caught:
        apply_profile(argv, profile)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "second",
    [
        [COMPILATION_FLAG, '{"level":3,"cudagraph_mode":"FULL_AND_PIECEWISE"}'],
        [f'{COMPILATION_FLAG}={{"level":3,"cudagraph_mode":"FULL_AND_PIECEWISE"}}'],
    ],
)
def test_a_repeated_flag_takes_the_profile_in_its_last_occurrence(second: list[str]) -> None:
    first = [COMPILATION_FLAG, '{"level":1}', f"{SPECULATIVE_FLAG}={SPEC}"]
    argv = [*BASE, *first, *second, SPECULATIVE_FLAG, '{"method":"ngram"}']

    out = apply_profile(argv, SAFE)

    # The earlier occurrences stay as written (vLLM reads only the last one).
    assert out[5:8] == first
    assert flag_json(out, COMPILATION_FLAG) == {"level": 3, "cudagraph_mode": "FULL_DECODE_ONLY"}
    assert flag_json(out, SPECULATIVE_FLAG) == {
        "method": "ngram",
        "enable_adaptive_verification": False,
    }
    assert len(out) == len(argv)  # merged in place, nothing appended
    assert apply_profile(out, SAFE) == out  # again: the same argv


def test_odd_spellings_are_fine_when_the_profile_does_not_touch_that_flag() -> None:
    only_spec = Profile("s", speculative_config={"enable_adaptive_verification": False})
    argv = [*BASE, "-O3", SPECULATIVE_FLAG, SPEC]
    assert apply_profile(argv, only_spec)[:6] == argv[:6]


def test_long_bad_values_are_shortened_in_the_message() -> None:
    with pytest.raises(ProfileError) as caught:
        apply_profile([*BASE, SPECULATIVE_FLAG, "x" * 500], SAFE)
    assert "..." in str(caught.value) and len(str(caught.value)) < 300


def test_flags_after_double_dash_are_not_ours() -> None:
    argv = [*BASE, "--", COMPILATION_FLAG, "not json"]
    out = apply_profile(argv, SAFE)
    assert out[: len(argv)] == argv and out[-2] == COMPILATION_FLAG


def test_flag_json_reads_what_argparse_would() -> None:
    assert flag_json([*BASE, COMPILATION_FLAG, '{"a":1}'], COMPILATION_FLAG) == {"a": 1}
    assert flag_json([*BASE, f"{COMPILATION_FLAG}=[1]"], COMPILATION_FLAG) is None
    assert flag_json(BASE, COMPILATION_FLAG) is None


# --- laws ------------------------------------------------------------------------

_keys = st.sampled_from(["method", "cudagraph_mode", "level", "pass_config", "a", "b"])
_leaf = st.one_of(st.booleans(), st.integers(-5, 5), st.text("ab ", max_size=3), st.none())
_json = st.recursive(_leaf, lambda inner: st.dictionaries(_keys, inner, max_size=4), max_leaves=8)
_objects = st.dictionaries(_keys, _json, max_size=5)
_plain_args = st.lists(
    st.text(alphabet="abcxyz-=0123", min_size=1, max_size=6).filter(
        lambda a: not a.startswith(("-O", "--speculative", "--compilation")) and a != "--"
    ),
    max_size=5,
)


# The machine running the suite may be small and busy: no per-example deadline.
_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(target=_objects, patch=_objects)
def test_merge_patch_is_idempotent_and_the_patch_wins(
    target: dict[str, Any], patch: dict[str, Any]
) -> None:
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once
    for key, value in patch.items():
        if value is None:
            assert key not in once
        elif isinstance(value, dict):
            assert once[key] == merge_patch(target.get(key), value)
        else:
            assert once[key] == value
    for key in target.keys() - patch.keys():
        assert once[key] == target[key]


@_SETTINGS
@given(
    before=_plain_args,
    after=_plain_args,
    current=_objects,
    patch=_objects,
    equals=st.booleans(),
    extra=st.lists(st.text("-xyz0", min_size=1, max_size=4), max_size=3),
)
def test_apply_profile_merges_keeps_the_rest_and_is_idempotent(
    before: list[str],
    after: list[str],
    current: dict[str, Any],
    patch: dict[str, Any],
    equals: bool,
    extra: list[str],
) -> None:
    text = json.dumps(current)
    flag = [f"{COMPILATION_FLAG}={text}"] if equals else [COMPILATION_FLAG, text]
    argv = ["vllm", *before, *flag, *after]
    profile = Profile("p", compilation_config=patch)
    out = apply_profile(argv, profile)
    assert flag_json(out, COMPILATION_FLAG) == merge_patch(current, patch)
    assert len(out) == len(argv)  # merged in place
    head = len(before) + 1
    assert out[:head] == argv[:head]
    assert out[head + len(flag) :] == after
    # Applying the same profile again changes nothing more.
    assert apply_profile(out, profile) == out
    with_extra = apply_profile(
        argv, Profile("p", compilation_config=patch, extra_args=tuple(extra))
    )
    assert with_extra == [*out, *extra]
