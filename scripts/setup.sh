#!/usr/bin/env bash
# Idempotent set-up on a fresh Debian or Ubuntu machine: the system packages
# the project and its tests need, a virtual environment in .venv, and the
# project installed into it (editable). Safe to run again; it only does what
# is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
    python3 python3-venv python3-dev gcc pkg-config  # venv, and building systemd-python
    libsystemd-dev                                   # systemd-python's C library
    systemd                                          # systemd-analyze for the unit checks
    systemd-journal-remote                           # writes real journal files in tests and the lab
    ipmitool openipmi                                # IPMI power path, and ipmi_sim in tests
    openssh-client openssh-server                    # SSH paths, and a real sshd in tests
    prometheus prometheus-alertmanager               # promtool and amtool checks, a real Alertmanager in tests
    groff-base                                       # renders the man page in its test
    debootstrap systemd-container                    # the systemd guest tier (tests/guest)
    postgresql                                       # the history in PostgreSQL, a real server in tests
    faketime                                         # a controller of a pair with its clock ahead, in tests
    docker.io                                        # serving.runtime docker: a dockerd of the tests' own
    nut-server nut-client                            # NUT power paths: a real upsd and dummy-ups in tests
    chromium chromium-driver                         # the operator's page in a real browser (tests/web)
)

missing=()
for package in "${APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$package")
    fi
done
if ((${#missing[@]})); then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
    echo "setup: installing system packages: ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
    # The tests start their own Prometheus tools, PostgreSQL, dockerd and upsd; the
    # packages' services (:9090, :9093, :5432, the system's Docker, NUT's :3493) are not
    # wanted on a development machine that did not have them.
    if [ -d /run/systemd/system ]; then
        for service in prometheus prometheus-alertmanager postgresql; do
            if [[ " ${missing[*]} " == *" $service "* ]]; then
                $sudo systemctl disable --now "$service" >/dev/null 2>&1 || true
            fi
        done
        if [[ " ${missing[*]} " == *" nut-server "* ]]; then
            $sudo systemctl disable --now nut-server nut-monitor nut-driver.target \
                >/dev/null 2>&1 || true
        fi
        if [[ " ${missing[*]} " == *" docker.io "* ]]; then
            $sudo systemctl disable --now docker.socket docker containerd >/dev/null 2>&1 || true
        fi
    fi
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $($python --version)" >&2
    "$python" -m venv .venv
fi

# Reinstall only when the project's metadata changed.
stamp=.venv/.spark-watchdog-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "setup: installing spark-watchdog and its dependencies into .venv" >&2
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[journal,dev,postgres,docker,kasa]'
    echo "$want" >"$stamp"
fi
