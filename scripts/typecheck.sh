#!/usr/bin/env bash
# mypy (strict, pyproject.toml) over the package, the benchmarks, the
# scripts and every test directory. Each test directory is checked on its own: they share no
# package (no __init__.py: pytest's importlib mode), so each has a conftest
# of its own, which mypy would otherwise take for one module twice.
# --no-warn-unreachable for tests only: an assert narrows an attribute, and
# mypy keeps the narrowing across the call that changes it.
set -uo pipefail
cd "$(dirname "$0")/.."
mypy=.venv/bin/mypy
status=0
$mypy || status=1
$mypy bench || status=1
$mypy --explicit-package-bases scripts/*.py || status=1
out=$(mktemp)
for dir in tests tests/*/; do
    compgen -G "${dir%/}/*.py" > /dev/null || continue
    if [ "$dir" = tests ]; then
        files=(tests/*.py)
    else
        files=("${dir%/}")
    fi
    MYPYPATH="${dir%/}:tests/support" $mypy --explicit-package-bases --no-warn-unreachable "${files[@]}" \
        > "$out" 2>&1 || { cat "$out"; status=1; }
done
rm -f "$out"
[ "$status" = 0 ] && echo "mypy: spark_watchdog, bench, scripts and tests clean"
exit "$status"
