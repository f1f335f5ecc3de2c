#!/usr/bin/env bash
# The whole test suite under AddressSanitizer + UndefinedBehaviorSanitizer (CMake option
# FSDPSIM_SANITIZE: -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer on
# compile and link), in its own build directory ${FSDPSIM_ASAN_DIR:-build-asan}, CUDA and benchmarks
# off. Any ASan/UBSan report fails the test that triggered it.
#   scripts/sanitize.sh [CTEST ARGS...]     e.g. scripts/sanitize.sh -R test_plan
# OpenMPI's own process-lifetime allocations trip LeakSanitizer in every rank started by mpirun: they
# are suppressed by tests/sanitizers/lsan.supp (frames in libmpi / open-pal / pmix / hwloc / ...; see
# its header), so leak checking stays on for everything else, MPI ranks included.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${FSDPSIM_ASAN_DIR:-$root/build-asan}"
"$root/scripts/deps.sh" --test
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  # -O1 -g1: what AddressSanitizer's documentation recommends (reasonable speed, line tables for the
  # reports), and less compile and link work than -O2 with full debug info for this second build.
  cmake -S "$root" -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFSDPSIM_SANITIZE=ON \
        -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
        -DFSDPSIM_CUDA=OFF -DFSDPSIM_BENCHMARKS=OFF >/dev/null
fi
cmake --build "$build" -j "$(nproc)"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
# Sanitized code runs several times slower: give every test more time than the plain suite does, and
# run the random-plan tests (tests/sim/random_plans.h) on at most 100 plans each: they look for memory
# errors on the paths the plain run's 120 to 400 plans cover (CI must stay under 60 minutes).
export FSDPSIM_RANDOM_PLANS_MAX="${FSDPSIM_RANDOM_PLANS_MAX:-100}"
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 1500 "$@"
