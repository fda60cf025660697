#!/usr/bin/env bash
# Installs trainctl from a CMake build directory: the binaries, the systemd
# units (with their paths filled in), the sysusers.d entry for the ranks'
# user, example configuration for /etc/trainctl/, the deployment docs, and
# the `trainctl` Python module where Debian's python3 finds it.
# Works into a staging root (DESTDIR) for packaging or images. It never
# overwrites configuration that is already there, never enables or starts a
# unit, and only reloads systemd when installing into the live system.
#
#   deploy/install.sh --build-dir build                       # into /usr/local and /etc
#   deploy/install.sh --build-dir build --destdir /tmp/root --prefix /usr
#   deploy/install.sh --build-dir build --destdir /out --binaries-only --strip
#
# Options (each also read from the environment variable in brackets):
#   --build-dir DIR   build tree holding the binaries [BUILD_DIR]   (default: build)
#   --prefix DIR      installation prefix [PREFIX]                  (default: /usr/local)
#   --destdir DIR     staging root prepended to every path [DESTDIR] (default: none)
#   --sysconfdir DIR  configuration root [SYSCONFDIR]               (default: /etc)
#   --unitdir DIR     systemd unit directory [UNITDIR]  (default: PREFIX/lib/systemd/system
#                     for /usr and /usr/local, else /etc/systemd/system)
#   --sysusersdir DIR sysusers.d directory [SYSUSERSDIR] (default: PREFIX/lib/sysusers.d
#                     for /usr and /usr/local, else /etc/sysusers.d)
#   --strip           strip the installed binaries
#   --binaries-only   install only the binaries (images use this)
#   --no-activate     never run systemd-sysusers / systemctl daemon-reload (they
#                     run only without DESTDIR on a host booted with systemd)
#   -h, --help
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)

build_dir=${BUILD_DIR:-build}
prefix=${PREFIX:-/usr/local}
destdir=${DESTDIR:-}
sysconfdir=${SYSCONFDIR:-/etc}
unitdir=${UNITDIR:-}
sysusersdir=${SYSUSERSDIR:-}
strip=0
binaries_only=0
activate=1

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "install.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) build_dir=${2:?--build-dir needs a value}; shift 2 ;;
    --build-dir=*) build_dir=${1#*=}; shift ;;
    --prefix) prefix=${2:?--prefix needs a value}; shift 2 ;;
    --prefix=*) prefix=${1#*=}; shift ;;
    --destdir) destdir=${2:?--destdir needs a value}; shift 2 ;;
    --destdir=*) destdir=${1#*=}; shift ;;
    --sysconfdir) sysconfdir=${2:?--sysconfdir needs a value}; shift 2 ;;
    --sysconfdir=*) sysconfdir=${1#*=}; shift ;;
    --unitdir) unitdir=${2:?--unitdir needs a value}; shift 2 ;;
    --unitdir=*) unitdir=${1#*=}; shift ;;
    --sysusersdir) sysusersdir=${2:?--sysusersdir needs a value}; shift 2 ;;
    --sysusersdir=*) sysusersdir=${1#*=}; shift ;;
    --strip) strip=1; shift ;;
    --no-activate) activate=0; shift ;;
    --binaries-only) binaries_only=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

case "$prefix" in /*) ;; *) die "--prefix must be an absolute path, got '$prefix'" ;; esac
case "$sysconfdir" in /*) ;; *) die "--sysconfdir must be an absolute path, got '$sysconfdir'" ;; esac
[ -d "$build_dir" ] || die "build directory '$build_dir' does not exist (build first: cmake -S . -B build -G Ninja && cmake --build build)"
if [ -z "$unitdir" ]; then
  case "$prefix" in
    /usr|/usr/local) unitdir=$prefix/lib/systemd/system ;;
    *) unitdir=/etc/systemd/system ;;
  esac
fi
destdir=${destdir%/}
bindir=$prefix/bin
confdir=$sysconfdir/trainctl
docdir=$prefix/share/doc/trainctl
if [ -z "$sysusersdir" ]; then
  case "$prefix" in
    /usr|/usr/local) sysusersdir=$prefix/lib/sysusers.d ;;
    *) sysusersdir=/etc/sysusers.d ;;
  esac
fi

# Finds a built executable by name anywhere in the build tree (the layout of
# build outputs belongs to the CMake files, not to this script).
find_binary() {
  find "$build_dir" -path '*/CMakeFiles' -prune -o -type f -name "$1" -perm -u+x -print 2>/dev/null | head -n 1
}

