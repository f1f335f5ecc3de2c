#!/usr/bin/env bash
# The CUDA backend's validation on a lent GPU (issue #8), in two halves:
#
#   scripts/gpu-validate.sh pack [BUILD_DIR]     here (nvcc, no GPU): build the CUDA targets in
#       BUILD_DIR (default build-cuda), strip them and bundle them with the shared libraries they need
#       that a bare device image may lack (OpenMPI, OpenBLAS, yaml-cpp, ...; NOT cuBLAS/NCCL/driver,
#       which are hundreds of MiB and must come from the device) into BUILD_DIR/gpu-carry.tar.gz
#       (under the 64 MiB a device run may carry).
#   scripts/gpu-validate.sh run CARRY [OUT_DIR]  on the device machine: unpack CARRY, check with ldd
#       that every library resolves (looking for cuBLAS 13 / NCCL 2 in the usual CUDA and pip
#       locations), then run the kernel-math and GPU test suites and `fsdpsim validate --backend cuda`
#       on small models, and write everything under OUT_DIR (default $OUT, else reports/validation):
#       device.txt (nvidia-smi, driver, date), the test logs, per-plan validation JSON, summary.md.
#
#   scripts/gpu-validate.sh torch-memory [--budget-s S] [--only CASE,...]   on the device machine: PyTorch's
#       own memory as ground truth (issue 19). Runs scripts/torch_memory_matrix.json through
#       scripts/torch_memory_reference.py (PyTorch FSDP1/FSDP2 on a fake world of W ranks on this GPU), writes
#       tests/fixtures/torch_memory/<case>.json and packs the new fixtures into $OUT/torch_memory_fixtures.tar.gz
#       (logs: $OUT/torch_memory_logs.tar.gz, summary: $OUT/torch_memory_summary.json). Needs no carry and no
#       fsdpsim build (the model specs are committed). A call is limited to 10 minutes, so the runner stops
#       starting cases after S seconds (default 560) and the next call resumes: unpack the fixtures into
#       tests/fixtures/torch_memory/ here and run the same command again until it prints "matrix complete".
#       FSDPSIM_GIT_SHA names the fsdpsim commit in the fixtures (the device copy has no .git).
#
# With the session's device tool (run from the repository root), after `scripts/gpu-validate.sh pack`:
#   run(command="scripts/gpu-validate.sh run build-cuda/gpu-carry.tar.gz", carry=["build-cuda/gpu-carry.tar.gz"])
# then copy the returned files into reports/validation/cuda-<date>/ and commit them.
set -euo pipefail

die() { echo "gpu-validate: $*" >&2; exit 2; }
here=$(cd "$(dirname "$0")/.." && pwd)

pack() {
  local build=${1:-$here/build-cuda}
  [[ -x /usr/local/cuda/bin/nvcc ]] || die "nvcc not found at /usr/local/cuda/bin/nvcc"
  if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFSDPSIM_CUDA=ON -DFSDPSIM_BENCHMARKS=OFF
  fi
  cmake --build "$build" -j"$(nproc)" --target fsdpsim fsdpsim-run-cuda fsdpsim-calibrate-cuda \
    test_runtime_cuda_kernel_math test_runtime_cuda_gpu bench_attention_cuda
  local stage=$build/gpu-carry
  rm -rf "$stage" && mkdir -p "$stage/bin" "$stage/lib"
  local bins=("$build/fsdpsim" "$build/fsdpsim-run-cuda" "$build/fsdpsim-calibrate-cuda"
              "$build/tests/runtime/cuda/test_runtime_cuda_kernel_math"
              "$build/tests/runtime/cuda/test_runtime_cuda_gpu" "$build/tests/runtime/cuda/bench_attention_cuda")
  for b in "${bins[@]}"; do strip --strip-debug -o "$stage/bin/$(basename "$b")" "$b"; done   # symbols kept: backtraces name functions
  # Shared libraries: everything ldd resolves except glibc's own (the device's loader must match its
  # libc), the CUDA driver and the CUDA libraries (the device provides those).
  for b in "${bins[@]}"; do ldd "$b"; done | awk '$3 ~ /^\// {print $1, $3}' | sort -u | while read -r name path; do
    case $name in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcublas*|libnccl*|libcudart*) ;;
      *) cp -L "$path" "$stage/lib/$name" ;;
    esac
  done
  cat > "$stage/BUILD_INFO" <<EOF
