#!/usr/bin/env bash
# Builds the trainctl images with podman and smoke-tests them without a
# container engine: not part of the default CI run (it compiles the whole
# project inside the build stage: tens of minutes on 2 cores).
#
#   deploy/test-images.sh                 # base image, build both images, smoke test
#   STEPS="smoke" deploy/test-images.sh   # only re-test images already built
#   BUILD_TARGETS="trainctl-coordinator trainctl-worker trainctl-rank trainctl" \
#     deploy/test-images.sh               # compile only what the images ship
#
# What it does, for machines like CI's (root, no Docker daemon, no registry,
# containers cannot be started):
#   base   makes debian:bookworm-slim locally when it is missing: debootstrap
#          --variant=minbase bookworm, then `podman import` (Debian's mirror is
#          reachable; a registry is not).
#   build  `podman build --isolation=chroot --network=host` of the coordinator
#          and CPU worker targets of deploy/docker/Dockerfile, at nice 19, from a
#          snapshot of the source tree (the build stage is shared: one compile).
#   smoke  exports each image's filesystem (podman create + podman export) and
#          runs its binaries under chroot, as the image's non-root user: every
#          shared library resolves, --help works, a coordinator and two CPU
#          workers run examples/mlp-synthetic.yaml to SUCCEEDED with the
#          image's trainctl CLI, the HEALTHCHECK probe reports healthy, and
#          SIGTERM stops each daemon cleanly.
# The GPU image (Dockerfile.gpu) is not built here: no CUDA base image, no GPU.
#
# Environment: STEPS (default "base build smoke"), WORK (scratch, default
# /var/tmp/trainctl-images), MIRROR (Debian mirror for debootstrap), JOBS (compile
# jobs in the build stage, default 2), BUILD_TARGETS (default "all": the whole
# project, tests included), TAG (default: the project version), NICE (default 19),
# KEEP_SOURCE=1 (rebuild from the previous run's source snapshot with only
# deploy/ refreshed: after deployment-only changes nothing recompiles).
# Exit status 0 when every check passed; the last line is "N passed, N failed".
set -uo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
steps=${STEPS:-base build smoke}
work=${WORK:-/var/tmp/trainctl-images}
mirror=${MIRROR:-http://deb.debian.org/debian}
jobs=${JOBS:-2}
targets=${BUILD_TARGETS:-all}
nice_level=${NICE:-19}
version=$(sed -n 's/^project(trainctl VERSION \([0-9.]*\).*/\1/p' "$repo/CMakeLists.txt")
version=${version:-0.0.0}
tag=${TAG:-$version}
revision=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
coord_image=localhost/trainctl-coordinator:$tag
worker_image=localhost/trainctl-worker-cpu:$tag

passed=0 failed=0 skipped=0
log() { echo "[test-images $(date +%H:%M:%S)] $*"; }
pass() { passed=$((passed + 1)); log "PASS $*"; }
fail() { failed=$((failed + 1)); log "FAIL $*"; }
skip() { skipped=$((skipped + 1)); log "SKIP $*"; }
has_step() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }
summary() {
  log "summary: images $coord_image, $worker_image; logs under $work"
  echo "$passed passed, $failed failed, $skipped skipped"
  [ "$failed" -eq 0 ]
}

if ! command -v podman >/dev/null; then
  log "podman is not installed (apt-get install podman); nothing tested"
  skipped=1; summary; exit 0
fi
mkdir -p "$work"

# ---- base: debian:bookworm-slim without a registry ---------------------------
if has_step base; then
  if podman image exists debian:bookworm-slim; then
    pass "base: debian:bookworm-slim already present"
  elif ! command -v debootstrap >/dev/null; then
    fail "base: debian:bookworm-slim missing and debootstrap not installed (apt-get install debootstrap)"
  else
    root=$work/rootfs
    if [ ! -x "$root/usr/bin/apt-get" ]; then
      rm -rf "$root"
      log "debootstrap --variant=minbase bookworm ($mirror)"
      nice -n "$nice_level" debootstrap --variant=minbase bookworm "$root" "$mirror" > "$work/debootstrap.log" 2>&1 \
        || { fail "base: debootstrap (see $work/debootstrap.log)"; summary; exit 1; }
    fi
    # The same apt sources as Docker Hub's image: main, updates and security.
    rm -f "$root/etc/apt/sources.list"
    cat > "$root/etc/apt/sources.list.d/debian.sources" <<SRC
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    if tar -C "$root" -c . | podman import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["bash"]' - debian:bookworm-slim > "$work/import.log" 2>&1; then
      pass "base: debian:bookworm-slim imported from debootstrap"
    else
      fail "base: podman import (see $work/import.log)"
    fi
  fi
