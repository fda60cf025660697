#!/usr/bin/env bash
# Two teams sharing one cluster (docs/queues.md, "A worked example"): a
# coordinator and two worker daemons of 2 CPU slots each on this host;
# queues team-a and team-b with 2 CPU slots each in cohort `lab`. Team b's
# 4-rank training job borrows team a's idle quota; team a then submits a
# 2-rank job within its own quota, so team b's job is preempted (it
# checkpoints at a step its ranks agree on), team a's job runs, and team
# b's job resumes from that checkpoint. Prints both jobs' events on one
# clock, then each job's attempts, then the usage per queue when the
# coordinator has `trainctl usage`.
#
#   examples/queues/two-teams.sh [BUILD_DIR]     (default: build; needs trainctl-rank)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$(realpath "${1:-build}")
command -v jq >/dev/null || { echo "two-teams.sh: needs jq (apt-get install jq)" >&2; exit 2; }
for b in coordinator/trainctl-coordinator worker/daemon/trainctl-worker client/trainctl worker/trainer/trainctl-rank; do
  [[ -x $build/$b ]] || { echo "two-teams.sh: $build/$b missing: build it first (scripts/quickstart.sh builds them)" >&2; exit 2; }
done
dir=$(mktemp -d /tmp/trainctl-two-teams.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

"$build/coordinator/trainctl-coordinator" --listen=127.0.0.1:0 --db="$dir/state.db" \
  --admin-token-file="$dir/admin.token" --preemption-grace-s=60 >"$dir/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 150); do grep -q "listening on " "$dir/coordinator.log" && break; sleep 0.1; done
addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$dir/coordinator.log" | head -1)
[[ -n $addr ]] || { cat "$dir/coordinator.log" >&2; exit 1; }
tc() { "$build/client/trainctl" --coordinator "$addr" --token-file "$dir/admin.token" "$@"; }

for w in w0 w1; do
  tc token create --role worker --name "$w" | tail -1 >"$dir/$w.token"
  chmod 600 "$dir/$w.token"
  "$build/worker/daemon/trainctl-worker" --coordinator="$addr" --slots=2 --work-dir="$dir/$w" \
    --address=127.0.0.1 --rank-binary="$build/worker/trainer/trainctl-rank" \
    --token-file="$dir/$w.token" >"$dir/$w.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 150); do [[ $(tc -o json workers | grep -c '"workerId"') -ge 2 ]] && break; sleep 0.1; done

tc queue create team-a --cpu 2 --cohort lab >/dev/null
tc queue create team-b --cpu 2 --cohort lab >/dev/null

# Team b: the classic example made long (2 epochs of 250 steps on 4 ranks),
# with no periodic checkpoint inside an epoch: what it resumes from is
# what the preemption wrote.
b=$(tc submit examples/mlp-synthetic.yaml --queue team-b --set world_size=4 --set training.epochs=2 \
  --set data.train.length=60000 --set model.hidden=[64] --set checkpoint.every_steps=0 |
  grep -o 'job [0-9a-z-]*' | head -1 | cut -d' ' -f2)
for _ in $(seq 600); do
  step=$(tc -o json status "$b" | jq -r '.progress.step // 0')
  [[ $step -ge 100 ]] && break
  sleep 0.1
done
# Team a: 2 ranks, within its nominal quota, which team b borrowed.
a=$(tc submit examples/mlp-synthetic.yaml --queue team-a --set world_size=2 --set training.epochs=1 |
  grep -o 'job [0-9a-z-]*' | head -1 | cut -d' ' -f2)
for j in "$a" "$b"; do
  for _ in $(seq 3000); do
    state=$(tc -o json status "$j" | jq -r '.state')
    [[ $state == JOB_STATE_SUCCEEDED || $state == JOB_STATE_FAILED || $state == JOB_STATE_CANCELLED ]] && break
    sleep 0.1
  done
done

echo "# Events of team b's job ($b) and team a's job ($a), seconds from b's submission"
{
  for j in "$b" "$a"; do
    tc -o json describe "$j" | jq -r --arg who "$([[ $j == "$a" ]] && echo a || echo b)" \
      '.events[] | [.time, $who, .type, (.attempt // 0), .message] | @tsv'
  done
} | sort | awk -F'\t' 'BEGIN { OFS = "\t" }
  { cmd = "date -d " $1 " +%s.%N"; cmd | getline t; close(cmd); if (NR == 1) t0 = t
    printf "%7.2f  %s  %-12s attempt %s  %s\n", t - t0, $2, $3, $4, $5 }'
echo
for j in "$b" "$a"; do
  tc -o json describe "$j" | jq -r '.job | "job \(.id) (\(.spec.queue)): \(.state), restarts \(.restarts // 0)",
    (.attempts[] | "  attempt \(.number): \(.state) \(.startTime) .. \(.endTime // "-")" +
      (if .preemptedFor then ", preempted for \(.preemptedFor)" else "" end) +
      (if .resume then ", resumed from global step \(.resume.globalStep) (epoch \(.resume.epoch // 0), \(.resume.epochConsumed // 0) samples into it)" else "" end))'
done
if tc usage --help >/dev/null 2>&1; then
  echo
  tc usage
fi
