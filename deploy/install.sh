#!/usr/bin/env bash
# Install, upgrade or remove spark-watchdog on a DGX Spark node or on the
# controller's management host (Debian, Ubuntu, DGX OS; aarch64 or x86_64).
#
#   deploy/install.sh node [--serving] [options]   the agent (spark-watchdog-agent.service)
#   deploy/install.sh controller [options]         the controller (spark-watchdog-controller.service)
#   deploy/install.sh colocated [--serving] [options]
#                  both on a Spark, the controller beside the agent (no other
#                  machine; controller.yaml has colocated:, the same file on
#                  every Spark): both units, the controller's own state
#                  directory (colocated.conf); see docs/install.md
#   deploy/install.sh uninstall [--purge] [options]
#
# Options:
#   --from SRC     a wheel (spark_watchdog-*.whl) or a source checkout (default: this checkout)
#   --prefix DIR   where the program lives (default /opt/spark-watchdog)
#   --root DIR     install into DIR instead of / (packaging, tests): no systemctl, no apt
#   --serving      node, colocated: the agent also launches the vLLM rank (installs
#                  the serving drop-in; see docs/install.md)
#   --serving-docker  node, colocated: the agent launches or adopts the rank as a Docker
#                  container (serving.runtime: docker; installs the docker drop-in:
#                  the docker socket's group; see docs/serving.md)
#   --no-start     install and enable, but do not start or restart the service
#                  (colocated starts nothing while a config is a fresh example)
#   --purge        uninstall only: also remove /etc/spark-watchdog, /var/lib/spark-watchdog
#                  and /var/lib/spark-watchdog-controller
#
# Layout: each install is a virtual environment of its own under
# PREFIX/releases/<timestamp>, created with the system's site packages (so the
# distro's python3-systemd serves the journal probe); PREFIX/bin points at the
# current one. An upgrade installs a new release next to the running one and
# flips the link in one rename, then restarts the service; the previous
# release stays for a rollback (ln -sfn). Config (/etc/spark-watchdog) and the
# freeze history (/var/lib/spark-watchdog, or /var/lib/spark-watchdog-controller
# for a controller on a Spark) are never overwritten.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
role=""
src="$here"
prefix=/opt/spark-watchdog
root=""
serving=0
start=1
purge=0
keep_releases=2

die() {
    echo "install.sh: $*" >&2
    exit 2
}
say() { echo "install.sh: $*" >&2; }

while (($#)); do
    case "$1" in
        node | controller | colocated | uninstall) role=$1 ;;
        --from) src=${2:?--from needs a wheel or a source directory}; shift ;;
        --prefix) prefix=${2:?--prefix needs a directory}; shift ;;
        --root) root=${2:?--root needs a directory}; shift ;;
        --serving) [ "$serving" = docker ] && die "--serving and --serving-docker exclude each other"; serving=1 ;;
        --serving-docker) [ "$serving" = 1 ] && die "--serving and --serving-docker exclude each other"; serving=docker ;;
        --no-start) start=0 ;;
        --purge) purge=1 ;;
        -h | --help) sed -n '2,/^set -euo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (expected node, controller, colocated or uninstall, then options; see --help)" ;;
    esac
    shift
done
[ -n "$role" ] || die "say what to install: node, controller, colocated or uninstall (see --help)"
case "$prefix" in /*) ;; *) die "--prefix must be an absolute path, got '$prefix'" ;; esac
case "$role" in node | colocated) ;; *)
    if [ "$serving" = 1 ]; then die "--serving applies to 'node' and 'colocated' only"; fi
    if [ "$serving" = docker ]; then die "--serving-docker applies to 'node' and 'colocated' only"; fi
    ;;
esac
if [ -n "$root" ]; then
    mkdir -p "$root"
    root=$(cd "$root" && pwd)
elif [ "$(id -u)" -ne 0 ]; then
    die "run as root (it writes $prefix, /etc/systemd/system and /etc/spark-watchdog)"
fi

units_dir="$root/etc/systemd/system"
etc_dir="$root/etc/spark-watchdog"
credentials_dir="$etc_dir/credentials"
live_systemd=0
if [ -z "$root" ] && [ -d /run/systemd/system ]; then live_systemd=1; fi
systemctl_() { if [ "$live_systemd" = 1 ]; then systemctl "$@"; fi; }

unit_for() { echo "spark-watchdog-$1.service"; }

# The roles' units: the agent, the controller, or both on one Spark.
case "$role" in
    node) whiches=(agent) ;;
    controller) whiches=(controller) ;;
    *) whiches=(agent controller) ;;
esac
with_controller=0
case "$role" in controller | colocated) with_controller=1 ;; esac

# A top-level colocated: key with a value (controllers on the Sparks), read
# from its lines: the program that reads YAML is not installed yet when this
# is asked. "colocated:" then indented lines, or a value on the line itself
# other than null, ~ or {}.
has_colocated() {
    awk '
        found { if ($0 ~ /^[[:space:]]*(#.*)?$/) next; ok = ($0 ~ /^[[:space:]]/); exit }
        /^"?colocated"?[[:space:]]*:/ {
            rest = $0; sub(/^[^:]*:[[:space:]]*/, "", rest); sub(/[[:space:]]*#.*$/, "", rest)
            if (rest == "") { found = 1; next }
            ok = (rest !~ /^(null|Null|NULL|~|\{[[:space:]]*\})$/); exit
        }
        END { exit !ok }
    ' "$1" 2>/dev/null
}

