#!/usr/bin/env bash
# docs/operator.md, "Many workers: a release build of gRPC", as written:
# scripts/grpc-release.sh builds (or finds cached) Debian's gRPC with
# -DNDEBUG and checks it against this build's coordinator; then the README's
# cluster (readme_cluster_e2e_test: coordinator, two workers, the example
# job, every process through the same gRPC) runs with
# LD_LIBRARY_PATH pointing at it. Needs root (apt-get source); exits 77
# (skipped) otherwise. Labelled long: a cold run builds gRPC (~12 min on 2 cores).
#
#   tests/grpc_release_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
if [ "$(id -u)" -ne 0 ]; then
  echo "grpc_release_test: skipped: scripts/grpc-release.sh needs root"
  exit 77
fi
cache=${GRPC_RELEASE_CACHE:-/var/cache/trainctl-grpc-release}
TRAINCTL_COORDINATOR="$build/coordinator/trainctl-coordinator" GRPC_RELEASE_CACHE="$cache" \
  bash "$src/scripts/grpc-release.sh"
loaded=$(LD_LIBRARY_PATH="$cache/lib" ldd "$build/coordinator/trainctl-coordinator" |
         awk '$1 == "libgrpc.so.29" {print $3}')
case "$loaded" in
  "$cache"/lib/*) echo "trainctl-coordinator loads $loaded" ;;
  *) echo "grpc_release_test: trainctl-coordinator loads '$loaded', not the cache's" >&2; exit 1 ;;
esac
LD_LIBRARY_PATH="$cache/lib" TRAINCTL_SOURCE_DIR="$src" TRAINCTL_BINARY_DIR="$build" \
  "$build/tests/readme_cluster_e2e_test"
