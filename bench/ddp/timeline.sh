#!/usr/bin/env bash
# bench/ddp timeline: where a 2-rank DDP step's time goes (issue #49).
#
#   bench/ddp/timeline.sh BUILD_DIR [--no-write] [--modes 1rank,shm,tcp] [--runs N] [--skip-steps N] [--bucket-mb MB]
#                         [--before OTHER_BUILD_DIR --before-label TEXT]
#
# Candidate modes to measure beside those: pair (two 1-rank jobs at once, no
# communication: what sharing the 2 cores alone costs), 1rank-copy, shm-copy, tcp-copy
# (ddp.gradient_as_bucket_view: false), shm-b1, tcp-b1 (bucket_cap_mb 1),
# shm-late, tcp-late (TRAINCTL_DDP_LAUNCH_AFTER_BACKWARD=1: no overlap with
# backward); with --before, 1rank@before, shm@before, tcp@before (and the
# -late ones) run OTHER_BUILD_DIR's binaries with their defaults, e.g.
# main's before a change, in the same run; their exposed communication is
# against 1rank@before.
# Runs run.sh's MLP configuration (bench.py's job file and step count) once per
# mode with TRAINCTL_COMM_TIMELINE set: 1 rank, 2 ranks over shared memory, 2
# ranks over TCP (TRAINCTL_SHM=0). Prints per mode each bucket's ready /
# issued / reduce start / reduce end / waited times (ms after backward
# started), the step's parts and the exposed communication, and replaces the
# "## DDP step timeline" section of bench/RESULTS.md (not with --no-write).
# Bounded by BENCH_DDP_LIMIT_S (default 600 s). Needs
# `ninja -C BUILD_DIR trainctl trainctl-rank`.
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
BUILD_DIR=$(cd "$1" && pwd); shift
HERE=$(cd "$(dirname "$0")" && pwd)
LIMIT_S=${BENCH_DDP_LIMIT_S:-600}
set +e
timeout -k 15 "$LIMIT_S" /usr/bin/python3 "$HERE/timeline.py" "$BUILD_DIR" "$@"
RC=$?
set -e
[[ $RC -eq 124 ]] && echo "timeline.sh: stopped after ${LIMIT_S} s" >&2
exit "$RC"
