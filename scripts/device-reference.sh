#!/usr/bin/env bash
# One device call on a lent GPU (no carry, no fsdpsim build): PyTorch's own memory over the issue-19
# matrix (4 case processes packed on the GPU by predicted memory), then per-op timings of a few cases,
# each alone on the GPU (issue 20). Everything comes back under $OUT:
#   device.txt, torch_memory_fixtures.tar.gz, torch_memory_logs.tar.gz, torch_memory_summary.json,
#   ops.tar.gz (<case>.ops.json), profile_ops.log
# Usage (device tool, repository root): FSDPSIM_GIT_SHA=<sha> scripts/device-reference.sh [MEM_BUDGET_S] [OPS_BUDGET_S]
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:?OUT must name the folder that comes back}
mem_budget=${1:-300}
ops_budget=${2:-150}
export FSDPSIM_GIT_SHA=${FSDPSIM_GIT_SHA:-unknown}
mkdir -p "$out/ops"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "fsdpsim git sha: $FSDPSIM_GIT_SHA"
  echo "command: scripts/device-reference.sh $mem_budget $ops_budget"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])' 2>&1
  nproc
} > "$out/device.txt"
cat "$out/device.txt"
timeout $((mem_budget + 90)) "$here/scripts/gpu-validate.sh" torch-memory --budget-s "$mem_budget" --jobs 4 --no-smoke 2>&1 | tail -80
echo "== per-op timings"
PYTHONUNBUFFERED=1 timeout $((ops_budget + 30)) python3 "$here/scripts/torch_memory_reference.py" profile-ops \
  --cases l1b-fsdp2-w8-tt,l3-8b-fsdp2-sac-s4096-tt,l3-8b-fsdp2-ac-mb2-s8192-tt,l1b-fsdp2-ac-s8192-hf,l1b-fsdp2-mb4-tt,l3-8b-fsdp2-w512-tt,l1b-fsdp2-compile-w8-tt \
  --out "$out/ops" --budget-s "$ops_budget" --git-sha "$FSDPSIM_GIT_SHA" 2>&1 | tee "$out/profile_ops.log"
tar -C "$out" -czf "$out/ops.tar.gz" ops && rm -rf "$out/ops"
ls -la "$out"
