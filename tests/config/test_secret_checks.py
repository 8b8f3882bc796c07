"""Every secret file a config names is checked at load: by ``agent --check``,
``controller --check`` (the unit's ExecStartPre) and before either daemon starts.
A missing PDU community is a config error (exit 2), not seven incidents with
tracebacks when a host freezes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from spark_watchdog.cli.main import main
from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.config.secret_refs import check_secrets, controller_secrets
from spark_watchdog.errors import ConfigError
from spark_watchdog.lab.ports import free_port as _free_port

SECRET = "pdu-write-community"


def _controller(tmp_path: Path, community: str, **device: Any) -> Path:
    config = {
        "nodes": [
            {
                "name": "spark-1",
                "agent": f"http://127.0.0.1:{_free_port()}",
                "power": [
                    {"type": "snmp", "host": "127.0.0.1", "outlet": 1, "community_file": community},
                    *([device] if device else []),
                ],
            }
        ],
        "listen": {"address": "127.0.0.1", "port": _free_port()},
        "history": str(tmp_path / "history.db"),
    }
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _secret(tmp_path: Path, text: str = SECRET + "\n", mode: int = 0o600) -> Path:
    path = tmp_path / "pdu-community"
    path.write_text(text)
    path.chmod(mode)
    return path


def _spark_watchdog(
    *args: str, environ: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CREDENTIALS_DIRECTORY"}
    return subprocess.run(
        [sys.executable, "-m", "spark_watchdog", *args],
        capture_output=True,
        text=True,
        timeout=60,  # a daemon that starts instead of refusing fails here
        env={**env, **(environ or {})},
    )


def _problems(config: Path, environ: dict[str, str] | None = None) -> list[str]:
    parsed = parse_controller_config(yaml.safe_load(config.read_text()))
    with pytest.raises(ConfigError) as caught:
        check_secrets(
            str(config), controller_secrets(parsed), environ or {}, credentials_required=True
        )
    return caught.value.problems


@pytest.mark.integration
def test_controller_check_fails_on_a_missing_power_secret(tmp_path: Path) -> None:
    missing = tmp_path / "pdu-community"
    config = _controller(tmp_path, str(missing))
    done = _spark_watchdog("controller", "--config", str(config), "--check")
    assert done.returncode == 2
    assert done.stderr == (
        f"spark-watchdog controller: {config}: 1 problem(s):\n"
        f"  nodes[0].power[0].community_file: secret file {missing} does not exist; "
        f"create it (`install -m 600 /dev/null {missing}`, then write the secret into it), "
        "or correct nodes[0].power[0].community_file\n"
    )


@pytest.mark.integration
def test_the_controller_does_not_start_on_a_secret_others_can_read(tmp_path: Path) -> None:
    community = _secret(tmp_path, mode=0o644)
    done = _spark_watchdog("controller", "--config", str(_controller(tmp_path, str(community))))
    assert done.returncode == 2
    assert (
        f"  nodes[0].power[0].community_file: secret file {community} has mode 0644: "
        f"group and others can use it; `chmod 600 {community}`\n"
    ) in done.stderr
    assert SECRET not in done.stdout + done.stderr


@pytest.mark.integration
def test_agent_check_fails_on_a_whitespace_only_token(tmp_path: Path) -> None:
    token = tmp_path / "serving-token"
    token.write_text("  \n")
    token.chmod(0o600)
    config = tmp_path / "agent.yaml"
    config.write_text(yaml.safe_dump({"node": "spark-1", "serving": {"token_file": str(token)}}))
    done = _spark_watchdog("agent", "--config", str(config), "--check")
    assert done.returncode == 2
    assert done.stderr == (
        f"spark-watchdog agent: {config}: 1 problem(s):\n"
        f"  serving.token_file: secret file {token} holds only whitespace; "
        f"write the secret into {token}\n"
    )


@pytest.mark.parametrize(
    ("text", "mode", "problem"),
    [
        ("", 0o600, "is empty; write the secret into {path}"),
        ("\n", 0o600, "is empty; write the secret into {path}"),
        (" \t \n", 0o600, "holds only whitespace; write the secret into {path}"),
        (SECRET, 0o640, "has mode 0640: group can use it; `chmod 600 {path}`"),
        (SECRET, 0o604, "has mode 0604: others can use it; `chmod 600 {path}`"),
        (SECRET, 0o620, "has mode 0620: group can use it; `chmod 600 {path}`"),
        (
            "x" * (64 * 1024 + 1),
            0o600,
            "is 65537 bytes, more than the limit of 64 KiB; point "
            "nodes[0].power[0].community_file at a regular file that holds only the secret",
        ),
    ],
)
def test_bad_secret_files(tmp_path: Path, text: str, mode: int, problem: str) -> None:
    path = _secret(tmp_path, text, mode)
    assert _problems(_controller(tmp_path, str(path))) == [
        f"nodes[0].power[0].community_file: secret file {path} " + problem.format(path=path)
    ]


def test_secrets_that_are_not_regular_files(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    assert _problems(_controller(tmp_path, str(fifo))) == [
        f"nodes[0].power[0].community_file: secret file {fifo} is a FIFO (named pipe), not a "
        "regular file; point nodes[0].power[0].community_file at a regular file that holds "
        "only the secret"
    ]
    assert _problems(_controller(tmp_path, "/dev/zero")) == [
        "nodes[0].power[0].community_file: secret file /dev/zero is a character device, not a "
        "regular file; point nodes[0].power[0].community_file at a regular file that holds "
        "only the secret"
    ]


def test_binary_secret_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "pdu-community"
    path.write_bytes(b"\xff\xfe\x00")
    path.chmod(0o600)
    assert _problems(_controller(tmp_path, str(path))) == [
        f"nodes[0].power[0].community_file: secret file {path} is not UTF-8 text; "
        f"write the secret into {path} as text"
    ]


def test_every_device_secret_and_the_ssh_key_is_checked(tmp_path: Path) -> None:
    community = _secret(tmp_path)
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    key.chmod(0o644)
    ssh = {
        "type": "ssh",
        "host": "127.0.0.1",
        "user": "watchdog",
        "key_file": str(key),
        "known_hosts_file": str(tmp_path / "known_hosts"),
    }
    assert _problems(_controller(tmp_path, str(community), **ssh)) == [
        f"nodes[0].power[1].key_file: secret file {key} has mode 0644: group and others "
        f"can use it; `chmod 600 {key}`"
    ]


def test_a_good_config_passes_check_and_names_nothing_unchecked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    config = _controller(tmp_path, str(_secret(tmp_path)))
    assert main(["controller", "--config", str(config), "--check"]) == 0
    assert capsys.readouterr().out == f"{config}: ok (1 nodes: spark-1)\n"


def test_credential_names_without_credentials_directory_are_listed_by_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a shell, --check cannot see the unit's credentials: it says so, and passes;
    the unit's ExecStartPre (where systemd sets $CREDENTIALS_DIRECTORY) checks them."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    config = _controller(tmp_path, "pdu-community")
    assert main(["controller", "--config", str(config), "--check"]) == 0
    assert capsys.readouterr().out == (
        f"{config}: ok (1 nodes: spark-1)\n"
        '  not checked: nodes[0].power[0].community_file ("pdu-community"): systemd '
        "credential name(s), and $CREDENTIALS_DIRECTORY is not set here; the unit sets it "
        "(LoadCredential=), and its start checks them\n"
    )


@pytest.mark.integration
def test_credential_names_without_credentials_directory_stop_the_start(tmp_path: Path) -> None:
    config = _controller(tmp_path, "pdu-community")
    done = _spark_watchdog("controller", "--config", str(config))
    assert done.returncode == 2
    assert done.stderr == (
        f"spark-watchdog controller: {config}: 1 problem(s):\n"
        '  nodes[0].power[0].community_file: "pdu-community" is neither an absolute path nor '
        "resolvable: $CREDENTIALS_DIRECTORY is not set (use an absolute path, or "
        "LoadCredential= in the unit)\n"
    )


def test_credential_names_are_checked_in_credentials_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    config = _controller(tmp_path, "pdu-community")
    assert main(["controller", "--config", str(config), "--check"]) == 2
    missing = credentials / "pdu-community"
    assert capsys.readouterr().err == (
        f"spark-watchdog controller: {config}: 1 problem(s):\n"
        f"  nodes[0].power[0].community_file: secret file {missing} does not exist; load it "
        "into the unit (LoadCredential=pdu-community:/etc/spark-watchdog/credentials/"
        "pdu-community; deploy/install.sh writes one per file in that directory), or correct "
        "nodes[0].power[0].community_file\n"
    )
    missing.write_text(SECRET)
    missing.chmod(0o400)  # how systemd hands credentials over
    assert main(["controller", "--config", str(config), "--check"]) == 0
    assert capsys.readouterr().out == f"{config}: ok (1 nodes: spark-1)\n"


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    loose = _secret(tmp_path, mode=0o644)
    config = _controller(
        tmp_path,
        str(loose),
        type="ipmi",
        host="10.0.0.9",
        user="admin",
        password_file=str(tmp_path / "bmc"),
    )
    problems = _problems(config)
    assert [p.split(": secret file")[0] for p in problems] == [
        "nodes[0].power[0].community_file",
        "nodes[0].power[1].password_file",
    ]


_NUT = {"type": "nut", "host": "127.0.0.1", "ups": "rack", "outlet": 1, "user": "watchdog"}
_HA = {"type": "home_assistant", "url": "http://ha:8123", "entity_id": "switch.spark_1"}
_REDFISH = {"type": "redfish", "url": "https://bmc-1", "user": "admin"}


@pytest.mark.parametrize(
    ("device", "key", "value", "why"),
    [
        (_NUT, "password_file", "pass\nword", "U+000A at character 5: upsd's protocol"),
        (_NUT, "password_file", "pa€ss", "U+20AC at character 3: upsd's protocol"),
        (_HA, "token_file", "eyJhbGciOi…", "U+2026 at character 11: a token sent in an HTTP"),
        (_REDFISH, "password_file", "pa€ss", "U+20AC at character 3: a password sent by HTTP"),
    ],
)  # fmt: skip
def test_a_secret_its_protocol_cannot_carry_is_refused_naming_the_key_never_the_value(
    tmp_path: Path, device: dict[str, Any], key: str, value: str, why: str
) -> None:
    secret = tmp_path / "device-secret"
    secret.write_text(value + "\n")
    secret.chmod(0o600)
    config = _controller(tmp_path, str(_secret(tmp_path)), **device, **{key: str(secret)})
    problems = _problems(config)
    assert problems == [
        f"nodes[0].power[1].{key}: secret file {secret} holds {why}" + problems[0].split(why, 1)[1]
    ]
    assert "without that character" in problems[0]
    assert value.strip("…\n€") not in problems[0]


def test_a_secret_refused_at_load_is_refused_at_use_too(tmp_path: Path) -> None:
    """A file changed after the start: the power path's read says so, no traceback."""
    from spark_watchdog.power.paths import power_paths, read_device_secrets

    secret = _secret(tmp_path, "pa€ss\n")
    parsed = parse_controller_config(
        {"nodes": [{"name": "spark-1", "agent": "http://127.0.0.1:9720",
                    "power": [{**_NUT, "password_file": str(secret)}]}]}
    )  # fmt: skip
    path = power_paths(parsed, parsed.nodes[0])[0]
    with pytest.raises(ConfigError, match=r"password_file: secret file .* holds U\+20AC"):
        read_device_secrets(path, {})
