#!/usr/bin/env bash
# Installs the Debian packages trainctl builds and tests with; does nothing
# when every one is already installed. Idempotent; needs root (or sudo) only
# when something is missing. This list is the only one: the Docker build
# stage runs this script, and scripts/test-libtorch2.sh runs it inside its
# Debian trixie root (same names on Debian 12 and 13).
#
#   scripts/install-deps.sh          # install what is missing
#   scripts/install-deps.sh --list   # print the package names, one a line
set -euo pipefail

# libFuzzer's runtime follows the distribution's clang: 14 on Debian 12,
# 19 on Debian 13 (scripts/test-libtorch2.sh's root).
case "$( (. /etc/os-release && echo "${VERSION_ID:-12}") 2>/dev/null)" in
  13) clang_rt=libclang-rt-19-dev ;;
  *) clang_rt=libclang-rt-14-dev ;;
esac

packages=(
  # build tools
  build-essential cmake ninja-build pkg-config
  # RPC and serialisation
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  # HMAC for the rank rendezvous handshake
  libssl-dev
  # the sanitizer build (clang: its thread-safety analysis) and fuzzing
  # (scripts/fuzz.sh: libFuzzer with clang)
  clang "$clang_rt"
  # training
  libtorch-dev libgloo-dev libopenblas0-openmp
  # config, state, tests
  libyaml-cpp-dev libsqlite3-dev libgtest-dev libgmock-dev libcli11-dev libssl-dev
  # the coordinator's PostgreSQL store (libpq), and the server its tests
  # start in a temporary directory (coordinator/store/pg_test_server.h)
  libpq-dev postgresql
  # /metrics endpoint (HTTP server), and the real Prometheus its test scrapes with
  libcpp-httplib-dev prometheus
  # the web dashboard: its chart library (vendored from this package's npm
  # release, coordinator/web/vendor/) and the browser its test drives
  libjs-chart.js chromium
  # wall-clock steps under libfaketime (tests/clock_e2e_test.cc)
  faketime
  # reference scripts, cross-language checks, real data
  python3-torch python3-grpcio python3-numpy dataset-fashion-mnist
  # the Python client (python/trainctl/client.py): protobuf messages, job.yaml
  python3-protobuf python3-yaml
)

if [ "${1:-}" = "--list" ]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