# -- uninstall -------------------------------------------------------------------
if [ "$role" = uninstall ]; then
    for which in agent controller; do
        unit=$(unit_for "$which")
        if [ -e "$units_dir/$unit" ]; then
            systemctl_ disable --now "$unit" || true
            rm -f "$units_dir/$unit"
            rm -rf "$units_dir/$unit.d"
            say "removed $unit"
        fi
    done
    systemctl_ daemon-reload
    rm -rf "$root$prefix"
    rm -f "$root/usr/local/bin/spark-watchdog" \
        "$root/usr/share/bash-completion/completions/spark-watchdog" \
        "$root/usr/local/share/man/man1/spark-watchdog.1"
    say "removed $prefix, the command link, its completion and man page"
    if [ "$purge" = 1 ]; then
        # A controller on a Spark keeps its history in a directory of its own
        # (the colocated drop-in): spark-watchdog-controller.
        for state in spark-watchdog spark-watchdog-controller; do
            rm -rf "$root/var/lib/$state" "$root/var/lib/private/$state"
        done
        rm -rf "$etc_dir"
        say "purged /etc/spark-watchdog and the state in /var/lib/spark-watchdog{,-controller} (the freeze history)"
    else
        say "kept /etc/spark-watchdog and /var/lib/spark-watchdog{,-controller} (the freeze history); --purge removes them"
    fi
    exit 0
fi

# -- a controller on a Spark needs its place in the order ------------------------
# Without colocated: a controller takes itself for the only one and acts for
# every node, the Spark it runs on among them. Asked before anything changes.
controller_yaml="$etc_dir/controller.yaml"
if [ "$role" = colocated ] && [ -e "$controller_yaml" ] && ! has_colocated "$controller_yaml"; then
    die "/etc/spark-watchdog/controller.yaml has no colocated: block, so the controller on" \
        "this Spark would act alone, for every node, this one included; nothing was changed." \
        "Fix: add colocated: (the order of the controllers on the Sparks: the commented block" \
        "at the end of controller.example.yaml; docs/install.md, \"Two Sparks and a smart plug," \
        "no other machine\", step 4) to it, the same file on every Spark, then run this again;" \
        "or, for a controller on a management host, run 'deploy/install.sh controller' there"
fi

# -- prerequisites ---------------------------------------------------------------
python=${PYTHON:-python3}
command -v "$python" >/dev/null || die "$python not found: apt-get install python3 python3-venv"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 10))' ||
    die "$("$python" --version 2>&1) is too old: spark-watchdog needs Python 3.10 or newer"
"$python" -c 'import venv, ensurepip' 2>/dev/null ||
    die "the venv module is missing: apt-get install python3-venv"
if [ "$role" != controller ] && ! "$python" -c 'import systemd.journal' 2>/dev/null; then
    say "warning: python3-systemd is not installed; the journal probe (boot boundaries) will" \
        "report unavailable. Fix: apt-get install python3-systemd, then run this again."
fi
case "$src" in
    *.whl) [ -f "$src" ] || die "--from $src: no such wheel" ;;
    *) [ -f "$src/pyproject.toml" ] || die "--from $src: not a wheel and not a source checkout (no pyproject.toml)" ;;
esac

# -- the program: a new release, then one rename --------------------------------
releases="$root$prefix/releases"
release="$releases/$(date -u +%Y%m%dT%H%M%SZ)-$$"
mkdir -p "$releases"
say "creating $release"
"$python" -m venv --system-site-packages "$release"
install_from=$src
if [ -d "$src" ]; then
    # A checkout's build/ may still hold modules removed since (setuptools reuses
    # it): build from a copy without it, so the release has the checkout's files.
    staging=$(mktemp -d)
    trap 'rm -rf "$staging"' EXIT
    # Caches are no part of the release, and a type checker or test run beside
    # the copy may be writing them ("file changed as we read it").
    tar -C "$src" --exclude=./build --exclude=./.venv --exclude=./.git \
        --exclude='*.egg-info' --exclude=.mypy_cache --exclude=.ruff_cache \
        --exclude=.pytest_cache --exclude=.hypothesis --exclude=__pycache__ \
        -cf - . | tar -C "$staging" -xf -
    install_from=$staging
