#!/usr/bin/env bash
# Builds trainctl against LibTorch 2.x and runs its tests there: a Debian
# trixie root (libtorch-dev 2.6, python3-torch 2.6, gcc 14, abseil 20240722,
# gRPC 1.51) made with `debootstrap --variant=minbase`, the same package list
# as Debian 12 (scripts/install-deps.sh, run inside the root), this checkout
# bind-mounted at /src and built into build-trixie/ (git-ignored).
#
#   sudo scripts/test-libtorch2.sh               # build everything, run the suite (-LE long)
#   sudo scripts/test-libtorch2.sh --torch-only  # the LibTorch-dependent targets and the
#                                                # engine/dist/trainer/e2e tests only
#   sudo scripts/test-libtorch2.sh --torch-libs  # only the LibTorch libraries, trainctl-rank
#                                                # and their tests (engine/dist/trainer; CI)
#   sudo scripts/test-libtorch2.sh --prepare     # only make (or check) the cached root
#   sudo scripts/test-libtorch2.sh --build-libs  # the root, then --torch-libs' build without its
#                                                # tests (scripts/test.sh runs it in the background)
#   scripts/test.sh                              # the main suite, then --torch-libs
#                                                # (CI; the root made in the background)
#
# Needs root (debootstrap, chroot, mounts) and the Debian mirror apt already
# uses (the first one in /etc/apt/sources.list*; DEBIAN_MIRROR overrides).
# The root is cached in $TRIXIE_CACHE (default /var/cache/trainctl-trixie,
# outside the checkout) and made again when the package list changes;
# downloaded .debs and a ccache live beside it and survive that. Everything
# heavy runs under `nice -n 19`. Mounts live in a private mount namespace, so
# nothing is left mounted however the script ends. Prints the time of each
# stage last; exits non-zero when any stage fails. One run at a time per
# cache (a lock file; a second run waits).
#
# Environment: TRIXIE_CACHE, DEBIAN_MIRROR, JOBS (2), CTEST_ARGS (-LE long),
# CCACHE_DISABLE=1 (time a build as on a machine without the cache).
#
# The CMake configure takes Torch from the root's Python
# (`torch.utils.cmake_prefix_path`), the way bench/gpu/run.sh finds the GPU
# machine's pip LibTorch.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
self="$src/scripts/test-libtorch2.sh"

scope=all
case "${1:-}" in
  --torch-only) scope=torch ;;
  --torch-libs) scope=libs ;;
  --prepare) scope=prepare ;;
  --build-libs) scope=build-libs ;;
  "") ;;
  *) echo "usage: $0 [--torch-only | --torch-libs | --prepare | --build-libs]" >&2; exit 2 ;;
esac

if [ "$(id -u)" -ne 0 ]; then
  echo "test-libtorch2: needs root (debootstrap, chroot, mounts); run it with sudo" >&2
  exit 1
fi
if ! command -v debootstrap >/dev/null; then
  echo "test-libtorch2: debootstrap not found; apt-get install debootstrap" >&2
  exit 1
fi
# Every mount below lives and dies with this private mount namespace.
if [ -z "${TRAINCTL_LIBTORCH2_NS:-}" ]; then
  exec env TRAINCTL_LIBTORCH2_NS=1 unshare --mount --propagation private bash "$self" "$@"
fi

suite=trixie
jobs=${JOBS:-2}
cache=${TRIXIE_CACHE:-/var/cache/trainctl-trixie}
root=$cache/root
build="build-trixie"               # under /src, ignored by .gitignore's /build*/
extra_packages=(ccache)            # this script's tools, not the project's

# shellcheck source=scripts/debian-source.sh
. "$src/scripts/debian-source.sh"   # debian_host_mirror
mirror=${DEBIAN_MIRROR:-$(debian_host_mirror)}

# One run at a time per cache (engineers sharing a machine share the root and
# the ccache; a second run waits here).
mkdir -p "$cache"
exec 9>"$cache/lock"
if ! flock -n 9; then
  echo "test-libtorch2: another run holds $cache/lock; waiting"
  flock 9
fi

# The root is made again when what goes into it changes.
packages=$(bash "$src/scripts/install-deps.sh" --list)
stamp=$(printf '%s\n' "debootstrap --variant=minbase $suite" "${extra_packages[@]}" "$packages" |
        sha256sum | cut -c1-16)

declare -a timings=()
summary() {
  local rc=$?
  echo
  echo "== test-libtorch2 ($suite, scope $scope): stage times"
  printf '%-14s %8s  %s\n' STAGE SECONDS RESULT
  local t
  for t in "${timings[@]}"; do
    IFS='|' read -r name secs res <<<"$t"
    printf '%-14s %8s  %s\n' "$name" "$secs" "$res"
  done
  exit "$rc"
}
trap summary EXIT

stage() {  # stage NAME CMD... : runs CMD, records its time and result; stops on failure
  local name=$1 t0=$SECONDS rc=0
  shift
  echo "== $name"
  # A subshell with its own errexit: `cmd || rc=$?` would switch errexit off
  # inside the stage's functions.
  set +e
  (set -e; "$@")
  rc=$?
  set -e
  if [ "$rc" -eq 0 ]; then
    timings+=("$name|$((SECONDS - t0))|ok")
  else
    timings+=("$name|$((SECONDS - t0))|FAILED (exit $rc)")
    exit "$rc"
  fi
}

mount_root() {  # mount_root DIR
  local r=$1
  mkdir -p "$r/src" "$r/var/cache/ccache" "$cache/apt-archives/partial" "$cache/ccache"
  mount -t proc proc "$r/proc"
  mount --rbind /sys "$r/sys"
  mount --rbind /dev "$r/dev"
  mount -t tmpfs -o mode=1777 tmpfs "$r/dev/shm"   # the ranks' shared-memory all-reduce
  mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"
  mount --bind "$src" "$r/src"
  mount --bind "$cache/apt-archives" "$r/var/cache/apt/archives"
  mount --bind "$cache/ccache" "$r/var/cache/ccache"
  cp /etc/resolv.conf "$r/etc/resolv.conf"
}