fi

# ---- build: both CPU targets from one source snapshot --------------------------
if has_step build; then
  ctx=$work/context
  if [ -n "${KEEP_SOURCE:-}" ] && [ -d "$ctx/worker" ]; then
    # Deployment-only changes: refresh deploy/, keep the sources (layer cache hits).
    rm -rf "$ctx/deploy"
    (cd "$repo" && tar -c deploy) | tar -x -C "$ctx"
    log "KEEP_SOURCE: reusing the source snapshot in $ctx, deploy/ refreshed"
  else
    rm -rf "$ctx"; mkdir -p "$ctx"
    # Only what the Dockerfile copies: build trees and .git stay out.
    (cd "$repo" && tar -c CMakeLists.txt cmake proto common coordinator worker client tests examples scripts deploy) \
      | tar -x -C "$ctx"
    log "source snapshot in $ctx (revision $revision plus working-tree changes)"
  fi
  for target in coordinator worker; do
    image=$coord_image; [ "$target" = worker ] && image=$worker_image
    log "podman build --target $target -> $image (BUILD_TARGETS=$targets, JOBS=$jobs); log: $work/build-$target.log"
    start=$(date +%s)
    # --format docker: the OCI format has no HEALTHCHECK (Docker's builds keep it).
    if nice -n "$nice_level" podman build --isolation=chroot --network=host --layers --format docker \
        -f "$ctx/deploy/docker/Dockerfile" --target "$target" \
        --build-arg VERSION="$version" --build-arg REVISION="$revision" \
        --build-arg JOBS="$jobs" --build-arg BUILD_TARGETS="$targets" \
        -t "$image" "$ctx" > "$work/build-$target.log" 2>&1; then
      pass "build: $image in $(( $(date +%s) - start ))s, $(podman image inspect --format '{{.Size}}' "$image" | awk '{printf "%.0f MB", $1/1e6}')"
    else
      fail "build: $image (tail of $work/build-$target.log follows)"
      tail -n 30 "$work/build-$target.log"
    fi
  done
  grep -h 'stage-binaries:' "$work"/build-*.log 2>/dev/null | sort -u | sed 's/^/  /'
fi

# ---- smoke: the images' filesystems under chroot -------------------------------
export_image() {  # image dir
  local cid
  rm -rf "$2"; mkdir -p "$2"
  cid=$(podman create --no-healthcheck "$1") || return 1
  podman export "$cid" | tar -x -C "$2"
  local rc=$?
  podman rm "$cid" >/dev/null
  return $rc
}

# Runs a command inside a rootfs as the image's user (uid 10001), with /dev and
# /proc mounted in a private mount namespace that disappears with it. With
# PIDFILE set, the pid that becomes the command is written there.
in_root() {  # rootfs user cmd...
  local root=$1 user=$2; shift 2
  unshare -m bash -c 'r=$1; u=$2; shift 2
    mount --bind /dev "$r/dev" && mount -t proc proc "$r/proc" || exit 125
    if [ -n "${PIDFILE:-}" ]; then echo $$ > "$PIDFILE"; fi
    exec chroot --userspec="$u" "$r" env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/var/lib/trainctl "$@"' \
    in_root "$root" "$user" "$@"
}
export -f in_root

