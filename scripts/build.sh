#!/usr/bin/env bash
# Configures (once) and builds fsdpsim incrementally in ${FSDPSIM_BUILD_DIR:-build}.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${FSDPSIM_BUILD_DIR:-$root/build}"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${FSDPSIM_CMAKE_ARGS:-} >/dev/null
fi
cmake --build "$build" -j "$(nproc)" "$@"
