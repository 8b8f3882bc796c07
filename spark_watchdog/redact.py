"""Secrets in a launch argv, and what is shown or stored in their place. Pure.

The agent launches ``serving.command`` with its real argv. Wherever that argv
is shown or kept (``GET /v1/serving``, ``/v1/state``, the agent's log, the
header it writes into the serving log, the controller's history) the values
of secret flags read ``***`` instead:

- the flags of :data:`SECRET_FLAGS` and any listed in ``serving.secret_flags``,
  written ``--flag VALUE`` or ``--flag=VALUE`` (``_`` and ``-`` are the same to
  vLLM's parser, so they are here too; case does not matter);
- environment assignments whose name says secret (``HF_TOKEN=...``,
  ``OPENAI_API_KEY=...``, as ``docker run -e`` takes them), alone or after
  ``--flag=`` (``--env=HF_TOKEN=...``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

REDACTED = "***"

# vLLM's own secret-valued flags (vllm/entrypoints/openai/cli_args.py: --api-key;
# vllm/engine/arg_utils.py: --hf-token), and the generic names of others.
SECRET_FLAGS: tuple[str, ...] = ("--api-key", "--hf-token", "--token", "--password")

# A variable whose name ends in one of these words (HF_TOKEN, OPENAI_API_KEY,
# AWS_SECRET_ACCESS_KEY, DB_PASSWORD); not one that merely contains one
# (max_num_batched_tokens=8192 is a setting, not a secret).
_SECRET_NAME = re.compile(
    r"(?:^|_)(?:TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIALS?)$",
    re.IGNORECASE,
)
_ASSIGNMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
# The keys of JSON records whose value is an argv (the agent's serving status).
_ARGV_KEYS = ("argv", "command")


def _normal(flag: str) -> str:
    return flag.strip().lower().replace("_", "-")


def _flag_set(extra_flags: Iterable[str]) -> frozenset[str]:
    return frozenset(_normal(f) for f in (*SECRET_FLAGS, *extra_flags))


def _assignment(text: str) -> str | None:
    """``NAME=***`` when ``text`` assigns a secret-named variable, else None."""
    match = _ASSIGNMENT.match(text)
    if match is not None and _SECRET_NAME.search(match.group(1)):
        return f"{match.group(1)}={REDACTED}"
    return None


def redact_argv(argv: Sequence[str], extra_flags: Iterable[str] = ()) -> list[str]:
    """``argv`` with every secret value replaced by ``***``; the input is not changed."""
    extra = tuple(extra_flags)
    flags = _flag_set(extra)
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            hide_next = False
            if not arg.startswith("--"):  # `--hf-token --api-key X`: a bare flag
                out.append(REDACTED)
                continue
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            if _normal(name) in flags:
                if eq:
                    out.append(f"{name}={REDACTED}")
                else:
                    out.append(arg)
                    hide_next = True
                continue
            hidden = _assignment(value) if eq else None
            out.append(arg if hidden is None else f"{name}={hidden}")
            continue
        hidden = _assignment(arg)
        # Anything else may quote a command line (`bash -c "vllm serve --api-key X"`).
        out.append(redact_text(arg, extra) if hidden is None else hidden)
    return out


@functools.lru_cache(maxsize=32)
def _flag_pattern(flags: frozenset[str]) -> re.Pattern[str]:
    names = sorted(flags, key=len, reverse=True)
    flag = "|".join(re.escape(n).replace(r"\-", "[-_]") for n in names)
    return re.compile(
        rf"(?<![\w-])(?P<flag>{flag})(?:"
        rf"(?P<json>['\"]\s*,\s*)(?P<q>['\"])(?:\\.|(?!(?P=q)).)*"  # "--api-key", "X"
        rf"|(?P<sep>=|\s+)(?:'[^']*'|\"[^\"]*\"|[^\s'\",\]]+))",  # --api-key X, --api-key=X
        re.IGNORECASE,
    )


def redact_text(text: str, extra_flags: Iterable[str] = ()) -> str:
    """Free text (an error message, a quoted argv) with secret values hidden:
    ``--api-key X``, ``--api-key=X``, ``--api-key 'X Y'``, the JSON list form
    ``"--api-key", "X"``, and ``HF_TOKEN=X``."""
    pattern = _flag_pattern(_flag_set(extra_flags))

    def hide(match: re.Match[str]) -> str:
        if match.group("json") is not None:
            return f"{match.group('flag')}{match.group('json')}{match.group('q')}{REDACTED}"
        return f"{match.group('flag')}{match.group('sep')}{REDACTED}"

    return _redact_assignments(pattern.sub(hide, text))


_TEXT_ASSIGNMENT = re.compile(r"(?<![\w-])([A-Za-z_][A-Za-z0-9_]*)=([^\s'\",\]]+)")


def _redact_assignments(text: str) -> str:
    def hide(match: re.Match[str]) -> str:
        name, value = match.group(1), match.group(2)
        if _SECRET_NAME.search(name):
            return f"{name}={REDACTED}"
        return f"{name}={_redact_assignments(value)}"  # --env=HF_TOKEN=...

    return _TEXT_ASSIGNMENT.sub(hide, text)


def redact_record(value: Any, extra_flags: Iterable[str] = ()) -> Any:
    """A JSON value with its secrets hidden, at any depth: an argv (a list of
    text under ``argv`` or ``command``) as :func:`redact_argv` does, any other
    text as :func:`redact_text` does. The input is not changed."""
    flags = tuple(extra_flags)
    if isinstance(value, Mapping):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            is_argv = (
                key in _ARGV_KEYS
                and isinstance(item, (list, tuple))
                and all(isinstance(a, str) for a in item)
            )
            out[key] = redact_argv(item, flags) if is_argv else redact_record(item, flags)
        return out
    if isinstance(value, (list, tuple)):
        return [redact_record(item, flags) for item in value]
    if isinstance(value, str):
        return redact_text(value, flags)
    return value


# -- error messages ------------------------------------------------------------------
#
# An error message may quote a URL (a power device's, a peer's, the
# controller's) or a header. Before it is printed or logged, the credentials
# in it read ***: a URL's userinfo (``http://user:***@host``), the value of a
# query or path parameter named like a credential (``?access_token=***``,
# ``;token=***``, the names :func:`spark_watchdog.bearer.credential_named`
# knows), an auth scheme's credentials (``Bearer ***``), and any secret value
# the caller knows.

_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/?#@\s]*@")
_URL_PARAMETER = re.compile(r"([?&;#])([^=&;#\s/?]+)=([^&;#\s'\"<>]*)")
_SCHEME_CREDENTIALS = re.compile(r"(?i)\b(bearer|basic)(\s+|%20|\+)[^\s'\",;]+")
# A private exception class of a library, as ``str()`` of a wrapped error
# names it (``_RetryableError: ``): an internal, not something a person acts on.
_PRIVATE_EXCEPTION = re.compile(r"(?<![\w.])(?:[a-z_][\w]*\.)*_[A-Z]\w*(?:Error|Exception): ")


def redact_message(text: str, secrets: Iterable[str] = ()) -> str:
    """An error message with its credentials hidden (see above), and the
    secret values ``secrets`` (a token, a password) wherever they appear."""
    from spark_watchdog.bearer import credential_named

    def parameter(match: re.Match[str]) -> str:
        sep, name, value = match.groups()
        return f"{sep}{name}={REDACTED}" if credential_named(name) and value else match.group()

    shown = _URL_USERINFO.sub(rf"\1{REDACTED}@", text)
    shown = _URL_PARAMETER.sub(parameter, shown)
    shown = _SCHEME_CREDENTIALS.sub(rf"\1\2{REDACTED}", shown)
    for secret in sorted({s for s in secrets if len(s.strip()) >= 4}, key=len, reverse=True):
        shown = shown.replace(secret, REDACTED)
    return redact_text(shown)


def plain_error(text: str, secrets: Iterable[str] = ()) -> str:
    """An error message as a person reads it: redacted (:func:`redact_message`)
    and without the names of libraries' private exception classes."""
    return _PRIVATE_EXCEPTION.sub("", redact_message(text, secrets))
