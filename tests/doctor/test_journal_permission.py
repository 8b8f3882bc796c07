"""A journal directory the agent may not list is "permission denied", not "no journal
files" (which sends the operator to journald instead of to the directory's mode)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

CHECK = """
import json, sys
from spark_watchdog.config.agent import JournalProbeConfig
from spark_watchdog.doctor.journal_checks import check_previous_boot
found = check_previous_boot(JournalProbeConfig(directory=sys.argv[1]))
print(json.dumps({"status": found.status, "detail": found.detail, "fix": found.fix}))
"""


def _as_an_unprivileged_reader(directory: Path) -> dict[str, str]:
    """Run the doctor check where file modes apply: root keeps its uid but loses the
    capabilities that bypass them (setpriv, util-linux)."""
    argv = [sys.executable, "-c", CHECK, str(directory)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: mode 000 cannot be seen")
        argv = [setpriv, "--bounding-set=-dac_override,-dac_read_search", *argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    result: dict[str, str] = json.loads(done.stdout)
    return result


@pytest.mark.integration
def test_a_mode_000_journal_directory_is_permission_denied(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    journal.mkdir()
    (journal / "system.journal").write_bytes(b"LPKSHHRH")
    journal.chmod(0)
    try:
        found = _as_an_unprivileged_reader(journal)
    finally:
        journal.chmod(0o755)
    assert found["status"] == "fail"
    assert found["detail"] == f"cannot read {journal}: permission denied: cannot list {journal}"
    assert "`chmod 2755 DIR`" in found["fix"]
