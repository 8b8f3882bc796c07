"""Serving profiles: named overrides merged into the operator's launch argv. Pure.

A profile changes two of vLLM's JSON-valued flags and may append arguments
(docs/design.md, "Serving restart"):

- ``speculative_config`` is merged into the JSON of ``--speculative-config``;
- ``compilation_config`` is merged into the JSON of ``--compilation-config``;
- ``extra_args`` are appended at the end of the argv.

The merge follows JSON Merge Patch (RFC 7386): objects merge key by key, any
other value replaces, and ``null`` removes the key. A ``--compilation-config``
the command does not have is appended. A missing ``--speculative-config`` is
appended only when the override names a ``method`` or ``model``: without the
flag speculative decoding is off, so ``enable_adaptive_verification`` has
nothing to apply to, and vLLM rejects a speculative config that names neither
(``SpeculativeConfig.__post_init__``, vllm/config/speculative.py). Both spellings
``--flag VALUE`` and ``--flag=VALUE`` are understood; the rewritten flag keeps
the spelling the operator used. A flag given more than once is merged into its
last occurrence, the one vLLM reads (argparse keeps the last value; a cluster
launcher's recipe with the profile's ``{vllm_args}`` appended carries each flag
twice), and the earlier ones are left as they are, as vLLM leaves them.

vLLM also accepts ``-O`` (``-O3``, ``-O '{...}'``) and dotted forms
(``--compilation-config.cudagraph_mode X``) for the compilation config. When a
profile needs to merge into a flag written that way, :func:`apply_profile`
refuses with a message that says how to write it instead: merging into a
level number or into per-key flags whose precedence differs between vLLM
versions would be a guess.

The built-in ``safe`` profile is the known mitigation for the DGX Spark
illegal-memory-access freeze (docs/facts.md, "Safe configs"): adaptive verification
off, and ``cudagraph_mode`` FULL_DECODE_ONLY. ``plain`` is the operator's
command exactly as configured, so a cluster can be switched back to it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SPECULATIVE_FLAG = "--speculative-config"
COMPILATION_FLAG = "--compilation-config"
# vLLM's short alias of --compilation-config (vllm/engine/arg_utils.py).
_COMPILATION_SHORT = "-O"

SAFE = "safe"
PLAIN = "plain"


class ProfileError(ValueError):
    """The operator's argv cannot take a profile (bad JSON, ambiguous flags)."""


@dataclass(frozen=True)
class Profile:
    """One named set of overrides (``serving.profiles`` in the agent config)."""

    name: str
    speculative_config: Mapping[str, Any] = field(default_factory=dict)
    compilation_config: Mapping[str, Any] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "speculative_config": dict(self.speculative_config),
            "compilation_config": dict(self.compilation_config),
            "extra_args": list(self.extra_args),
        }


