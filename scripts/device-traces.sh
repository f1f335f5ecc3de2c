#!/usr/bin/env bash
# One device call (no carry): the allocator's whole history (FSDPSIM_TM_ALLOC_TRACE) of matrix cases that
# already have a fixture, to see where PyTorch places what the simulator places elsewhere. The cases run one at
# a time into a scratch folder (the committed fixtures are not touched; the runs' fixtures come back beside the
# histories, for `add-repeats`). A case whose harness code changed can be named with --fixtures to have its
# fixture measured again into the fixture folder first (it is deleted in the device's copy).
# Comes back under $OUT: device.txt, traces.tar.gz (alloc-traces/, runs/, logs/), fixtures.tar.gz (with --fixtures).
# Usage: FSDPSIM_GIT_SHA=<sha> scripts/device-traces.sh CASE,... [--fixtures CASE,...] [--budget S]
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:?OUT must name the folder that comes back}
cases=${1:?name the cases, comma-separated}; shift
refix="" budget=150
while (($#)); do
  case $1 in
    --fixtures) refix=${2:?--fixtures needs case names}; shift 2 ;;
    --budget) budget=${2:?--budget needs seconds}; shift 2 ;;
    *) echo "device-traces: unknown argument $1" >&2; exit 2 ;;
  esac
done
sha=${FSDPSIM_GIT_SHA:-unknown}
ref=$here/scripts/torch_memory_reference.py
fixtures=$here/tests/fixtures/torch_memory
. "$here/scripts/device_context.sh"
write_device_context "$out/device.txt" "$sha" "scripts/device-traces.sh $cases${refix:+ --fixtures $refix} --budget $budget"
stage=$(mktemp -d /tmp/device-traces-XXXXXX)
mkdir -p "$stage/alloc-traces" "$stage/runs" "$stage/logs"
if [[ -n $refix ]]; then
  IFS=, read -ra names <<< "$refix"
  for n in "${names[@]}"; do rm -f "$fixtures/$n.json"; done
  mkdir -p "$stage/fix-logs"
  PYTHONUNBUFFERED=1 timeout $((budget + 60)) python3 "$ref" run-matrix --only "$refix" --out "$fixtures" \
    --log-dir "$stage/fix-logs" --git-sha "$sha" --no-smoke --jobs 1 --budget-s "$budget" 2>&1 | tail -20
  (cd "$fixtures" && tar -czf "$out/fixtures.tar.gz" $(for n in "${names[@]}"; do [[ -f $n.json ]] && echo "$n.json"; done) \
     -C "$stage" fix-logs)
fi
FSDPSIM_TM_ALLOC_TRACE=$stage/alloc-traces PYTHONUNBUFFERED=1 timeout $((budget + 60)) python3 "$ref" run-matrix \
  --only "$cases" --out "$stage/runs" --log-dir "$stage/logs" --git-sha "$sha" --no-smoke --jobs 1 \
  --budget-s "$budget" 2>&1 | tail -20
tar -C "$stage" -czf "$out/traces.tar.gz" alloc-traces runs logs
