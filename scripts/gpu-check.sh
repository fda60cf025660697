#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU, CUDA, CMake, a compiler
# and a PyTorch 2.x wheel built for CUDA (docs/gpu.md): checks that the
# Debian packages packed on the build machine are all here
# (scripts/gpu-pack-debs.sh --check .devdeps), then runs bench/gpu/run.sh:
# builds trainctl against the wheel's LibTorch and NCCL into build-gpu/,
# runs the NCCL engine's tests, trains the MLP and the CNN through the whole
# system in fp32, bf16 and fp16 AMP next to PyTorch on the same GPU, and
# prints one table last (logs in $OUT, else ./gpu-logs).
#
# On the Debian build machine, first:
#   scripts/gpu-pack-debs.sh .devdeps && echo /.devdeps/ >> .git/info/exclude
# then on the GPU machine, from the repository root:
#   bash scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/gpu-pack-debs.sh --check .devdeps
exec bash bench/gpu/run.sh
