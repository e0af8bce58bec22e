#!/usr/bin/env bash
# Builds the vramlens wheel for this platform: the vramlens binary plus the Python package
# in python/vramlens (see pyproject.toml). Needs a Rust toolchain and maturin
# (pip install maturin==1.16.0); the wheel itself needs neither.
#
#   scripts/build_wheel.sh                          release build into dist/
#   scripts/build_wheel.sh --profile dev --out DIR  reuses the debug build (the tests)
#
# Then: pip install dist/vramlens-*.whl
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
out=dist
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) profile=${2:?--profile needs a value}; shift 2 ;;
        --out) out=${2:?--out needs a value}; shift 2 ;;
        *) echo "build_wheel.sh: unknown argument $1 (expected --profile NAME or --out DIR)" >&2; exit 2 ;;
    esac
done
if ! command -v maturin >/dev/null 2>&1; then
    echo "build_wheel.sh: maturin not found; install it with: pip install maturin==1.16.0" >&2
    exit 2
fi
# pyproject.toml strips the binary (2 MB instead of 15 MB). A dev wheel is built from
# cargo's own target/debug/vramlens, which stripping would rewrite, so it is left as it is.
strip=true
[ "$profile" = dev ] && strip=false
exec maturin build --locked --profile "$profile" --strip "$strip" --out "$out"