BUILTIN_PROFILES: Mapping[str, Profile] = {
    # docs/facts.md, "Safe configs": --speculative-config
    # {...,"enable_adaptive_verification":false} or --compilation-config
    # {"cudagraph_mode":"FULL_DECODE_ONLY"}; both, since builds without vllm PR #55095
    # ignore the second while adaptive verification is on (#56626).
    SAFE: Profile(
        SAFE,
        speculative_config={"enable_adaptive_verification": False},
        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"},
    ),
    PLAIN: Profile(PLAIN),
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON Merge Patch of ``patch`` onto ``target``; neither is modified."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


@dataclass(frozen=True)
class _Occurrence:
    index: int  # position in argv of the flag (or of --flag=value)
    inline: bool  # --flag=value
    text: str | None  # the JSON text; None when the flag is last with no value


def _occurrences(argv: Sequence[str], flag: str) -> list[_Occurrence]:
    found = []
    for i, arg in enumerate(argv):
        if arg == "--":
            break  # what follows is positional for whoever parses it
        if arg == flag:
            found.append(_Occurrence(i, False, argv[i + 1] if i + 1 < len(argv) else None))
        elif arg.startswith(flag + "="):
            found.append(_Occurrence(i, True, arg[len(flag) + 1 :]))
    return found


def _other_spellings(argv: Sequence[str], flag: str) -> list[str]:
    """Arguments that set the same config in a form this module does not rewrite."""
    odd = []
    for arg in argv:
        if arg == "--":
            break
        dotted = arg.startswith(flag + ".")  # --compilation-config.cudagraph_mode X
        short = flag == COMPILATION_FLAG and arg.startswith(_COMPILATION_SHORT)  # -O3
        if dotted or short:
            odd.append(arg)
    return odd


def _excerpt(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# Keys that make a speculative config usable on its own (see the module docstring).
_SPECULATION_ON = ("method", "model")


def _merge_flag(argv: list[str], flag: str, override: Mapping[str, Any]) -> list[str]:
    if not override:
        return argv
    odd = _other_spellings(argv, flag)
    if odd:
        raise ProfileError(
            f"{flag}: the command sets it as {' '.join(repr(a) for a in odd)}; write it as "
            f"{flag} '{{...}}' (one JSON object) so a profile can merge into it"
        )
    found = _occurrences(argv, flag)
    if not found:
        if flag == SPECULATIVE_FLAG and not any(override.get(k) for k in _SPECULATION_ON):
            return argv
        return [*argv, flag, json.dumps(merge_patch({}, override), separators=(",", ":"))]
    # vLLM takes the last of a repeated flag (argparse's store; proved against its
    # own parser in tests/real_vllm/test_argv_merge.py): the profile goes there.
    one = found[-1]
    if one.text is None:
        raise ProfileError(f"{flag} is the last argument and has no value")
    try:
        current = json.loads(one.text)
    except ValueError as exc:
        raise ProfileError(
            f"{flag}: expected a JSON object, got {_excerpt(one.text)!r} ({exc})"
        ) from None
    if not isinstance(current, dict):
        raise ProfileError(f"{flag}: expected a JSON object, got {_excerpt(one.text)!r}")
    merged = json.dumps(merge_patch(current, override), separators=(",", ":"))
    out = list(argv)
    if one.inline:
        out[one.index] = f"{flag}={merged}"
    else:
        out[one.index + 1] = merged
    return out


def apply_profile(argv: Sequence[str], profile: Profile) -> list[str]:
    """The argv to launch: ``argv`` with ``profile`` merged in. Raises ProfileError."""
    out = _merge_flag(list(argv), SPECULATIVE_FLAG, profile.speculative_config)
    out = _merge_flag(out, COMPILATION_FLAG, profile.compilation_config)
    return [*out, *profile.extra_args]


def flag_json(argv: Sequence[str], flag: str) -> dict[str, Any] | None:
    """The JSON object ``flag`` carries in ``argv`` (the last one, as argparse
    would take it), or None when absent or not an object."""
    found = _occurrences(argv, flag)
    if not found or found[-1].text is None:
        return None
    try:
        value = json.loads(found[-1].text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


# --- what a running config says about a profile -----------------------------------

# vLLM's CUDAGraphMode (vllm/config/compilation.py): NONE=0, PIECEWISE=1, FULL=2,
# FULL_DECODE_ONLY=(FULL, NONE), FULL_AND_PIECEWISE=(FULL, PIECEWISE).
CUDAGRAPH_MODE_BY_VALUE = {
    "0": "NONE",
    "1": "PIECEWISE",
    "2": "FULL",
    "2,0": "FULL_DECODE_ONLY",
    "2,1": "FULL_AND_PIECEWISE",
}


def normalise_cudagraph_mode(value: object) -> str | None:
    """A cudagraph_mode as vLLM accepts it (name in any case, value, [2, 0]) → its name."""
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return CUDAGRAPH_MODE_BY_VALUE.get(text)
        return text.upper() or None
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return CUDAGRAPH_MODE_BY_VALUE.get(str(value))
    if isinstance(value, (list, tuple)) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return CUDAGRAPH_MODE_BY_VALUE.get(",".join(str(v) for v in value))
    return None


@dataclass(frozen=True)
class EffectiveConfig:
    """The two values a profile sets, as asked (the argv) or as run (the
    engine's startup line); None where unknown."""

    cudagraph_mode: str | None = None
    enable_adaptive_verification: bool | None = None

    @classmethod
    def from_json(cls, data: object) -> EffectiveConfig:
        """Read back :meth:`to_json` (an agent's answer): a value of another type
        than a mode name or a boolean is unknown (None), never a guess."""
        if not isinstance(data, Mapping):
            return cls()
        mode = data.get("cudagraph_mode")
        adaptive = data.get("enable_adaptive_verification")
        return cls(
            mode if isinstance(mode, str) and mode else None,
            adaptive if isinstance(adaptive, bool) else None,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "cudagraph_mode": self.cudagraph_mode,
            "enable_adaptive_verification": self.enable_adaptive_verification,
        }


def effective_matches(requested: EffectiveConfig, effective: EffectiveConfig) -> bool | None:
    """False if the log shows any asked-for value differently; True if it shows at
    least one and none differ; None if it shows none of what was asked (vLLM's
    ``SpeculativeConfig`` repr, for one, does not print adaptive verification)."""
    confirmed = False
    for key in ("cudagraph_mode", "enable_adaptive_verification"):
        asked, seen = getattr(requested, key), getattr(effective, key)
        if asked is None or seen is None:
            continue
        if asked != seen:
            return False
        confirmed = True
    return True if confirmed else None


# cudagraph modes that capture no CUDA graph at all: the engine runs eagerly, so
# nothing a graph mode could get wrong (docs/design.md, "Serving restart").
_NO_CUDA_GRAPHS = frozenset({"NONE"})


def effective_safe(requested: EffectiveConfig, effective: EffectiveConfig) -> bool | None:
    """Whether the running config is as safe as the profile asked, though perhaps
    not the same (:func:`effective_matches` says that). False if the log shows an
    asked-for value replaced by one not known to be as safe (FULL_AND_PIECEWISE
    for FULL_DECODE_ONLY, adaptive verification on when asked off); True if it
    shows at least one asked-for value and each is as asked, or a cudagraph_mode
    that captures no graphs (vLLM's CPU build shows NONE whatever is asked);
    None if it shows none of them."""
    confirmed = False
    asked_mode, seen_mode = requested.cudagraph_mode, effective.cudagraph_mode
    if asked_mode is not None and seen_mode is not None:
        if seen_mode != asked_mode and seen_mode not in _NO_CUDA_GRAPHS:
            return False
        confirmed = True
    asked, seen = requested.enable_adaptive_verification, effective.enable_adaptive_verification
    if asked is not None and seen is not None:
        if seen != asked:
            return False
        confirmed = True
    return True if confirmed else None
