#!/usr/bin/env bash
# Installs the Debian 12 packages trainctl builds and tests with; does nothing
# when every one is already installed. Idempotent; needs root (or sudo) only
# when something is missing.
set -euo pipefail

packages=(
  # build tools
  build-essential cmake ninja-build pkg-config
  # RPC and serialisation
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  # training
  libtorch-dev libgloo-dev libopenblas0-openmp
  # config, state, tests
  libyaml-cpp-dev libsqlite3-dev libgtest-dev libgmock-dev libcli11-dev
  # reference scripts, cross-language checks, real data
  python3-torch python3-grpcio python3-numpy dataset-fashion-mnist
)

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
