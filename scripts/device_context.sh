# Sourced by the device scripts (scripts/device-*.sh): the context block every device call writes first
# (when, which code, what was run, the GPU, driver, torch and CPUs), into FILE and on stdout.
# Usage: write_device_context FILE SHA COMMAND [EXTRA_LINE...]
write_device_context() {
  local file=$1 sha=$2 command=$3
  shift 3
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "fsdpsim git sha: $sha"
    echo "command: $command"
    local line
    for line in "$@"; do echo "$line"; done
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])' 2>&1
    echo "cpus: $(nproc)"
  } > "$file"
  cat "$file"
}
