#!/usr/bin/env bash
# Runs the cuFile probe against libcufile.so.0 from the PyPI wheel nvidia-cufile, through the
# child process and its deadline. No GPU or NVIDIA driver needed: the point is that the probe
# returns a clean, named outcome (an error code and name, or a timeout) and neither hangs nor
# crashes the parent.
#
#   crates/gds-check/tests/cufile-wheel.sh            # from the repo root
#   CUFILE_WHEEL_VERSION=1.15.1.6 GDS_CHECK_CUFILE_STRICT=1 crates/gds-check/tests/cufile-wheel.sh
set -euo pipefail
repo="$(cd "$(dirname "$0")/../../.." && pwd)"
version="${CUFILE_WHEEL_VERSION:-1.20.0.107}"
venv="$repo/.cache/cufile-venv-$version"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet "nvidia-cufile==$version"
fi
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
lib="$(find "$site/nvidia" -name 'libcufile.so.0' | head -n1)"
[ -n "$lib" ] || { echo "libcufile.so.0 not found under $site" >&2; exit 1; }
echo "library: $lib"
cd "$repo"
export GDS_CHECK_CUFILE_LIB="$lib"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$repo/target-gds}"
cargo test -p gds-check --test cufile_wheel -- --nocapture
