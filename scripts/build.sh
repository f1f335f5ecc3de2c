#!/usr/bin/env bash
# Configures (once) and builds fsdpsim incrementally in ${FSDPSIM_BUILD_DIR:-build}.
# Progress: ninja's status line ([done/total] and the file being compiled) on a terminal, one line per
# step otherwise; the configure step says that it runs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${FSDPSIM_BUILD_DIR:-$root/build}"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  echo "build.sh: configuring $build (cmake)" >&2
  cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo ${FSDPSIM_CMAKE_ARGS:-} >/dev/null
fi
cmake --build "$build" -j "$(nproc)" "$@"
