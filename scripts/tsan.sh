#!/usr/bin/env bash
# ThreadSanitizer stage: builds trainctl with clang -fsanitize=thread (no
# LibTorch, as the ASan build) into build-tsan/ and runs its tests with
# Debian's shared abseil swapped (an RPATH) for an instrumented build of the
# same source (scripts/tsan-abseil.sh, cached under /var/cache), so that TSan sees
# absl::Mutex in trainctl and in Debian's gRPC alike. gRPC's and protobuf's
# own memory accesses stay uninstrumented: they neither report nor hide
# races in trainctl's code.
#
#   sudo scripts/tsan.sh              # everything: abseil (cached), build, tests (-LE long)
#   TSAN_TESTS='daemon|session' sudo scripts/tsan.sh   # only the tests matching a ctest -R regex
#   TSAN_EXCLUDE='e2e' sudo scripts/tsan.sh            # all but those matching a ctest -E regex
#   (with either, only the selected tests' targets are built)
#   TSAN_BUILD_ONLY=1 sudo scripts/tsan.sh      # abseil and the build, no tests
#   scripts/test.sh runs this stage with its TSAN_EXCLUDE (SKIP_TSAN=1 skips it;
#   it builds ahead in the background with TSAN_BUILD_ONLY=1)
#
# Every process of the tests (coordinators, workers and CLIs they start
# too) runs with TSAN_OPTIONS halt_on_error=1 and writes its reports under
# build-tsan/tsan-reports/; the stage fails when a test fails or any report
# was written (a child's race fails the stage even when its test did not
# notice). Known, explained reports are suppressed in scripts/tsan.supp,
# each entry with its reason.
#
# Needs root the first time (apt-get source for abseil); JOBS (2).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"
jobs=${JOBS:-2}
build=build-tsan
cache=${TSAN_CACHE:-/var/cache/trainctl-tsan-abseil}
declare -a timings=()

stage() {  # stage NAME CMD... : runs CMD and records its time
  local name=$1 t0=$SECONDS
  shift
  echo "== tsan: $name"
  "$@"
  timings+=("$name $((SECONDS - t0)) s")
}

summary() {
  local rc=$?
  echo "== tsan: stage times: ${timings[*]:-none}"
  exit "$rc"
}
trap summary EXIT

abseil() { TSAN_CACHE="$cache" bash scripts/tsan-abseil.sh; }

# ctest's selection: TSAN_TESTS (a -R regex) and TSAN_EXCLUDE (a -E regex).
selection() {
  local f=(-LE long)
  if [ -n "${TSAN_TESTS:-}" ]; then f+=(-R "$TSAN_TESTS"); fi
  if [ -n "${TSAN_EXCLUDE:-}" ]; then f+=(-E "$TSAN_EXCLUDE"); fi
  printf '%s\n' "${f[@]}"
}

configure_and_build() {
  # Line tables only: what a report's stack needs, less compile time than -g.
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DTRAINCTL_TSAN=ON \
    -DCMAKE_CXX_FLAGS_DEBUG=-gline-tables-only \
    -DTRAINCTL_TSAN_ABSEIL="$cache/lib" >/dev/null
  if [ -z "${TSAN_TESTS:-}${TSAN_EXCLUDE:-}" ]; then
    cmake --build "$build" -j "$jobs"
    return
  fi
  # Only the selected tests' targets (a test is named as its executable;
  # a test that runs a script has no target of its own).
  local sel targets
  mapfile -t sel < <(selection)
  targets=$(comm -12 <(ctest --test-dir "$build" -N "${sel[@]}" | awk '/Test +#/{print $3}' | sort) \
                     <(ninja -C "$build" -t targets all | sed 's/:.*//' | sort))
  # shellcheck disable=SC2086  # one target per word
  cmake --build "$build" -j "$jobs" --target $targets
}

run_tests() {
  local reports="$src/$build/tsan-reports"
  rm -rf "$reports"
  mkdir -p "$reports"
  local filter
  mapfile -t filter < <(selection)
  local rc=0
  # The binaries find the instrumented abseil through their RPATH
  # (TRAINCTL_TSAN_ABSEIL): no LD_LIBRARY_PATH, which would break the
  # uninstrumented programs the tests start.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$src/scripts/tsan.supp log_path=$reports/report" \
    ctest --test-dir "$build" --output-on-failure -j "$jobs" "${filter[@]}" || rc=$?
  if compgen -G "$reports/report*" >/dev/null; then
    echo "tsan: ThreadSanitizer reports (each process's, also those whose test passed):"
    for f in "$reports"/report*; do
      echo "---- $f"
      head -80 "$f"
    done
    rc=1
  fi
  return "$rc"
}

stage abseil abseil
stage build configure_and_build
if [ -n "${TSAN_BUILD_ONLY:-}" ]; then exit 0; fi
stage tests run_tests
echo "== tsan: no race reported"