say() { echo "install.sh: $*"; }

# ---- binaries -------------------------------------------------------------
install -d -m 0755 "$destdir$bindir"
for name in trainctl-coordinator trainctl-worker trainctl-rank trainctl; do
  src=$(find_binary "$name")
  if [ -z "$src" ]; then
    case "$name" in
      trainctl-coordinator|trainctl-worker) die "$name not found under $build_dir" ;;
      trainctl-rank) say "warning: trainctl-rank not found under $build_dir (needs the LibTorch build); workers cannot run ranks without it" ;;
      *) say "warning: $name not found under $build_dir; skipped" ;;
    esac
    continue
  fi
  install -m 0755 "$src" "$destdir$bindir/$name"
  if [ "$strip" = 1 ]; then strip --strip-unneeded "$destdir$bindir/$name"; fi
  say "$destdir$bindir/$name"
done

# ---- the trainctl Python module (command jobs report progress with it) ------
# Where Debian's python3 finds it: /usr/lib/python3/dist-packages for /usr,
# /usr/local/lib/python3.X/dist-packages for /usr/local.
case "$prefix" in
  /usr) pydir=/usr/lib/python3/dist-packages ;;
  *)
    pyver=$( (/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) || echo 3)
    pydir=$prefix/lib/python$pyver/dist-packages ;;
esac
if [ -f "$repo/python/trainctl/__init__.py" ]; then
  install -d -m 0755 "$destdir$pydir/trainctl"
  install -m 0644 "$repo/python/trainctl/__init__.py" "$destdir$pydir/trainctl/__init__.py"
  say "$destdir$pydir/trainctl/__init__.py"
  # The command ranks' start-up hook (docs/failures.md#hangs-in-your-own-script-command-jobs):
  # a worker installed under /usr puts this directory first on their PYTHONPATH.
  install -d -m 0755 "$destdir$pydir/trainctl/_rank_boot"
  install -m 0644 "$repo/python/trainctl/_rank_boot/sitecustomize.py" "$destdir$pydir/trainctl/_rank_boot/sitecustomize.py"
  say "$destdir$pydir/trainctl/_rank_boot/sitecustomize.py"
else
  say "warning: python/trainctl not found beside this script; the trainctl Python module is not installed"
fi

[ "$binaries_only" = 1 ] && exit 0

# ---- systemd units and the ranks' system user ----------------------------
install -d -m 0755 "$destdir$unitdir" "$destdir$sysusersdir"
for unit in trainctl-coordinator.service trainctl-worker.service; do
  sed -e "s|@BINDIR@|$bindir|g" -e "s|@CONFDIR@|$confdir|g" -e "s|@DOCDIR@|$docdir|g" \
    "$here/systemd/$unit" > "$destdir$unitdir/$unit"
  chmod 0644 "$destdir$unitdir/$unit"
  say "$destdir$unitdir/$unit"
done
install -m 0644 "$here/systemd/trainctl.sysusers" "$destdir$sysusersdir/trainctl.conf"
say "$destdir$sysusersdir/trainctl.conf"

# ---- configuration: examples always, live files only when absent -----------
install -d -m 0755 "$destdir$confdir" "$destdir$docdir/examples"
for env in coordinator.env worker.env; do
  install -m 0644 "$here/config/$env" "$destdir$docdir/examples/$env"
  if [ -e "$destdir$confdir/$env" ]; then
    say "kept existing $destdir$confdir/$env (the new example is $destdir$docdir/examples/$env)"
  else
    install -m 0644 "$here/config/$env" "$destdir$confdir/$env"
    say "$destdir$confdir/$env"
  fi
done
for job in "$repo"/examples/*.yaml; do
  [ -e "$job" ] && install -m 0644 "$job" "$destdir$docdir/examples/"
done
[ -f "$repo/docs/deploy.md" ] && install -m 0644 "$repo/docs/deploy.md" "$destdir$docdir/deploy.md"

# ---- live system only: create the user, reload units -------------------------
if [ "$activate" = 1 ] && [ -z "$destdir" ] && [ -d /run/systemd/system ]; then
  systemd-sysusers "$sysusersdir/trainctl.conf" || say "warning: systemd-sysusers failed; create the 'trainctl-rank' user yourself (useradd --system --home-dir /nonexistent --shell /usr/sbin/nologin trainctl-rank)"
  systemctl daemon-reload || true
  say "next: edit $confdir/*.env, then: systemctl enable --now trainctl-coordinator (control host) / trainctl-worker (each GPU host)"
fi
