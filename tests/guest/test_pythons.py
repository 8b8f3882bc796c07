"""The unit suite on another Python: Debian 13's python3 (3.13), in the trixie
image (docs/install.md, "Tried on"). Not booted: systemd-nspawn runs one
script in it, with no network at all: the image carries a venv with the
project's dependencies and the test runner (scripts/guest_image.py), and the
checkout installs from /src without an index."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

# The simulation runs 20 random seeds here, not 500: this run is about the
# interpreter, and the host's suite covers the seeds (tests/simulation). The
# OpenAPI tests (schemathesis) and the Docker tier (the docker extra) are
# integration tests and not part of the unit suite.
SCRIPT = """set -eu
python3 --version
export SPARK_WATCHDOG_SIM_SEEDS=20 PIP_DISABLE_PIP_VERSION_CHECK=1
venv={venv}
$venv/bin/pip install -q --no-index --no-deps --no-build-isolation /src
cd /src
$venv/bin/python -m pytest -q -p no:cacheprovider --color=no -m "not integration" \\
    --ignore tests/api/test_openapi.py --ignore tests/guest --ignore tests/docker
"""


def test_the_unit_suite_passes_on_debian_13s_python_3_13(
    trixie_root: Path, unit_test_venv: str
) -> None:
    (trixie_root / "run-unit-tests.sh").write_text(SCRIPT.format(venv=unit_test_venv))
    done = subprocess.run(
        [
            # The suite waits on nothing but itself: the tests beside it that
            # wait on real clocks come first.
            "nice",
            "-n",
            "5",  # as the simulation's seeds (tests/simulation)
            "systemd-nspawn",
            "--quiet",
            "-D",
            str(trixie_root),
            "--register=no",
            "--keep-unit",
            "--private-network",  # offline: everything it needs is in the image
            "--as-pid2",  # a stub init reaps and forwards signals; the script is not PID 1
            "/bin/sh",
            "/run-unit-tests.sh",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    output = done.stdout + done.stderr
    print(output[-3000:])
    assert "Python 3.13" in output
    assert done.returncode == 0, _failures(output) + output[-3000:]
    summary = re.search(r"^\d+ passed.*$", done.stdout, re.MULTILINE)
    assert summary is not None and "failed" not in summary.group(0), output[-3000:]


def _failures(output: str) -> str:
    """pytest's FAILURES section, where the reason is (the tail is its summary)."""
    section = r"^=+ (FAILURES|ERRORS) =+$.*?(?=^=+ short test summary)"
    found = re.search(section, output, re.MULTILINE | re.DOTALL)
    return "" if found is None else found.group(0)[:12000] + "\n[…]\n"
