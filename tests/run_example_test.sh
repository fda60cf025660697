#!/usr/bin/env bash
# `trainctl run examples/mlp-synthetic.yaml` end to end: embedded
# coordinator, a worker daemon, two real trainctl-rank processes with Gloo;
# the job succeeds and its exported model runs in Python.
set -euo pipefail
build=$1 src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
out=$("$build/client/trainctl" run "$src/examples/mlp-synthetic.yaml" --set training.epochs=2 2>&1)
echo "$out"
grep -q "SUCCEEDED" <<<"$out"
grep -q "epoch 2/2 done" <<<"$out"
test -f checkpoints/mlp-synthetic/model.pt
/usr/bin/python3 -c "
import torch
m = torch.jit.load('checkpoints/mlp-synthetic/model.pt')
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
# SIGTERM cancels the job, stops its ranks and exits non-zero.
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
test "$code" -eq 1
grep -q "CANCELLED" sigterm.log
sleep 0.5
! pgrep -f "trainctl-run-.*/jobs/mlp-synthetic" >/dev/null
echo "run_example_test: ok"
