#!/usr/bin/env bash
# One device call on a lent GPU (no carry, no fsdpsim build): PyTorch's own memory over the issue-19
# matrix (case processes packed on the GPU by predicted memory), then per-op timings of a few cases, each
# alone on the GPU (issue 20). Everything comes back under $OUT (at most 8 files):
#   device.txt, fixtures-1.tar.gz / fixtures-2.tar.gz (the fixtures each phase wrote), logs-1.tar.gz /
#   logs-2.tar.gz (per-case logs and torch_memory_summary.json), alloc-traces.tar.gz (with --first),
#   ops.tar.gz (<case>.ops.json and profile_ops.log)
# Each phase packs its own files as soon as it ends, so a call stopped at its limit still returns them.
#
# Usage (device tool, repository root):
#   FSDPSIM_GIT_SHA=<sha> scripts/device-reference.sh [--remeasure] [--first CASE,...] [--jobs N]
#       [--mem-budget S] [--first-budget S] [--ops CASE,...] [--ops-budget S]
#   --remeasure   delete the committed fixtures in the device's copy first, so every case is measured
#                 with the harness as it is now (the runner otherwise skips a case whose fixture exists)
#   --first       these cases run first, in their own phase, with the allocator's whole history
#                 (FSDPSIM_TM_ALLOC_TRACE) written for each; the rest of the matrix follows in phase 2
#   --ops         the cases whose per-op timings are profiled after the memory matrix (default: none)
#   --no-trace    phase 2 records no memory history (run-matrix --no-trace): the CPU runs at its own speed,
#                 which FSDP1's reserved memory depends on (record_stream frees wait for the GPU)
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:?OUT must name the folder that comes back}
command="scripts/device-reference.sh $*"
remeasure=0 first="" jobs=4 mem_budget=300 first_budget=150 ops="" ops_budget=120 no_trace=0
while (($#)); do
  case $1 in
    --remeasure) remeasure=1; shift ;;
    --first) first=${2:?--first needs case names}; shift 2 ;;
    --jobs) jobs=${2:?--jobs needs a count}; shift 2 ;;
    --mem-budget) mem_budget=${2:?--mem-budget needs seconds}; shift 2 ;;
    --first-budget) first_budget=${2:?--first-budget needs seconds}; shift 2 ;;
    --ops) ops=${2:?--ops needs case names}; shift 2 ;;
    --ops-budget) ops_budget=${2:?--ops-budget needs seconds}; shift 2 ;;
    --no-trace) no_trace=1; shift ;;
    *) echo "device-reference: unknown argument $1" >&2; exit 2 ;;
  esac
done
export FSDPSIM_GIT_SHA=${FSDPSIM_GIT_SHA:-unknown}
fixtures=$here/tests/fixtures/torch_memory
stage=$(mktemp -d /tmp/device-reference-XXXXXX)
t0=$(date +%s)
. "$here/scripts/device_context.sh"
write_device_context "$out/device.txt" "$FSDPSIM_GIT_SHA" "$command"
[[ $remeasure == 1 ]] && find "$fixtures" -maxdepth 1 -name '*.json' ! -name schema.json -delete

# phase N: run-matrix over the cases given (all when none), then pack the fixtures it wrote and its logs.
phase() {
  local n=$1 budget=$2 only=$3 untraced=${4:-0}
  local logs=$stage/logs-$n
  mkdir -p "$logs"
  touch "$stage/started-$n"
  local args=(run-matrix --out "$fixtures" --log-dir "$logs" --budget-s "$budget" --git-sha "$FSDPSIM_GIT_SHA"
              --jobs "$jobs" --no-smoke)
  [[ -n $only ]] && args+=(--only "$only")
  [[ $untraced == 1 ]] && args+=(--no-trace)
  echo "== phase $n: budget ${budget}s${only:+, cases $only}"
  PYTHONUNBUFFERED=1 timeout $((budget + 120)) python3 "$here/scripts/torch_memory_reference.py" "${args[@]}" 2>&1 \
    | tee "$logs/run.log" | tail -60
  local new=()
  while IFS= read -r f; do new+=("$(basename "$f")"); done < <(find "$fixtures" -maxdepth 1 -name '*.json' \
    ! -name schema.json -newer "$stage/started-$n" | sort)
  ((${#new[@]})) && tar -C "$fixtures" -czf "$out/fixtures-$n.tar.gz" "${new[@]}"
  tar -C "$stage" -czf "$out/logs-$n.tar.gz" "logs-$n"
  echo "phase $n: ${#new[@]} fixtures written in $(($(date +%s) - t0)) s since the start"
}

if [[ -n $first ]]; then
  mkdir -p "$stage/alloc-traces"
  FSDPSIM_TM_ALLOC_TRACE=$stage/alloc-traces phase 1 "$first_budget" "$first"
  tar -C "$stage" -czf "$out/alloc-traces.tar.gz" alloc-traces
fi
left=$((mem_budget - ($(date +%s) - t0)))
((left > 10)) && phase 2 "$left" "" "$no_trace"

if [[ -n $ops ]]; then
  echo "== per-op timings"
  mkdir -p "$stage/ops"
  PYTHONUNBUFFERED=1 timeout $((ops_budget + 60)) python3 "$here/scripts/torch_memory_reference.py" profile-ops \
    --cases "$ops" --out "$stage/ops" --budget-s "$ops_budget" --git-sha "$FSDPSIM_GIT_SHA" 2>&1 \
    | tee "$stage/ops/profile_ops.log"
  tar -C "$stage" -czf "$out/ops.tar.gz" ops
fi
echo "device-reference: done in $(($(date +%s) - t0)) s"
ls -la "$out"
