#!/usr/bin/env bash
# The README's first command on a fresh Debian 12 machine, timed: makes a
# bare Debian 12 root (`debootstrap --variant=minbase bookworm`, once,
# cached under /var/cache/trainctl-bookworm), copies it, clones this
# repository's HEAD into the copy, and runs `scripts/quickstart.sh` there as
# root: apt downloads and installs every package from the mirror (no
# package cache is shared), the build is cold (no ccache), then the example
# trains. Prints the quick start's own phase times (apt, configure+build,
# run) and the total; docs/testing.md ("The quick start") keeps the figures.
#
#   sudo bench/quickstart/run.sh            # JOBS=N: build jobs (default 2)
#
# What differs from a fresh machine: the kernel, the CPU and the network are
# this machine's (apt's time is this mirror's, over this link); the root has
# only Debian's required packages, as a minimal install has.
set -euo pipefail

self=$(readlink -f "$0")
src=$(cd "$(dirname "$self")/../.." && pwd)
if [ "$(id -u)" -ne 0 ]; then
  echo "quickstart bench: needs root (debootstrap, chroot, mounts); run it with sudo" >&2
  exit 1
fi
command -v debootstrap >/dev/null || { echo "quickstart bench: apt-get install debootstrap" >&2; exit 1; }
# Every mount below lives and dies with this private mount namespace.
if [ -z "${TRAINCTL_QS_NS:-}" ]; then
  exec env TRAINCTL_QS_NS=1 unshare --mount --propagation private bash "$self" "$@"
fi

cache=${BOOKWORM_CACHE:-/var/cache/trainctl-bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$cache"
exec 9>"$cache/lock"
flock 9
if [ ! -e "$cache/root/.complete" ]; then
  echo "quickstart bench: making a Debian 12 root (debootstrap --variant=minbase bookworm, once)"
  rm -rf "$cache/root"
  debootstrap --variant=minbase bookworm "$cache/root" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
    { tail -20 "$cache/debootstrap.log" >&2; exit 1; }
  # The security archive too, as a fresh install's sources.list has it.
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb http://deb.debian.org/debian-security bookworm-security main\n' \
    "$mirror" "$mirror" >"$cache/root/etc/apt/sources.list"
  touch "$cache/root/.complete"
fi

work=$(mktemp -d /tmp/trainctl-quickstart.XXXXXX)
root=$work/root
cleanup() {
  umount -R "$root/proc" "$root/sys" "$root/dev" "$root/tmp" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cp -a "$cache/root" "$root"
rm -f "$root/.complete"
git clone -q "$src" "$root/src"
git -C "$root/src" log -1 --format='quickstart bench: commit %h (%cs)'
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o mode=1777 tmpfs "$root/dev/shm"   # the ranks' shared-memory all-reduce
mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
cp /etc/resolv.conf "$root/etc/resolv.conf"
echo "quickstart bench: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
     "load average $(cut -d' ' -f1-3 /proc/loadavg)"
start=$SECONDS
rc=0
chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root JOBS="${JOBS:-2}" \
  bash -c 'cd /src && scripts/quickstart.sh' || rc=$?
echo "quickstart bench: wall $((SECONDS - start)) s from a bare root to the trained model, exit $rc"
exit "$rc"
