#!/usr/bin/env bash
# One device call (no carry): FSDP1's reserved memory depends on how far the CPU runs ahead of the GPU
# (record_stream frees wait for the GPU), so the FSDP1 cases of the issue-19 matrix are measured one at a time
# (no other case process on the GPU), once without the allocator's memory history (the CPU at its own speed,
# as in a user's run) and once with it, each into its own folder; the cases named by --missing are measured
# first into the fixture folder (with their history, like the rest of the matrix).
# Comes back under $OUT: device.txt, missing.tar.gz, notrace.tar.gz, trace.tar.gz (fixtures and logs).
# Usage: FSDPSIM_GIT_SHA=<sha> scripts/device-fsdp1-passes.sh [--missing CASE,...] [--budget S]
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:?OUT must name the folder that comes back}
missing="" budget=170
while (($#)); do
  case $1 in
    --missing) missing=${2:?--missing needs case names}; shift 2 ;;
    --budget) budget=${2:?--budget needs seconds}; shift 2 ;;
    *) echo "device-fsdp1-passes: unknown argument $1" >&2; exit 2 ;;
  esac
done
sha=${FSDPSIM_GIT_SHA:-unknown}
ref=$here/scripts/torch_memory_reference.py
cases=$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(",".join(c["name"] for c in (m["cases"] if isinstance(m,dict) else m) if "fsdp1" in c["name"]))' "$here/scripts/torch_memory_matrix.json")
. "$here/scripts/device_context.sh"
write_device_context "$out/device.txt" "$sha" "scripts/device-fsdp1-passes.sh --missing '$missing' --budget $budget" \
  "fsdp1 cases: $cases"
stage=$(mktemp -d /tmp/fsdp1-passes-XXXXXX)
pass() {  # name, fixture folder, extra args...
  local name=$1 dir=$2; shift 2
  mkdir -p "$dir" "$stage/$name-logs"
  echo "== $name"
  PYTHONUNBUFFERED=1 timeout $((budget + 90)) python3 "$ref" run-matrix --out "$dir" --log-dir "$stage/$name-logs" \
    --git-sha "$sha" --no-smoke --jobs 1 "$@" 2>&1 | tee "$stage/$name-logs/run.log" | tail -20
  tar -C "$dir" -czf "$out/$name.tar.gz" . -C "$stage" "$name-logs"
}
[[ -n $missing ]] && pass missing "$here/tests/fixtures/torch_memory" --only "$missing" --budget-s 60
pass notrace "$stage/notrace" --only "$cases" --no-trace --budget-s "$budget"
pass trace "$stage/trace" --only "$cases" --budget-s "$budget"
