"""Secret-file permissions: mode, owner, not empty, and never the content in a report."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spark_watchdog.config.secret_refs import check_secrets
from spark_watchdog.doctor.secret_files import SecretReference, check_secret_file
from spark_watchdog.errors import ConfigError

TOKEN = "s3cr3t-serving-token-value"


def _token(tmp_path: Path, mode: int, text: str = TOKEN + "\n") -> SecretReference:
    path = tmp_path / "serving-token"
    path.write_text(text)
    path.chmod(mode)
    return SecretReference("serving.token_file", str(path))


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_private_files_pass(tmp_path: Path, mode: int) -> None:
    found = check_secret_file(_token(tmp_path, mode))
    assert found.status == "ok", found
    assert f"mode {mode:04o}" in found.detail


@pytest.mark.parametrize(
    ("mode", "who"), [(0o644, "group and others"), (0o640, "group"), (0o604, "others")]
)
def test_group_or_world_readable_fails_without_showing_the_token(
    tmp_path: Path, mode: int, who: str
) -> None:
    found = check_secret_file(_token(tmp_path, mode))
    assert found.status == "fail"
    assert f"mode {mode:04o}: {who} can use it" in found.detail
    assert found.fix is not None and "chmod 600" in found.fix
    assert TOKEN not in found.detail and TOKEN not in found.fix


def test_a_missing_file_fails(tmp_path: Path) -> None:
    found = check_secret_file(SecretReference("serving.token_file", str(tmp_path / "none")))
    assert found.status == "fail" and "does not exist" in found.detail


def test_an_empty_file_fails(tmp_path: Path) -> None:
    found = check_secret_file(_token(tmp_path, 0o600, text=""))
    assert found.status == "fail" and "empty" in found.detail


def test_an_owner_that_is_neither_root_nor_the_service_fails(tmp_path: Path) -> None:
    reference = _token(tmp_path, 0o600)
    found = check_secret_file(reference, owners={os.geteuid() + 1})
    assert found.status == "fail" and "is owned by" in found.detail


@pytest.mark.parametrize("store", ["etc/spark-watchdog/credentials", "etc/credstore"])
def test_a_credential_name_is_found_where_the_unit_loads_it_from(
    tmp_path: Path, store: str
) -> None:
    folder = tmp_path / store
    folder.mkdir(parents=True)
    (folder / "serving-token").write_text(TOKEN)
    (folder / "serving-token").chmod(0o644)
    reference = SecretReference("serving.token_file", "serving-token")
    found = check_secret_file(reference, environ={}, root=tmp_path)
    assert found.status == "fail" and str(folder / "serving-token") in found.detail
    (folder / "serving-token").chmod(0o600)
    assert check_secret_file(reference, environ={}, root=tmp_path).status == "ok"


def test_a_credential_name_under_credentials_directory_is_checked_there(tmp_path: Path) -> None:
    (tmp_path / "serving-token").write_text(TOKEN)
    (tmp_path / "serving-token").chmod(0o600)
    reference = SecretReference("serving.token_file", "serving-token")
    environ = {"CREDENTIALS_DIRECTORY": str(tmp_path)}
    found = check_secret_file(reference, environ=environ, root=tmp_path / "elsewhere")
    assert found.status == "ok" and str(tmp_path / "serving-token") in found.detail


def test_an_unresolvable_credential_name_is_skipped(tmp_path: Path) -> None:
    reference = SecretReference("serving.token_file", "serving-token")
    found = check_secret_file(reference, environ={}, root=tmp_path)
    assert found.status == "skip" and "LoadCredential=" in found.detail


def test_a_whitespace_only_file_fails_as_at_start(tmp_path: Path) -> None:
    found = check_secret_file(_token(tmp_path, 0o600, text=" \n"))
    assert found.status == "fail"
    assert found.detail == (
        f"serving.token_file: secret file {tmp_path / 'serving-token'} holds only whitespace"
    )


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_doctor_and_the_load_time_check_say_the_same(tmp_path: Path, mode: int) -> None:
    """A file group or others may use is a failure in doctor, in --check and at start,
    with one message."""
    reference = _token(tmp_path, mode)
    found = check_secret_file(reference)
    with pytest.raises(ConfigError) as caught:
        check_secrets("agent.yaml", [reference], {}, credentials_required=True)
    assert found.status == "fail"
    assert caught.value.problems == [f"{found.detail}; {found.fix}"]
    assert "chmod 600" in caught.value.problems[0]


def test_a_fifo_fails_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "serving-token"
    os.mkfifo(fifo, 0o600)
    found = check_secret_file(SecretReference("serving.token_file", str(fifo)))
    assert found.status == "fail"
    assert found.detail == (
        f"serving.token_file: secret file {fifo} is a FIFO (named pipe), not a regular file"
    )