fi
# The controller gets the power paths' optional libraries where they can be
# had: python-kasa for `type: kasa` (the extra installs it on Python 3.11 or
# newer). Offline, without it, a kasa path is refused by `controller --check`.
pip_install() { "$release/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; }
if [ "$with_controller" = 1 ] && pip_install "$install_from[kasa]" 2>/dev/null; then
    :
elif pip_install "$install_from"; then
    if [ "$with_controller" = 1 ]; then
        say "python-kasa could not be installed: a kasa power path will be refused by --check"
    fi
else
    rm -rf "$release"
    die "pip could not install $src (nothing changed; the current release still runs)"
fi
"$release/bin/spark-watchdog" --version >/dev/null ||
    { rm -rf "$release"; die "the new release does not run (nothing changed)"; }
if [ -e "$root$prefix/bin" ] && [ ! -L "$root$prefix/bin" ]; then
    rm -rf "$release"
    die "$prefix/bin is a directory, not this installer's link: move $prefix away (or uninstall) first"
fi
ln -sfn "$release/bin" "$root$prefix/bin.new"
mv -Tf "$root$prefix/bin.new" "$root$prefix/bin"
say "$("$root$prefix/bin/spark-watchdog" --version) is current ($prefix/bin)"
# Keep the newest releases, the current one among them.
mapfile -t old < <(ls -1d "$releases"/*/ 2>/dev/null | sort | head -n "-$keep_releases")
for dir in "${old[@]}"; do rm -rf "$dir"; done

# The command on PATH, its bash completion and its man page.
install -d "$root/usr/local/bin" "$root/usr/share/bash-completion/completions" \
    "$root/usr/local/share/man/man1"
ln -sfn "$prefix/bin/spark-watchdog" "$root/usr/local/bin/spark-watchdog"
"$root$prefix/bin/spark-watchdog" completion bash >"$root/usr/share/bash-completion/completions/spark-watchdog"
"$root$prefix/bin/spark-watchdog" man >"$root/usr/local/share/man/man1/spark-watchdog.1"

# -- units, config, credentials ----------------------------------------------
fresh=()           # the configs this run wrote from the examples
credentials_said=0 # the credentials are said once, for both units
install_unit() {
    local which=$1 unit dropins
    unit=$(unit_for "$which")
    mkdir -p "$units_dir"
    sed "s#/opt/spark-watchdog/bin/#$prefix/bin/#g" "$here/systemd/$unit" >"$units_dir/$unit"
    chmod 0644 "$units_dir/$unit"
    dropins="$units_dir/$unit.d"
    if [ "$which" = agent ]; then install_agent_dropins "$dropins"; fi
    if [ "$which" = controller ] && [ "$role" = colocated ]; then
        mkdir -p "$dropins"
        install -m 0644 "$here/systemd/$unit.d/colocated.conf" "$dropins/colocated.conf"
        say "installed the colocated drop-in: the controller's state is /var/lib/spark-watchdog-controller"
    fi
    install_config "$which"
    write_credentials "$dropins"
}

install_agent_dropins() {
    local dropins=$1
    if [ "$serving" = 1 ]; then
        mkdir -p "$dropins"
        rm -f "$dropins/docker.conf" # one or the other: the rank is the agent's child or dockerd's
        install -m 0644 "$here/systemd/spark-watchdog-agent.service.d/serving.conf" "$dropins/serving.conf"
        say "installed the serving drop-in: edit User= in $dropins/serving.conf to the user that serves"
    elif [ "$serving" = docker ]; then
        mkdir -p "$dropins"
        rm -f "$dropins/serving.conf"
        install -m 0644 "$here/systemd/spark-watchdog-agent.service.d/docker.conf" "$dropins/docker.conf"
        say "installed the docker drop-in: the agent joins the docker group (as good as root on this host)"
    fi
}

install_config() {
    local which=$1
    install -d -m 0755 "$etc_dir"
    install -d -m 0700 "$credentials_dir"
    install -m 0644 "$here/config/$which.example.yaml" "$etc_dir/$which.example.yaml"
    if [ ! -e "$etc_dir/$which.yaml" ]; then
        install -m 0644 "$here/config/$which.example.yaml" "$etc_dir/$which.yaml"
        fresh+=("$which.yaml")
        say "wrote /etc/spark-watchdog/$which.yaml from the example: edit it"
    else
        say "kept /etc/spark-watchdog/$which.yaml (the new example is $which.example.yaml)"
    fi
}

# One LoadCredential= per file in the credentials directory: the config names
# each secret by its file name (community_file: pdu-community).
write_credentials() {
    local dropins=$1 credentials_conf=$1/credentials.conf name secrets
    mapfile -t secrets < <(find "$credentials_dir" -maxdepth 1 -type f -printf '%f\n' | sort)
    if ((${#secrets[@]})); then
        mkdir -p "$dropins"
        {
            echo "# Written by deploy/install.sh from /etc/spark-watchdog/credentials/; run it again after adding one."
            echo "[Service]"
            for name in "${secrets[@]}"; do
                case "$name" in
                    *[!A-Za-z0-9._-]*) say "warning: skipped credential '$name' (allowed: letters, digits, . _ -)"; continue ;;
                esac
                echo "LoadCredential=$name:/etc/spark-watchdog/credentials/$name"
            done
        } >"$credentials_conf"
        chmod 0644 "$credentials_conf"
        say "credentials: ${secrets[*]} (LoadCredential= in $credentials_conf)"
    else
        rm -f "$credentials_conf"
        if [ "$credentials_said" = 0 ]; then
            say "no credentials yet: put each secret in /etc/spark-watchdog/credentials/NAME (mode 0600) and run this again"
        fi
    fi
    credentials_said=1
}

units=()
for which in "${whiches[@]}"; do
    install_unit "$which"
    units+=("$(unit_for "$which")")
done

# A controller on a Spark writes its history in a state directory of its own:
# the agent's, /var/lib/spark-watchdog, is read-only to it (colocated.conf).
if [ "$role" = colocated ] && has_colocated "$controller_yaml" &&
    grep -Eq "^history:[[:space:]]*[\"']?/var/lib/spark-watchdog/" "$controller_yaml"; then
    say "warning: controller.yaml keeps the history in /var/lib/spark-watchdog, the agent's state" \
        "directory, which the controller on a Spark cannot write. Fix: set" \
        "history: /var/lib/spark-watchdog-controller/history.db"
fi

systemctl_ daemon-reload
systemctl_ enable "${units[@]}" >/dev/null
if [ "$start" = 1 ] && [ "$role" = colocated ] && ((${#fresh[@]})); then
    # An example is no Spark's config, and the example controller's has no
    # colocated: it would act alone, for this Spark too.
    say "not started: ${fresh[*]} came from the examples; edit, then start (below)"
    start=0
fi
if [ "$start" = 1 ]; then
    systemctl_ restart "${units[@]}"
fi
if [ "$live_systemd" = 1 ]; then
    for unit in "${units[@]}"; do say "$unit: $(systemctl is-active "$unit" || true)"; done
    say "check with: $prefix/bin/spark-watchdog doctor"
else
    say "no running systemd here: enable with 'systemctl enable --now ${units[*]}' on the target"
fi

# -- what is left to a person, for controllers on the Sparks ---------------------
this=$(hostname -s 2>/dev/null || echo THIS-SPARK)
check="spark-watchdog controller --config /etc/spark-watchdog/controller.yaml --check"
if [ "$role" = colocated ] && [ "$start" = 1 ]; then
    say "check the order: '$check' ends with \"runs on $this: place N of M\""
elif [ "$role" = colocated ]; then
    again="sudo deploy/install.sh colocated"
    if [ "$serving" = 1 ]; then again+=" --serving"; fi
    if [ "$serving" = docker ]; then again+=" --serving-docker"; fi
    cat >&2 <<NEXT

Next, on this Spark ($this), then on each other Spark of the order
(docs/install.md, "Two Sparks and a smart plug, no other machine"):
  1. /etc/spark-watchdog/agent.yaml: this Spark's node name, listen.address
     0.0.0.0, the other Sparks as peers at their fabric addresses.
  2. /etc/spark-watchdog/controller.yaml, one file for every Spark: the nodes
     and their power, listen.address 0.0.0.0, the witness (the gateway, the
     plugs), colocated: (the order of the controllers) and
       history: /var/lib/spark-watchdog-controller/history.db
  3. Copy that controller.yaml, unchanged, to the other Sparks'
     /etc/spark-watchdog/.
  4. Secrets (the plugs' passwords, the serving token), each a file in
     /etc/spark-watchdog/credentials/, then run this again:
       $again --no-start
  5. $check
     ends with "runs on $this: place N of M" (another node name: --node, in the guide).
  6. sudo systemctl restart ${units[*]}
     then: spark-watchdog doctor
NEXT
fi
