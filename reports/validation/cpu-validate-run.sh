#!/bin/bash
# Issue 20's CPU validation after calibration: calibrate 2 ranks (full) and validate three times, then 4 ranks
# (--quick) and validate three times; prints the errors. Usage: cpu-validate-run.sh FSDPSIM_BIN OUTDIR
# (run it as `nice -n -20` on a machine with nothing else running: reports/validation/cpu-validate-2026-11-26-typical.txt)
B=$(realpath "${1:-build/fsdpsim}"); O=${2:-/tmp/cpu-validate}; mkdir -p "$O"; O=$(realpath "$O")
P='{"param_dtype":"fp32","reduce_dtype":"fp32","seq_len":64,"micro_batch":2}'
cd $O
echo "== ranks 2: calibrate $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
$B calibrate --backend cpu --model tiny-llama --micro-batch 2 --seq-len 64 --ranks 2 --out $O/p2.json > $O/cal2.log 2>&1
echo "calibrate rc=$? $(grep -c WARNING $O/cal2.log) warnings"
for r in 1 2 3; do
  echo "-- validate 2 ranks run $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  $B validate --model tiny-llama --ranks 2 --steps 11 --profile $O/p2.json --plan "$P" --json $O/v2_$r.json 2>&1 | grep -E "step time|compute busy|exposed comm"
done
echo "== ranks 4: quick calibrate $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
$B calibrate --backend cpu --model tiny-llama --micro-batch 2 --seq-len 64 --ranks 4 --quick --out $O/p4.json > $O/cal4.log 2>&1
echo "calibrate rc=$?"
for r in 1 2 3; do
  echo "-- validate 4 ranks run $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  $B validate --model tiny-llama --ranks 4 --steps 11 --profile $O/p4.json --plan "$P" --json $O/v4_$r.json 2>&1 | grep -E "step time|compute busy|exposed comm|note"
done
echo "== done $(date -u +%H:%M:%S)"
