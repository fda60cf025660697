#!/usr/bin/env bash
# GPU checks and benchmarks for a machine with one NVIDIA GPU (H200 in the
# project's device pool): builds trainctl against the CUDA LibTorch of the
# machine's PyTorch wheel, runs the NCCL engine's tests (world size 1), then
# trains the MLP and the CNN through the whole system (`trainctl run`, NCCL,
# world size 1) in fp32, bf16 and fp16 AMP, next to PyTorch on the same GPU,
# and prints a short table last. Full logs go to $OUT (or ./gpu-logs).
#
# Preparation on the Debian build machine (see ../shared/gpu-build.md and
# docs/gpu.md):
#   scripts/gpu-pack-debs.sh .devdeps && echo /.devdeps/ >> .git/info/exclude
# then on the GPU machine, from the repository root:
#   bash scripts/gpu-check.sh      (checks .devdeps, then runs this)
#
# Not yet run on a GPU: the first session with one should expect to fix
# paths here. Every step prints what it does; a failed step is reported in
# the table instead of stopping the script.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$PWD/gpu-logs}
mkdir -p "$out"
py=${PYTHON:-python3}
devroot=/tmp/devroot
declare -a rows

step() {  # step NAME CMD... : runs CMD, logs to $out/NAME.log, records ok/FAILED
  local name=$1; shift
  echo "== $name"
  if "$@" >"$out/$name.log" 2>&1; then rows+=("$name|ok"); else rows+=("$name|FAILED (see $name.log)"); fi
  tail -3 "$out/$name.log"
}

nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
# LibTorch as a pip user finds it: Torch_DIR from the Python installation.
torch_prefix=$($py -c 'import torch;print(torch.utils.cmake_prefix_path)')
torch_lib=$($py -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
$py -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee "$out/torch-version.txt"
# NCCL: the wheel's own (nvidia-nccl-cu*), the one libtorch_cuda loads, so one
# NCCL lives in the rank process. It ships libnccl.so.2 without the unversioned
# link find_library needs, so it is named to CMake; without the wheel's NCCL,
# CMake searches the CUDA toolkit.
nccl_dir=$($py -c 'import nvidia.nccl;print(list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
nccl_lib=""
nccl_args=()
if [ -n "$nccl_dir" ] && [ -f "$nccl_dir/include/nccl.h" ]; then
  nccl_lib=$nccl_dir/lib
  nccl_so=$(find "$nccl_lib" -maxdepth 1 -name 'libnccl.so*' | sort | head -1)
  if [ -n "$nccl_so" ]; then
    nccl_args=(-DTRAINCTL_NCCL_INCLUDE="$nccl_dir/include" -DTRAINCTL_NCCL_LIB="$nccl_so")
  fi
fi

# 1. The Debian -dev packages the machine lacks, into a private prefix.
mkdir -p "$devroot"
for f in .devdeps/*.deb; do dpkg -x "$f" "$devroot"; done
if [ ! -f "$devroot/usr/include/CLI/CLI.hpp" ]; then
  echo "run.sh: CLI11 is not in .devdeps (apt-get download libcli11-dev there); the trainctl CLI will not build"
fi
export LD_LIBRARY_PATH="$devroot/usr/lib/x86_64-linux-gnu:$torch_lib${nccl_lib:+:$nccl_lib}:${LD_LIBRARY_PATH:-}"
export PATH="$devroot/usr/bin:$PATH"

# 2. Configure and build (CUDA LibTorch; Gloo optional, NCCL glue on).
step configure cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$devroot/usr;$torch_prefix" -DTorch_DIR="$torch_prefix/Torch" \
  -DProtobuf_PROTOC_EXECUTABLE="$devroot/usr/bin/protoc" \
  -DTRAINCTL_WITH_CUDA=ON -DTRAINCTL_NCCL_TORCH_CUDA=ON "${nccl_args[@]}"
step build cmake --build build-gpu -j "$(nproc)" --target trainctl trainctl-rank trainctl-coordinator \
  trainctl-worker nccl_collectives_test

# 3. The NCCL engine (world size 1 on one GPU).
step nccl_tests build-gpu/worker/dist/nccl_collectives_test

# 4. Train through the whole system, and PyTorch on the same GPU.
bench() {  # bench NAME JOB AMP_DTYPE(-|bf16|fp16) EXTRA_SETS...
  local name=$1 job=$2 amp=$3; shift 3
  local sets=(--set world_size=1 --set device=cuda --set backend=nccl --set metrics.every_steps=50 "$@")
  if [ "$amp" != "-" ]; then sets+=(--set training.amp.enabled=true --set training.amp.dtype="$amp"); fi
  step "trainctl_$name" build-gpu/client/trainctl -o json run "$job" --gpus 0 "${sets[@]}"
  step "pytorch_$name" $py bench/gpu/pytorch_gpu.py --job "$job" --amp "$amp" "$@"
}
mlp_sets=(--set model.input_dim=256 --set 'model.hidden=[1024,1024,1024]' --set model.classes=10
          --set data.train.size=256 --set data.train.classes=10 --set data.train.length=200000
          --set data.batch_size=64 --set training.epochs=1)
for amp in - bf16 fp16; do
  bench "mlp_${amp/-/fp32}" examples/mlp-synthetic.yaml "$amp" "${mlp_sets[@]}"
  bench "cnn_${amp/-/fp32}" examples/fashion-mnist-cnn.yaml "$amp" --set training.epochs=1
done

# 5. The table: each run's steady samples/s (median of its metric windows).
echo
printf '%-22s %-28s %s\n' STEP RESULT "SAMPLES/S"
for r in "${rows[@]}"; do
  name=${r%%|*}; res=${r#*|}
  sps=$($py bench/gpu/samples_per_sec.py "$out/$name.log" 2>/dev/null || echo -)
  printf '%-22s %-28s %s\n' "$name" "$res" "$sps"
done