in_root() {  # in_root DIR CMD... : runs CMD in the root with a clean environment
  local r=$1
  shift
  local env=(PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin HOME=/root LANG=C.UTF-8
             DEBIAN_FRONTEND=noninteractive CCACHE_DIR=/var/cache/ccache CCACHE_BASEDIR=/src
             # What ccache needs to cache the files that use the precompiled
             # <torch/torch.h> (cmake/TorchPch.cmake; ccache's manual).
             CCACHE_SLOPPINESS=pch_defines,time_macros)
  # CCACHE_DISABLE=1: measure a build as a fresh CI machine would run it.
  if [ -n "${CCACHE_DISABLE:-}" ]; then env+=(CCACHE_DISABLE=1); fi
  chroot "$r" /usr/bin/env -i "${env[@]}" "$@"
}

make_root() {
  local new=$root.new
  rm -rf "$new"
  mkdir -p "$cache/debs"
  echo "debootstrap $suite from $mirror into $new"
  nice -n 19 debootstrap --variant=minbase --cache-dir="$cache/debs" "$suite" "$new" "$mirror"
}

install_packages() {
  local new=$root.new
  (
    mount_root "$new"
    # No service starts inside the root (postgresql's and prometheus's
    # postinst would start their daemons there): Debian's policy-rc.d.
    printf '#!/bin/sh\nexit 101\n' >"$new/usr/sbin/policy-rc.d"
    chmod 755 "$new/usr/sbin/policy-rc.d"
    # The project's list, by the project's own script, then this script's tools.
    in_root "$new" nice -n 19 bash /src/scripts/install-deps.sh
    in_root "$new" nice -n 19 apt-get install -y -qq --no-install-recommends "${extra_packages[@]}"
    umount -R "$new/proc" "$new/sys" "$new/dev" "$new/tmp" "$new/src" \
      "$new/var/cache/apt/archives" "$new/var/cache/ccache"
  )
  echo "$stamp" >"$new/.trainctl-stamp"
  rm -rf "$root"
  mv "$new" "$root"
}

if [ "$(cat "$root/.trainctl-stamp" 2>/dev/null || true)" = "$stamp" ]; then
  echo "== $suite root: cached in $root (stamp $stamp)"
else
  echo "== $suite root: making $root (package list changed or no root yet)"
  stage debootstrap make_root
  stage install install_packages
fi
if [ "$scope" = prepare ]; then exit 0; fi

mount_root "$root"
# shellcheck disable=SC2016  # expanded inside the root
in_root "$root" sh -c 'echo "libtorch: $(dpkg-query -W -f="\${Version}" libtorch-dev)," \
  "python3-torch: $(dpkg-query -W -f="\${Version}" python3-torch), $(g++ --version | head -1)"'

# Torch as a pip user finds it, with bench/gpu/run.sh's arguments: from the
# Python installation. Debian's python3-torch has no torch/share/cmake (its
# config is libtorch-dev's), so CMake ignores that Torch_DIR and finds the
# system one; the arguments are checked, the pip layout is not.
torch_prefix=$(in_root "$root" python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')

# Line tables only (-g1), as scripts/test.sh's build/: a third less compile
# time than -g (docs/testing.md); stack traces keep file and line.
configure() {
  in_root "$root" nice -n 19 cmake -S /src -B "/src/$build" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
    -DCMAKE_PREFIX_PATH="$torch_prefix" -DTorch_DIR="$torch_prefix/Torch" \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache
  grep -E '^Torch_DIR' "$src/$build/CMakeCache.txt"
}

lib_targets=(worker/engine/all worker/dist/all worker/trainer/all torch_compat_test)
torch_targets=("${lib_targets[@]}" trainctl trainctl-coordinator trainctl-worker train_e2e_test)
build_it() {
  if [ "$scope" = libs ] || [ "$scope" = build-libs ]; then
    in_root "$root" nice -n 19 cmake --build "/src/$build" -j "$jobs" --target "${lib_targets[@]}"
  elif [ "$scope" = torch ]; then
    in_root "$root" nice -n 19 cmake --build "/src/$build" -j "$jobs" --target "${torch_targets[@]}"
  else
    in_root "$root" nice -n 19 cmake --build "/src/$build" -j "$jobs"
  fi
  in_root "$root" ccache -s | grep -iE 'hits|misses' || true
}

run_tests() {
  local args=(--output-on-failure -j "$jobs")
  # shellcheck disable=SC2206
  local filter=(${CTEST_ARGS:--LE long})
  if [ "$scope" = torch ] || [ "$scope" = libs ]; then
    local d rc=0
    for d in worker/engine worker/dist worker/trainer; do
      in_root "$root" nice -n 19 ctest --test-dir "/src/$build/$d" "${args[@]}" "${filter[@]}" || rc=1
    done
    local also='^(torch_compat_test|train_e2e_test|run_example_test)$'
    if [ "$scope" = libs ]; then also='^torch_compat_test$'; fi
    in_root "$root" nice -n 19 ctest --test-dir "/src/$build" "${args[@]}" "${filter[@]}" -R "$also" || rc=1
    return "$rc"
  fi
  in_root "$root" nice -n 19 ctest --test-dir "/src/$build" "${args[@]}" "${filter[@]}"
}

stage configure configure
stage build build_it
if [ "$scope" = build-libs ]; then exit 0; fi
stage tests run_tests
echo "== LibTorch 2.x ($suite): all tests passed"
