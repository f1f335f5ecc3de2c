#!/usr/bin/env bash
# The whole test suite from a fresh machine: installs what is missing, builds everything, runs CTest.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/deps.sh" --test
"$root/scripts/build.sh"
cd "${FSDPSIM_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "$(nproc)" "$@"
