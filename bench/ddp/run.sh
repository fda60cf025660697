#!/usr/bin/env bash
# bench/ddp: trainctl against Python PyTorch DDP on the same jobs, side by side.
#
#   bench/ddp/run.sh BUILD_DIR [--quick] [--runs N] [--only linear,mlp,cnn,scaling,buckets,malloc,hooks] [--no-write]
#
# Runs every configuration on both sides (--runs times each, default 5; 3 for the bucket sweep and malloc lines;
# median), prints a table and replaces the "## DDP: trainctl vs PyTorch"
# section of bench/RESULTS.md (not with --quick or --no-write; `--only hooks`, not in the
# default set, writes its own "## DDP communication hooks" section). Loopback only;
# bounded by a hard limit (BENCH_DDP_LIMIT_S, default 1200 s); every process
# it starts is in its own process group and is killed on exit.
# Needs /usr/bin/python3 with Debian's torch 1.13 and
# `ninja -C BUILD_DIR trainctl trainctl-rank`.
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
  sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
BUILD_DIR=$(cd "$1" && pwd); shift
HERE=$(cd "$(dirname "$0")" && pwd)
LIMIT_S=${BENCH_DDP_LIMIT_S:-1200}
[[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import torch' 2>/dev/null || {
  echo "run.sh: /usr/bin/python3 with torch is needed" >&2; exit 2; }

# `timeout` stops bench.py (TERM, then KILL 15 s later) past the limit; bench.py
# kills the process group of every run it started when it gets TERM or INT.
set +e
timeout -k 15 "$LIMIT_S" /usr/bin/python3 "$HERE/bench.py" "$BUILD_DIR" \
  --budget-s $((LIMIT_S * 95 / 100 - 300)) "$@"
RC=$?
set -e
[[ $RC -eq 124 ]] && echo "run.sh: stopped after ${LIMIT_S} s" >&2
exit "$RC"