built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname) from $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$here" diff --quiet 2>/dev/null || echo ' (uncommitted changes)')
$(/usr/local/cuda/bin/nvcc --version | tail -1); sm_80 + sm_90; cudart static; cuBLAS $(ls /usr/local/cuda/lib64/libcublas.so.* | sed 's/.*\.so\.//' | sort -V | tail -1) and NCCL 2 dynamic
needs: GLIBC $(objdump -T "$stage/bin/fsdpsim-run-cuda" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1 | cut -d_ -f2), a driver for CUDA $(/usr/local/cuda/bin/nvcc --version | grep -o 'release [0-9.]*' | cut -d' ' -f2)
EOF
  tar -C "$build" -czf "$build/gpu-carry.tar.gz" gpu-carry
  echo "gpu-validate: packed $(du -h "$build/gpu-carry.tar.gz" | cut -f1) into $build/gpu-carry.tar.gz"
  cat "$stage/BUILD_INFO"
}

# Directories that may hold libcublas.so.13 / libcublasLt.so.13 / libnccl.so.2 on a device image.
cuda_lib_dirs() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu \
           /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/lib/python3*/site-packages/nvidia/*/lib \
           /opt/conda/lib/python3*/site-packages/nvidia/*/lib /usr/local/lib/python3*/site-packages/nvidia/*/lib \
           "$HOME"/.local/lib/python3*/site-packages/nvidia/*/lib; do
    [[ -d $d ]] && echo "$d"
  done
  python3 - 2>/dev/null <<'EOF' || true
import glob, os, site
for s in site.getsitepackages() + [site.getusersitepackages()]:
    for d in glob.glob(os.path.join(s, "nvidia", "*", "lib")):
        print(d)
EOF
}

# Unpack CARRY (a folder or the .tar.gz) and point LD_LIBRARY_PATH at its libraries and the device's
# cuBLAS / NCCL; sets `root`.
unpack_carry() {
  local carry=$1
  root=$carry
  if [[ -f $carry ]]; then
    root=$(mktemp -d /tmp/fsdpsim-gpu-XXXXXX)
    tar -C "$root" -xzf "$carry"
    root=$root/gpu-carry
  fi
  [[ -x $root/bin/fsdpsim-run-cuda ]] || die "no bin/fsdpsim-run-cuda under $root"
  local libpath=$root/lib d
  for d in $(cuda_lib_dirs); do
    if ls "$d"/libcublas.so.13 >/dev/null 2>&1 || ls "$d"/libcublasLt.so.13 >/dev/null 2>&1 || ls "$d"/libnccl.so.2 >/dev/null 2>&1; then
      libpath=$libpath:$d
    fi
  done
  export LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

# gpu-validate.sh exec CARRY CMD...: run one command with the carried binaries first on PATH.
exec_in_carry() {
  local carry=${1:?usage: gpu-validate.sh exec CARRY CMD...}
  shift
  unpack_carry "$carry"
  export PATH=$root/bin:$PATH
  "$@"
}

run_on_device() {
  local carry=${1:?usage: gpu-validate.sh run CARRY [OUT_DIR]}
  local out=${2:-${OUT:-$here/reports/validation}}
  local stamp; stamp=$(date -u +%Y%m%dT%H%M%SZ)
  out=$out/cuda-$stamp
  mkdir -p "$out"
  local root
  unpack_carry "$carry"
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(hostname)"
    echo "command: $0 run $*"
    cat "$root/BUILD_INFO" 2>/dev/null || true
    echo "LD_LIBRARY_PATH: $LD_LIBRARY_PATH"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "nvidia-smi: not available"
    nvidia-smi 2>&1 | head -15 || true
  } > "$out/device.txt"
  cat "$out/device.txt"

  # ldd: every library must resolve (the usual failure: no cuBLAS 13 / NCCL on the image, or an old driver).
  for b in "$root"/bin/*; do
    if ldd "$b" | grep -q "not found"; then
      echo "ldd $(basename "$b"):" && ldd "$b" | grep "not found"
    fi
  done | tee "$out/ldd.txt"
  if grep -q "not found" "$out/ldd.txt"; then
    echo "gpu-validate: unresolved libraries (above, and in $out/ldd.txt). cuBLAS 13 and NCCL 2 must come from the"
    echo "  device image (a CUDA 13 toolkit, or pip nvidia-cublas / nvidia-nccl wheels for CUDA 13); nothing was run."
    exit 3
  fi

  local status=0
  local fs=$root/bin/fsdpsim
  timeout 300 "$root/bin/test_runtime_cuda_kernel_math" 2>&1 | tee "$out/test_kernel_math.log" || status=1
  timeout 600 "$root/bin/test_runtime_cuda_gpu" 2>&1 | tee "$out/test_gpu.log" || status=1

  # Calibration on this GPU (one GPU: GEMMs at llama3-8b's shapes, HBM, launch, PCIe, context; no NCCL
  # sweep needs two GPUs). The validations below use the built-in profile (what users without a GPU get)
  # and, for comparison, this calibrated one.
  # GV_PROFILE=FILE reuses a profile calibrated earlier on this kind of GPU (saves device time).
  local prof=$out/cuda-profile.json
  if [[ -n ${GV_PROFILE:-} ]]; then
    cp "$GV_PROFILE" "$prof" && echo "calibration: reused $GV_PROFILE" > "$out/calibrate.log"
  else
    { echo "+ $fs calibrate --backend cuda --model llama3-8b --seq-len 2048 --out $prof"
      timeout 300 "$fs" calibrate --backend cuda --model llama3-8b --seq-len 2048 --out "$prof"; } > "$out/calibrate.log" 2>&1 || status=1
  fi
  tail -20 "$out/calibrate.log"

  # fsdpsim validate --backend cuda on small models: one GPU, world 1, FSDP2 and FSDP1, AC on/off.
  # name|model|plan|extra options. Emulated worlds: rank 0 of 8 ranks on this GPU (true shard sizes,
  # collectives replaced by local copies): memory and compute are real, communication is not.
  local plans=(
    'tiny-fsdp2|tiny-llama|{"fsdp_version":2,"micro_batch":4,"seq_len":512}|'
    'tiny-fsdp2-ac|tiny-llama|{"fsdp_version":2,"micro_batch":4,"seq_len":512,"activation_checkpointing":"full"}|'
    'tiny-fsdp1|tiny-llama|{"fsdp_version":1,"micro_batch":4,"seq_len":512}|'
    'llama1b-full-shard-w8|llama-1b|{"sharding_strategy":"FULL_SHARD","micro_batch":1,"seq_len":2048}|--emulate-world 8'
    'llama1b-full-shard-ac-w8|llama-1b|{"sharding_strategy":"FULL_SHARD","micro_batch":2,"seq_len":2048,"activation_checkpointing":"full"}|--emulate-world 8'
    'llama1b-shard-grad-op-w8|llama-1b|{"sharding_strategy":"SHARD_GRAD_OP","micro_batch":1,"seq_len":2048}|--emulate-world 8'
    'llama1b-no-shard-w8|llama-1b|{"sharding_strategy":"NO_SHARD","micro_batch":1,"seq_len":2048}|--emulate-world 8'
    'llama3-8b-full-shard-w8|llama3-8b|{"sharding_strategy":"FULL_SHARD","micro_batch":1,"seq_len":2048}|--emulate-world 8'
    # The same emulated worlds with each collective standing in for its predicted NVLink duration:
    'llama1b-full-shard-w8-padded|llama-1b|{"sharding_strategy":"FULL_SHARD","micro_batch":1,"seq_len":2048}|--emulate-world 8 --pad-collectives'
    'llama3-8b-full-shard-w8-padded|llama3-8b|{"sharding_strategy":"FULL_SHARD","micro_batch":1,"seq_len":2048}|--emulate-world 8 --pad-collectives'
  )
  for entry in "${plans[@]}"; do
    IFS='|' read -r name model plan extra <<< "$entry"
    local world=1
    [[ $extra =~ --emulate-world\ ([0-9]+) ]] && world=${BASH_REMATCH[1]}
    # shellcheck disable=SC2206
    local cmd=("$fs" validate --backend cuda --model "$model" --plan "$plan" --ranks 1 --steps 3 $extra
               --json "$out/validate-$name.json" --trace-predicted "$out/trace-predicted-$name.json"
               --trace-measured "$out/trace-measured-$name.json")
    echo "+ ${cmd[*]}" > "$out/validate-$name.log"
    timeout "${GV_CASE_TIMEOUT:-240}" "${cmd[@]}" >> "$out/validate-$name.log" 2>&1 || status=1
    if [[ -f $prof ]]; then   # the same plan predicted with the calibrated profile
      local scmd=("$fs" simulate --model "$model" --plan "$plan" --cluster "${world}xH100-SXM" --profile "$prof"
                  --json "$out/simulate-calibrated-$name.json")
      echo "+ ${scmd[*]}" >> "$out/validate-$name.log"
      timeout 60 "${scmd[@]}" >> "$out/validate-$name.log" 2>&1 || true
    fi
    cat "$out/validate-$name.log"
  done

  # PyTorch on the same GPU and shapes (one GPU, no FSDP): the MFU reference for the runtime's compute.
  # name|model|micro_batch|seq_len|options
  local refs=()
  [[ ${GV_TORCH:-1} == 0 ]] || refs=(
    'tiny|tiny-llama|4|512|'
    'llama1b|llama-1b|1|2048|'
    'llama1b-ac|llama-1b|2|2048|--ac'
    'llama3-8b|llama3-8b|1|2048|--no-optimizer'
    'llama3-8b-ac|llama3-8b|1|4096|--ac --no-optimizer'
  )
  for entry in "${refs[@]+"${refs[@]}"}"; do
    IFS='|' read -r name model mb seq opts <<< "$entry"
    "$fs" model-info --model "$model" --json --seq-len "$seq" --micro-batch "$mb" > "$out/model-info-$model-$seq.json"
    # shellcheck disable=SC2086
    { echo "+ python3 scripts/torch_reference.py --model-info model-info-$model-$seq.json --micro-batch $mb --seq-len $seq $opts"
      timeout 180 python3 "$here/scripts/torch_reference.py" --model-info "$out/model-info-$model-$seq.json" \
        --micro-batch "$mb" --seq-len "$seq" $opts --json "$out/torch-$name.json"; } > "$out/torch-$name.log" 2>&1 || true
    tail -3 "$out/torch-$name.log"
  done
  python3 "$here/scripts/gpu_validation_summary.py" "$out" > "$out/summary.md" || status=1
  cat "$out/summary.md"
  echo "gpu-validate: results in $out (status $status)"
  return $status
}

# gpu-validate.sh torch-memory [--budget-s S] [--only CASE,...] [--jobs N] [--smoke|--no-smoke]: the issue-19 matrix
# (--jobs: N case processes share the GPU, packed by predicted memory; see scripts/torch_memory/runner.py).
torch_memory() {
  local budget=560 only="" smoke=auto jobs=1
  while (($#)); do
    case $1 in
      --budget-s) budget=${2:?--budget-s needs seconds}; shift 2 ;;
      --only) only=${2:?--only needs case names}; shift 2 ;;
      --smoke) smoke=yes; shift ;;
      --no-smoke) smoke=no; shift ;;
      --jobs) jobs=${2:?--jobs needs a count}; shift 2 ;;
      *) die "torch-memory: unknown argument $1 (--budget-s S, --only CASE,..., --jobs N, --smoke, --no-smoke)" ;;
    esac
  done
  python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null \
    || { echo "gpu-validate: torch-memory needs python3 with PyTorch and a CUDA GPU"; exit 3; }
  local sha=${FSDPSIM_GIT_SHA:-$(git -C "$here" rev-parse HEAD 2>/dev/null || echo unknown)}
  local out=${OUT:-$here/reports/torch-memory} fixtures=$here/tests/fixtures/torch_memory
  local stage; stage=$(mktemp -d /tmp/torch-memory-XXXXXX)
  mkdir -p "$out" "$stage/logs"
  touch "$stage/started"
  # The smoke test (tiny models through every code path, about a minute) runs on the first call only.
  if [[ $smoke == auto ]]; then
    smoke=yes
    [[ -n $(find "$fixtures" -maxdepth 1 -name '*.json' ! -name schema.json -print -quit) ]] && smoke=no
  fi
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "fsdpsim git sha: $sha"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  } | tee "$stage/logs/device.txt"
  local args=(run-matrix --out "$fixtures" --log-dir "$stage/logs" --budget-s "$budget" --git-sha "$sha" --jobs "$jobs")
  [[ -n $only ]] && args+=(--only "$only")
  [[ $smoke == no ]] && args+=(--no-smoke)
  local status=0
  PYTHONUNBUFFERED=1 python3 "$here/scripts/torch_memory_reference.py" "${args[@]}" 2>&1 | tee "$stage/logs/run.log" \
    || status=${PIPESTATUS[0]}
  # What comes back from the device is at most 8 files: the fixtures of this call in one archive.
  local new=()
  while IFS= read -r f; do new+=("$(basename "$f")"); done < <(find "$fixtures" -maxdepth 1 -name '*.json' \
    ! -name schema.json -newer "$stage/started" | sort)
  if ((${#new[@]})); then
    tar -C "$fixtures" -czf "$out/torch_memory_fixtures.tar.gz" "${new[@]}"
  fi
  tar -C "$stage" -czf "$out/torch_memory_logs.tar.gz" logs
  cp "$stage/logs/torch_memory_summary.json" "$out/" 2>/dev/null || true
  echo "gpu-validate: ${#new[@]} fixture(s) of this call in $out/torch_memory_fixtures.tar.gz; unpack with"
  echo "  tar -xzf FILES_AT/torch_memory_fixtures.tar.gz -C tests/fixtures/torch_memory/"
  return "$status"
}

case ${1:-} in
  pack) shift; pack "$@" ;;
  run) shift; run_on_device "$@" ;;
  exec) shift; exec_in_carry "$@" ;;
  torch-memory) shift; torch_memory "$@" ;;
  *) die "usage: gpu-validate.sh pack [BUILD_DIR] | run CARRY [OUT_DIR] | exec CARRY CMD... | torch-memory [--budget-s S] [--only CASE,...]" ;;
esac
