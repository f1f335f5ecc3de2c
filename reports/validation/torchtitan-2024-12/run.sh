#!/usr/bin/env bash
# External check, not fitted on: fsdpsim against torchtitan's published Llama 3.1 8B FSDP runs
# (pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Tables 1 and 3: torch 1963fc8 and
# torchtitan 9dec370 of 2024-12; H100 96 GB HBM2e at a 500 W limit; local batch 2 x seq 8192 (train_configs/
# llama3_8b.toml at 9dec370), selective op AC, FSDP2, bf16 params / fp32 reduce, `del pred` before backward,
# loss not compiled). Memory there is torchtitan's logged max_memory_reserved in GiB; TPS/GPU at step 90.
#   usage: reports/validation/torchtitan-2024-12/run.sh [path/to/fsdpsim]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${1:-$here/../../../build/fsdpsim}"
printf '%-10s %-26s %9s %9s %7s %9s %9s %7s\n' gpus techniques "tps meas" "tps sim" "err%" "GiB meas" "GiB sim" "err%"
row() {   # gpus cluster mesh extra label tps_measured gib_measured
  local plan='{"fsdp_version":2,"implementation":"torchtitan","micro_batch":2,"seq_len":8192,"activation_checkpointing":"selective_op","param_dtype":"bf16","reduce_dtype":"fp32","alloc_conf":"expandable_segments:True","mesh":'"$3$4"'}'
  local out tps gib
  out="$("$bin" simulate --model llama3-8b --cluster "$here/$2" --plan "$plan")"
  tps="$(awk '/tokens\/s per GPU/ {print $4}' <<<"$out")"
  gib="$(awk '/peak reserved/ {print $NF}' <<<"$out")"
  awk -v g="$1" -v l="$5" -v tm="$6" -v ts="$tps" -v gm="$7" -v gs="$gib" \
    'BEGIN { printf "%-10s %-26s %9d %9.0f %+7.1f %9.1f %9.2f %+7.1f\n", g, l, tm, ts, 100*(ts-tm)/tm, gm, gs, 100*(gs-gm)/gm }'
}
row 8   8xH100-96GB.json             '[1,8]'   ''                                      "FSDP"                      5762 82.4
row 8   8xH100-96GB.json             '[1,8]'   ',"compile":true'                       "FSDP+compile"              6667 77.0
row 8   8xH100-96GB.json             '[1,8]'   ',"compile":true,"float8":"tensorwise"' "FSDP+compile+float8"       8532 76.8
row 128 16x8xH100-96GB-RoCE400.json  '[1,128]' ''                                      "FSDP"                      5605 67.0
row 128 16x8xH100-96GB-RoCE400.json  '[1,128]' ',"compile":true'                       "FSDP+compile"              6514 62.0
row 128 16x8xH100-96GB-RoCE400.json  '[1,128]' ',"compile":true,"float8":"tensorwise"' "FSDP+compile+float8"       8380 61.8
