#!/usr/bin/env bash
# `trainctl run examples/mlp-synthetic.yaml` end to end: embedded
# coordinator, a worker daemon, two real trainctl-rank processes with Gloo;
# the job succeeds and its exported model runs in Python.
set -euo pipefail
build=$1 src=$2
# The usual umask of a login shell: what a run creates must be private
# anyway (issue #45 item 5), as a cluster's files are.
umask 022
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
# Runs are kept under the runs directory: this test's own.
export TRAINCTL_RUNS_DIR="$work/runs"
out=$("$build/client/trainctl" run "$src/examples/mlp-synthetic.yaml" --set training.epochs=2 \
  --set tensorboard.enabled=true 2>&1)
echo "$out"
grep -q "SUCCEEDED" <<<"$out"
grep -q "epoch 2/2 done" <<<"$out"
# The model lands in a directory of the job's own, named for the job:
# checkpoints/<name>/<job id>/<job id>.model.pt.
model=$(sed -n 's/^final model: \([^ ]*\) (.*/\1/p' <<<"$out")
job=$(sed -n 's/^submitted job \(.*\)$/\1/p' <<<"$out")
test "$model" = "$PWD/checkpoints/mlp-synthetic/$job/$job.model.pt"
test -f "$model"
# The run is kept: listed by `trainctl runs`, and its metrics, logs and
# description read back with --run, nothing started by hand.
runs=$("$build/client/trainctl" runs)
echo "$runs"
grep -q -- "-mlp-synthetic *$job *SUCCEEDED" <<<"$runs"
csv=$("$build/client/trainctl" metrics --run latest -o csv)
head -3 <<<"$csv"
grep -q "^attempt,rank,kind,epoch,step,loss" <<<"$csv"
test "$(grep -c ',eval,2,' <<<"$csv")" -ge 1
run_name=$(ls "$TRAINCTL_RUNS_DIR")
"$build/client/trainctl" describe --run "$run_name" | grep -q "$job"
"$build/client/trainctl" logs --run "$TRAINCTL_RUNS_DIR/$run_name" "$job" --tail 5 | grep -q .
/usr/bin/python3 -c "
import torch
m = torch.jit.load('$model')
y = m(torch.randn(4, 5))
assert tuple(y.shape) == (4, 2), y.shape
print('model.pt runs in Python:', tuple(y.shape))
"
# A bad file is refused before anything starts, with file:line:col.
printf 'name: x\nworld_size: -1\nmodel: {name: mlp, input_dim: 5, classes: 2}\ndata: {train: {format: synthetic, length: 10, size: 5, classes: 2}}\n' > bad.yaml
set +e
err=$("$build/client/trainctl" run bad.yaml 2>&1)
code=$?
set -e
echo "$err"
test "$code" -eq 2
grep -q "bad.yaml:2:13: world_size: must be > 0, got -1" <<<"$err"
# SIGTERM cancels the job, stops its ranks and exits 143 (128 + SIGTERM).
"$build/client/trainctl" run "$src/examples/mlp-synthetic.yaml" --set training.epochs=1000 \
  --set metrics.every_steps=1000 > sigterm.log 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "running" sigterm.log && break; sleep 0.1; done
kill -TERM "$pid"
set +e
wait "$pid"
code=$?
set -e
cat sigterm.log
test "$code" -eq 143
grep -q "CANCELLED" sigterm.log
sleep 0.5
! pgrep -f "$TRAINCTL_RUNS_DIR/.*/jobs/mlp-synthetic" >/dev/null
# Ctrl-C after a checkpoint exits 130 (128 + SIGINT, as `submit --follow`
# does: issue #44 item 10), prints the command that continues the run, and
# that command resumes from the checkpoint and finishes.
"$build/client/trainctl" run "$src/examples/mlp-synthetic.yaml" --set training.epochs=4 \
  --set data.train.length=200000 > interrupted.log 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "checkpoint at epoch 1" interrupted.log && break; sleep 0.1; done
kill -INT "$pid"
set +e
wait "$pid"
code=$?
set -e
cat interrupted.log
test "$code" -eq 130
grep -q "continue from the last checkpoint with:" interrupted.log
resume=$(grep -A1 "continue from the last checkpoint with:" interrupted.log | tail -1)
grep -q -- "--state-dir .* --resume mlp-synthetic-" <<<"$resume"
out=$(eval "${resume/trainctl/\"$build/client/trainctl\"}" 2>&1)
echo "$out"
grep -q "SUCCEEDED" <<<"$out"
grep -q "resuming from the checkpoint of job" <<<"$out"
# A script's run: the checkpoint and model its trainctl.save_* calls write.
out=$("$build/client/trainctl" run --nproc-per-node 1 --python /usr/bin/python3 "$src/tests/support/script_api.py" 2>&1)
echo "$out"
grep -q "SUCCEEDED" <<<"$out"
# Everything the runs made (state, logs, checkpoints, models, TensorBoard
# files), also the database files that reading a run (--run) reopens, is
# the user's alone: no bit for group or others under umask 022.
made=$(find "$TRAINCTL_RUNS_DIR" "$work/checkpoints" -printf '%m %y %p\n')
for kind in '/state.db$' '/worker/' '\.ckpt-epoch-' '\.model\.pt$' 'tfevents' 'script-api.*\.model\.pt$' '/checkpoints$'; do
  grep -q "$kind" <<<"$made" || { echo "nothing matching $kind was made:"; echo "$made"; exit 1; }
done
open_to_others=$(find "$TRAINCTL_RUNS_DIR" "$work/checkpoints" -perm /077 -printf '%m %p\n')
if [ -n "$open_to_others" ]; then
  echo "readable by others under umask 022:"
  echo "$open_to_others"
  exit 1
fi
echo "run_example_test: ok"