start_bg() {  # name rootfs user cmd... ; sets bg_job and bg_pid
  local name=$1; shift
  rm -f "$work/$name.pid"
  PIDFILE=$work/$name.pid in_root "$@" > "$work/$name.log" 2>&1 &
  bg_job=$!
  for _ in $(seq 1 50); do [ -s "$work/$name.pid" ] && break; sleep 0.1; done
  bg_pid=$(cat "$work/$name.pid" 2>/dev/null)
  pids+=("$bg_pid")
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

if has_step smoke; then
  pids=()
  cleanup() { for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done; }
  trap cleanup EXIT
  croot=$work/root-coordinator wroot=$work/root-worker
  ok_images=1
  for pair in "$coord_image:$croot" "$worker_image:$wroot"; do
    image=${pair%:*}; dir=${pair##*:}
    if ! podman image exists "$image"; then fail "smoke: $image not built"; ok_images=0; continue; fi
    if export_image "$image" "$dir"; then pass "smoke: exported $image"; else fail "smoke: export $image"; ok_images=0; fi
  done
  if [ "$ok_images" = 1 ]; then
    for pair in "$coord_image:$croot" "$worker_image:$wroot"; do
      image=${pair%:*}; dir=${pair##*:}
      # Labels, user, entrypoint, healthcheck as built.
      log "$image: $(podman image inspect --format 'user={{.Config.User}} entrypoint={{.Config.Entrypoint}} cmd={{.Config.Cmd}} volumes={{.Config.Volumes}} version={{index .Config.Labels "org.opencontainers.image.version"}}' "$image")"
      health=$(podman image inspect --format '{{if .Config.Healthcheck}}{{join .Config.Healthcheck.Test " "}}{{end}}' "$image" 2>/dev/null)
      user=$(podman image inspect --format '{{.Config.User}}' "$image")
      if [ -n "$health" ]; then pass "smoke: $image: HEALTHCHECK $health"; else fail "smoke: $image: no HEALTHCHECK in the image config"; fi
      if [ -n "$user" ] && [ "$user" != root ] && [ "$user" != 0 ]; then pass "smoke: $image: runs as user $user"; else fail "smoke: $image: runs as root"; fi
      missing=$(in_root "$dir" 10001:10001 sh -c 'for f in /usr/local/bin/*; do head -c4 "$f" | grep -q ELF && ldd "$f"; done' 2>&1 | grep 'not found')
      if [ -z "$missing" ]; then pass "smoke: $image: every shared library resolves"; else fail "smoke: $image: missing libraries: $missing"; fi
      for b in "$dir"/usr/local/bin/trainctl*; do
        name=${b##*/}
        [ "$name" = trainctl-healthcheck ] && continue
        # --help exits 0 (absl's --helpfull 1) and trainctl-rank answers usage with 2: any of
        # those is fine; a loader error (127) or a crash is not.
        in_root "$dir" 10001:10001 "$name" --help > "$work/help-$name.log" 2>&1; rc=$?
        if [ "$rc" -le 2 ] && grep -q "$name" "$work/help-$name.log" \
           && ! grep -q 'error while loading shared libraries' "$work/help-$name.log"; then
          pass "smoke: $image: $name --help (exit $rc): $(head -n 1 "$work/help-$name.log" | cut -c1-70)"
        else
          fail "smoke: $image: $name --help exit $rc (see $work/help-$name.log)"
        fi
      done
    done

    # A cluster: coordinator from its image, two CPU workers from theirs, each
    # started through its image's ENTRYPOINT (tini) so SIGTERM takes the same
    # path as in a container; health checked with the images' own HEALTHCHECK.
    entry_c=$(podman image inspect --format '{{join .Config.Entrypoint " "}}' "$coord_image")
    entry_w=$(podman image inspect --format '{{join .Config.Entrypoint " "}}' "$worker_image")
    health_c=$(podman image inspect --format '{{if .Config.Healthcheck}}{{join .Config.Healthcheck.Test " "}}{{end}}' "$coord_image" | sed 's/^CMD //; s/^CMD-SHELL //')
    health_w=$(podman image inspect --format '{{if .Config.Healthcheck}}{{join .Config.Healthcheck.Test " "}}{{end}}' "$worker_image" | sed 's/^CMD //; s/^CMD-SHELL //')
    health_c=${health_c:-trainctl-healthcheck} health_w=${health_w:-trainctl-healthcheck --worker}
    port=$(free_port)
    install -d -o 10001 -g 10001 "$wroot/var/lib/trainctl/w1" "$wroot/var/lib/trainctl/w2"
    rm -rf "$croot"/var/lib/trainctl/trainctl.db* "$croot"/var/lib/trainctl/tls
    # TLS and tokens, as deployed: init makes the CA, certificates and tokens;
    # each worker gets ca.crt and its own one-time join token (it joins on
    # its first start), the CLI the CA and admin token.
    if in_root "$croot" 10001:10001 trainctl-coordinator init --dir=/var/lib/trainctl/tls \
         --db=/var/lib/trainctl/trainctl.db --join-tokens=2 > "$work/init.log" 2>&1; then
      pass "smoke: trainctl-coordinator init"
    else
      fail "smoke: trainctl-coordinator init (see $work/init.log)"
    fi
    for f in ca.crt join-1.token join-2.token; do
      install -o 10001 -g 10001 -m 0600 "$croot/var/lib/trainctl/tls/$f" "$wroot/var/lib/trainctl/$f"
    done
    admin_token=$(cat "$croot/var/lib/trainctl/tls/admin.token")
    tls_cli=(--ca=/var/lib/trainctl/tls/ca.crt --token="$admin_token")
    # shellcheck disable=SC2086  # the entrypoint is words
    start_bg coordinator "$croot" 10001:10001 $entry_c trainctl-coordinator --listen=127.0.0.1:"$port" \
      --db=/var/lib/trainctl/trainctl.db --tls-dir=/var/lib/trainctl/tls
    cjob=$bg_job cpid=$bg_pid
    up=0
    for _ in $(seq 1 50); do grep -q 'listening on' "$work/coordinator.log" && { up=1; break; }; sleep 0.2; done
    if [ "$up" = 1 ]; then pass "smoke: coordinator listening on 127.0.0.1:$port"; else fail "smoke: coordinator did not start (see $work/coordinator.log)"; fi
    # shellcheck disable=SC2086
    if in_root "$croot" 10001:10001 env TRAINCTL_HEALTH_ADDRESS=127.0.0.1:"$port" TRAINCTL_CA=/var/lib/trainctl/tls/ca.crt $health_c > "$work/health.log" 2>&1; then
      pass "smoke: coordinator HEALTHCHECK ($health_c): $(cat "$work/health.log")"
    else
      fail "smoke: coordinator HEALTHCHECK ($health_c): $(cat "$work/health.log")"
    fi
    wpids=() wjobs=()
    for w in 1 2; do
      # shellcheck disable=SC2086
      start_bg worker-$w "$wroot" 10001:10001 $entry_w trainctl-worker --coordinator=127.0.0.1:"$port" --slots=1 \
        --address=127.0.0.1 --work-dir=/var/lib/trainctl/w$w \
        --ca=/var/lib/trainctl/ca.crt --join-token-file=/var/lib/trainctl/join-$w.token
      wpids+=("$bg_pid") wjobs+=("$bg_job")
    done
    sleep 3
    # shellcheck disable=SC2086
    if in_root "$wroot" 10001:10001 env TRAINCTL_COORDINATOR=127.0.0.1:"$port" TRAINCTL_CA=/var/lib/trainctl/ca.crt $health_w > "$work/health-worker.log" 2>&1; then
      pass "smoke: worker HEALTHCHECK ($health_w): $(cat "$work/health-worker.log")"
    else
      fail "smoke: worker HEALTHCHECK ($health_w): $(cat "$work/health-worker.log")"
    fi
    if [ -x "$croot/usr/local/bin/trainctl" ] && [ -x "$wroot/usr/local/bin/trainctl-rank" ]; then
      in_root "$croot" 10001:10001 trainctl --coordinator=127.0.0.1:"$port" "${tls_cli[@]}" workers > "$work/workers.log" 2>&1
      sed 's/^/  /' "$work/workers.log"
      start=$(date +%s)
      if timeout 600 bash -c 'in_root "$@"' _ "$croot" 10001:10001 trainctl --coordinator=127.0.0.1:"$port" "${tls_cli[@]}" \
          submit /usr/local/share/trainctl/examples/mlp-synthetic.yaml --follow > "$work/submit.log" 2>&1 \
         && grep -qi 'succeeded' "$work/submit.log"; then
        pass "smoke: mlp-synthetic (2 ranks on 2 CPU workers) SUCCEEDED in $(( $(date +%s) - start ))s"
      else
        fail "smoke: mlp-synthetic did not succeed (see $work/submit.log, worker-*.log)"
      fi
      tail -n 8 "$work/submit.log" | sed 's/^/  /'
    else
      skip "smoke: job run (trainctl CLI or trainctl-rank missing from the images)"
    fi
    # SIGTERM to PID 1 (tini): workers leave cleanly, then the coordinator shuts down.
    names=(worker-1 worker-2 coordinator)
    all_pids=("${wpids[@]}" "$cpid") all_jobs=("${wjobs[@]}" "$cjob")
    for i in 0 1 2; do
      p=${all_pids[$i]}
      kill -TERM "$p" 2>/dev/null
      for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
      if kill -0 "$p" 2>/dev/null; then fail "smoke: ${names[$i]} ignored SIGTERM for 20s"
      else wait "${all_jobs[$i]}"; rc=$?
        if [ "$rc" = 0 ]; then pass "smoke: ${names[$i]}: SIGTERM -> clean exit"; else fail "smoke: ${names[$i]}: SIGTERM -> exit $rc"; fi
      fi
    done
  fi
fi
summary
