#!/usr/bin/env bash
# CI for the Python package, from a clean checkout: a fresh virtual environment, the package
# installed from ./python as a user installs it (maturin builds the extension), the release
# CLI built (the tests compare the package's reports, memory curves and sweeps with it), then
# pytest.
#
# Environment: PYTHON (default python3), STEPSIM_VENV (default $TMPDIR/stepsim-ci-venv,
# recreated), CARGO_TARGET_DIR (honoured by both builds), STEPSIM_BIN (default: the release
# CLI this script builds). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
python="${PYTHON:-python3}"
venv="${STEPSIM_VENV:-${TMPDIR:-/tmp}/stepsim-ci-venv}"
lap() { echo "ci.sh: $1: $((SECONDS - $2)) s"; }

t=$SECONDS
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet maturin pytest
lap "venv, maturin, pytest" "$t"

t=$SECONDS
"$venv/bin/python" -m pip install --quiet "./python[pandas,test]"
lap "pip install ./python" "$t"

t=$SECONDS
cargo build --release --quiet
lap "cargo build --release" "$t"
target="${CARGO_TARGET_DIR:-target}"
case "$target" in
/*) ;;
*) target="$PWD/$target" ;;
esac
export STEPSIM_BIN="${STEPSIM_BIN:-$target/release/stepsim}"

t=$SECONDS
# From the repository root (not python/, whose stepsim/ folder lacks the built extension).
"$venv/bin/python" -m pytest python/tests -q "$@"
lap "pytest" "$t"
lap "total" "$start"
