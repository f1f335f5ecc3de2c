#!/usr/bin/env bash
# Fuzzes the input readers (tests/fuzz/): builds the libFuzzer targets with clang
# (-DFSDPSIM_FUZZ=ON: -fsanitize=fuzzer,address,undefined) in ${FSDPSIM_FUZZ_DIR:-build-fuzz} and
# runs each for SECONDS (default 60), seeded from tests/fuzz/corpus/<target>/. Exits non-zero on a
# finding (an exception other than InputError, a crash, a sanitizer report, a >10 s input, >2 GiB):
# the input is saved as build-fuzz/findings/<target>/crash-* (or timeout-*, oom-*); reproduce with
#   build-fuzz/fuzz/fuzz_<target> FILE
# and, once fixed, copy it into tests/fuzz/corpus/<target>/ so the normal suite replays it.
#   scripts/fuzz.sh [SECONDS] [TARGET...]      e.g. scripts/fuzz.sh 3600 plan profile
# Inputs the fuzzer finds interesting accumulate in build-fuzz/corpus/<target>/ across runs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
seconds="${1:-60}"
shift || true
[[ "$seconds" =~ ^[0-9]+$ && "$seconds" -ge 1 ]] || { echo "fuzz.sh: SECONDS must be a positive integer, not '$seconds'" >&2; exit 2; }
build="${FSDPSIM_FUZZ_DIR:-$root/build-fuzz}"
targets=("$@")
((${#targets[@]})) || targets=(hf_config plan profile cluster user_yaml user_toml user_lightning)

"$root/scripts/deps.sh"   # the libraries' own dependencies (nlohmann-json, Boost, yaml-cpp, toml++)
SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
apt_install() {
  echo "fuzz.sh: installing $*" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}
command -v clang++ >/dev/null || apt_install clang
# libFuzzer's runtime is in libclang-rt-<major>-dev (a dependency of clang on Debian 12, checked anyway).
major="$(clang++ -dumpversion | cut -d. -f1)"
if ! ls /usr/lib/llvm-"$major"/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  apt_install "libclang-rt-$major-dev"
fi

gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  CC=clang CXX=clang++ cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFSDPSIM_FUZZ=ON >/dev/null
fi
cmake --build "$build" -j "$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}")

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
failed=()
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t" findings="$build/findings/$t"
  mkdir -p "$corpus" "$findings"
  echo "fuzz.sh: fuzz_$t for ${seconds} s"
  # New interesting inputs go to the first directory (build-fuzz/corpus); the seeds are read only.
  if "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$findings/" "$corpus" "$root/tests/fuzz/corpus/$t" >"$build/fuzz_$t.log" 2>&1; then
    grep -E "^stat::number_of_executed_units|DONE" "$build/fuzz_$t.log" | tail -1 | sed "s/^/  /"
  else
    echo "fuzz.sh: FINDING in fuzz_$t (log: $build/fuzz_$t.log, input: $(ls -t "$findings" | head -1)):" >&2
    grep -E "FINDING|ERROR|runtime error|SUMMARY" "$build/fuzz_$t.log" | head -5 >&2 || true
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz.sh: findings in: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets, ${seconds} s each: no finding"
