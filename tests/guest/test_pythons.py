"""The unit suite on another Python: Debian 13's python3 (3.13), in a copy of
the trixie image (docs/install.md, "Tried on"). Not booted: systemd-nspawn
runs one script in it, sharing this machine's network so that its pip
reaches the package index (trusting this machine's CA bundle)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
# The project's runtime dependencies and the test runner; the OpenAPI tests
# (schemathesis) are integration tests and not part of the unit suite. The
# simulation runs 50 random seeds here, not 500: this run is about the
# interpreter, and the host's suite covers the seeds (tests/simulation).
SCRIPT = """set -eu
python3 --version
export SPARK_WATCHDOG_SIM_SEEDS=50
python3 -m venv /venv
export PIP_CERT=/etc/ssl/certs/host-ca.crt PIP_DISABLE_PIP_VERSION_CHECK=1
/venv/bin/pip install -q /src pytest hypothesis
cd /src
/venv/bin/python -m pytest -q -p no:cacheprovider --color=no -m "not integration" \\
    --ignore tests/api/test_openapi.py --ignore tests/guest
"""


def test_the_unit_suite_passes_on_debian_13s_python_3_13(trixie_root: Path) -> None:
    (trixie_root / "run-unit-tests.sh").write_text(SCRIPT)
    done = subprocess.run(
        [
            "systemd-nspawn",
            "--quiet",
            "-D",
            str(trixie_root),
            "--register=no",
            "--keep-unit",
            "--as-pid2",  # a stub init reaps and forwards signals; the script is not PID 1
            f"--bind-ro={CA_BUNDLE}:/etc/ssl/certs/host-ca.crt",
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
    assert done.returncode == 0, output[-6000:]
    summary = re.search(r"^\d+ passed.*$", done.stdout, re.MULTILINE)
    assert summary is not None and "failed" not in summary.group(0), output[-3000:]
