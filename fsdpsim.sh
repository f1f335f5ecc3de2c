#!/usr/bin/env bash
# The main job from a fresh machine: installs what is missing, builds, runs fsdpsim.
# With no arguments: `fsdpsim plan` on the built-in default (llama3-8b on 8xH100-SXM, seq 8192),
# writing out/plan.json and out/report.html.
# `run` and `validate` also build the runtime's worker they start (fsdpsim-run-cpu, or
# fsdpsim-run-cuda with --backend cuda). The build shows its progress on stderr; fsdpsim's own
# output stays alone on stdout.
set -euo pipefail
root="$(cd "$(dirname "$0")" && pwd)"
build="${FSDPSIM_BUILD_DIR:-$root/build}"
"$root/scripts/deps.sh"
targets=(fsdpsim)
if [[ "${1:-}" == "run" || "${1:-}" == "validate" ]]; then
  backend=cpu
  prev=""
  for a in "$@"; do
    [[ "$prev" == "--backend" ]] && backend="$a"
    [[ "$a" == --backend=* ]] && backend="${a#--backend=}"
    prev="$a"
  done
  if [[ "$backend" == "cuda" ]]; then targets+=(fsdpsim-run-cuda); else targets+=(fsdpsim-run-cpu); fi
fi
if [[ ! -x "$build/fsdpsim" ]]; then
  echo "fsdpsim.sh: first build of ${targets[*]} in $build (several minutes; progress below)" >&2
fi
if ! "$root/scripts/build.sh" --target "${targets[@]}" 1>&2; then
  echo "fsdpsim.sh: the build failed (its messages are above)" >&2
  exit 1
fi
for t in "${targets[@]:1}"; do
  if [[ ! -x "$build/$t" ]]; then
    echo "fsdpsim.sh: $t was not built: CMake left it out (see the warning from runtime/CMakeLists.txt at configure time;" \
         "the CPU worker needs OpenMPI and OpenBLAS, the CUDA worker nvcc and NCCL)" >&2
    exit 1
  fi
done
if [[ $# -eq 0 ]]; then set -- plan --out "$root/out"; fi
exec "$build/fsdpsim" "$@"
