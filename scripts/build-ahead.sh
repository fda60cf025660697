#!/usr/bin/env bash
# The sanitizer and fuzzing builds that scripts/test.sh's later stages need,
# made ahead of them. scripts/test.sh starts this in the background after
# its main build, at the lowest CPU priority (nice 19), so that these
# compile in the CPU time the tests stage leaves idle (its processes mostly
# wait on each other and on the network: the 2 cores are about 40% busy);
# each stage later runs its own step again in the foreground: a no-op when
# this finished it, the same error in the open when it failed.
#
#   scripts/build-ahead.sh DIR STEP...   # each STEP in order; DIR/STEP.rc holds its exit status once it ended
#   scripts/build-ahead.sh - STEP...     # in the foreground, stopping at the first failure
#
# Steps: asan (build-asan/: clang, address+undefined, the thread-safety
# analysis, no LibTorch), fuzz (scripts/fuzz.sh's build), tsan
# (scripts/tsan.sh's abseil and build; TSAN_EXCLUDE as the caller sets it).
# JOBS (2).
set -uo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-2}
dir=${1:?usage: $0 DIR|- STEP...}
shift

step() {
  case $1 in
    # Line tables only (-gline-tables-only): what a sanitizer report's stack
    # needs, and a lighter compile than -g.
    asan) CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
            -DTRAINCTL_SANITIZE=ON -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only >/dev/null &&
          cmake --build build-asan -j "$jobs" ;;
    fuzz) FUZZ_BUILD_ONLY=1 JOBS="$jobs" bash scripts/fuzz.sh ;;
    tsan) TSAN_BUILD_ONLY=1 JOBS="$jobs" bash scripts/tsan.sh ;;
    *) echo "build-ahead: unknown step '$1' (asan, fuzz, tsan)" >&2; return 2 ;;
  esac
}

for s in "$@"; do
  rc=0
  step "$s" || rc=$?
  if [ "$dir" = - ]; then
    [ "$rc" -eq 0 ] || exit "$rc"
  else
    echo "$rc" >"$dir/$s.rc"
  fi
done
