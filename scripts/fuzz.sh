#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang, ASan and UBSan in their own
# build directory and runs each for SECONDS (default 60), starting from the
# seed corpus in fuzz/corpus/<target>/. New inputs go to a scratch corpus,
# never into the repository; a crash leaves its input as
# $BUILD/crash-<target>-* and makes the script fail (add it to the corpus
# and a regression test beside the code once fixed).
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#   FUZZ_BUILD=build-fuzz JOBS=2 scripts/fuzz.sh 20
#   FUZZ_SEED=1 FUZZ_RUNS=3000 scripts/fuzz.sh 30   # reproducible (CI): a fixed
#                                                   # seed and at most 3000 inputs
#   FUZZ_BUILD_ONLY=1 scripts/fuzz.sh               # the build alone (scripts/test.sh,
#                                                   # ahead in the background)
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
build=${FUZZ_BUILD:-build-fuzz}
jobs=${JOBS:-2}
all=(fuzz_job_yaml fuzz_set_override fuzz_job_spec_proto fuzz_rank_protocol fuzz_idx fuzz_csv fuzz_http_request)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

launcher=()
if command -v ccache >/dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTRAINCTL_FUZZ=ON "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$jobs" --target "${targets[@]}"
if [ -n "${FUZZ_BUILD_ONLY:-}" ]; then exit 0; fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
repro=()
if [ -n "${FUZZ_SEED:-}" ]; then repro+=(-seed="$FUZZ_SEED"); fi
if [ -n "${FUZZ_RUNS:-}" ]; then repro+=(-runs="$FUZZ_RUNS"); fi
failed=()
for t in "${targets[@]}"; do
  scratch="$build/corpus/$t"
  # A reproducible run starts from the repository's seeds alone.
  if [ -n "${FUZZ_SEED:-}" ]; then rm -rf "$scratch"; fi
  mkdir -p "$scratch"
  echo "== $t: ${seconds}s =="
  # -rss_limit_mb/-malloc_limit_mb: an input that makes a parser allocate
  # more than the limit is a finding (decompression bombs, size fields).
  # The outer timeout bounds a run whose crash report itself hangs (seen:
  # the symbolizer stuck after an out-of-memory report).
  if ! timeout --kill-after=10 $((seconds + 60)) "$build/fuzz/$t" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
       -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1 \
       "${repro[@]}" -artifact_prefix="$build/crash-$t-" "$scratch" "fuzz/corpus/$t" \
       2>"$build/$t.log"; then
    tail -n 60 "$build/$t.log"
    failed+=("$t")
  else
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$build/$t.log" | tr '\n' ' '
    echo
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings in ${failed[*]} (inputs: $build/crash-*)" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${seconds}s each without a finding"
