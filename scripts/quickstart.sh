#!/usr/bin/env bash
# The README's first command: installs what is missing (Debian packages),
# builds, and trains the classic DDP example (examples/mlp-synthetic.yaml,
# 2 ranks) through a local coordinator, worker daemon and rank processes,
# streaming its progress. The trained model ends in
# ./checkpoints/mlp-synthetic/<job id>/<job id>.model.pt (the last line printed says where).
#
#   scripts/quickstart.sh [JOB.yaml] [--set key=value ...]
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "${JOBS:-2}" --target trainctl trainctl-rank trainctl-coordinator trainctl-worker

job=${1:-examples/mlp-synthetic.yaml}
shift || true
exec build/client/trainctl run "$job" "$@"
