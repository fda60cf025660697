#!/usr/bin/env bash
# Installs the Debian packages trainctl builds and tests with; does nothing
# when every one is already installed. Idempotent; needs root (or sudo) only
# when something is missing. These lists are the only ones: the Docker build
# stage runs this script, and scripts/test-libtorch2.sh runs it inside its
# Debian trixie root (same names on Debian 12 and 13).
#
# Two modes:
#   build  what configuring and building the four binaries (trainctl,
#          trainctl-rank, trainctl-coordinator, trainctl-worker) and running
#          the example need: the quick start (scripts/quickstart.sh)
#   test   everything (the default): build's packages and what only the
#          tests need (clang, the PostgreSQL server, Prometheus, Chromium,
#          libfaketime, the Python reference packages, the real data set):
#          scripts/test.sh, CI, the Docker build stage
#
#   scripts/install-deps.sh [build|test] [--log FILE]
#                            # install what is missing; --log: apt's output
#                            # goes to FILE (its tail is printed on failure)
#   scripts/install-deps.sh --print build|test   # the package names, one a line
#   scripts/install-deps.sh --list               # the same as --print test
set -euo pipefail

# libFuzzer's runtime follows the distribution's clang: 14 on Debian 12,
# 19 on Debian 13 (scripts/test-libtorch2.sh's root).
case "$( (. /etc/os-release && echo "${VERSION_ID:-12}") 2>/dev/null)" in
  13) clang_rt=libclang-rt-19-dev ;;
  *) clang_rt=libclang-rt-14-dev ;;
esac

# add build|test PACKAGE...: one group of the list. The full list keeps the
# order it has always had (scripts/test-libtorch2.sh makes its root again
# when `--list` prints something else); `build` groups also go to the quick
# start's list. tests/install_lists_test.sh checks that build's list is a
# subset of test's, and tests/binary_deps_test.sh that the built binaries
# load libraries of build's packages only.
all=()
build=()
add() {
  local kind=$1
  shift
  all+=("$@")
  if [ "$kind" = build ]; then build+=("$@"); fi
}
# build tools
add build build-essential cmake ninja-build pkg-config
# RPC and serialisation
add build libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
# HMAC for the rank rendezvous handshake
add build libssl-dev
# the sanitizer build (clang: its thread-safety analysis) and fuzzing
# (scripts/fuzz.sh: libFuzzer with clang)
add test clang "$clang_rt"
# training; OpenBLAS (OpenMP) as the BLAS LibTorch loads: the reference BLAS
# makes the example several times slower
add build libtorch-dev libgloo-dev libopenblas0-openmp
# config, state, tests. GoogleTest is in build's list: CMake's configure
# requires it (cmake/TrainctlDeps.cmake) and the test-support libraries are
# defined beside the code; about 1 MB of packages.
add build libyaml-cpp-dev libsqlite3-dev libgtest-dev libgmock-dev libcli11-dev libssl-dev
# the coordinator's PostgreSQL store (libpq: a client library the
# coordinator links, so the quick start's coordinator has the store too), and
# the server its tests start in a temporary directory
# (coordinator/store/pg_test_server.h)
add build libpq-dev
add test postgresql
# /metrics endpoint (HTTP server), and the real Prometheus its test scrapes with
add build libcpp-httplib-dev
add test prometheus
# the web dashboard: where its chart library comes from (vendored from this
# package's npm release, coordinator/web/vendor/; the build uses the vendored
# copy) and the browser its test drives
add test libjs-chart.js chromium
# wall-clock steps under libfaketime (tests/clock_e2e_test.cc)
add test faketime
# reference scripts, cross-language checks, real data
add test python3-torch python3-grpcio python3-numpy dataset-fashion-mnist
# the Python client (python/trainctl/client.py): protobuf messages, job.yaml
add test python3-protobuf python3-yaml
# the format check (scripts/format-check.sh: clang-format --dry-run)
add test clang-format

usage() {
  echo "usage: install-deps.sh [build|test] [--log FILE] | --print build|test | --list" >&2
  exit 2
}

mode=test
log=""
print=""
while [ $# -gt 0 ]; do
  case "$1" in
    build|test) mode=$1 ;;
    --list) print=test ;;
    --print)
      [ $# -ge 2 ] || { echo "install-deps: --print needs a mode: build or test" >&2; usage; }
      case "$2" in build|test) print=$2 ;; *) echo "install-deps: --print: unknown mode '$2' (build or test)" >&2; usage ;; esac
      shift ;;
    --log)
      [ $# -ge 2 ] && [ -n "$2" ] || { echo "install-deps: --log needs a file" >&2; usage; }
      log=$2
      shift ;;
    *) echo "install-deps: unknown argument '$1'" >&2; usage ;;
  esac
  shift
done

if [ -n "$print" ]; then
  if [ "$print" = build ]; then printf '%s\n' "${build[@]}"; else printf '%s\n' "${all[@]}"; fi
  exit 0
fi

if [ "$mode" = build ]; then packages=("${build[@]}"); else packages=("${all[@]}"); fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages ($mode) present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
if [ -z "$log" ]; then
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  exit 0
fi

# Quiet: one line here, apt's pages in the log (its tail when it fails).
echo "install-deps: installing ${#missing[@]} of ${#packages[@]} packages ($mode) and what they depend on (apt's output: $log)"
: >"$log"
if ! { $sudo apt-get update -qq && $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"; } >>"$log" 2>&1; then
  echo "install-deps: apt-get failed; the end of $log:" >&2
  tail -n 30 "$log" >&2
  exit 1
fi
