#!/usr/bin/env bash
# Checks the systemd units as deploy/install.sh installs them: renders them
# into a scratch directory (binaries from BUILD_DIR when given, else stub
# executables, since `systemd-analyze verify` checks that ExecStart= exists)
# and runs `systemd-analyze verify` on each; also prints the offline
# `systemd-analyze security` exposure score of each (informational).
# Needs no running systemd. Exits 0 and says it skipped when systemd-analyze
# is not installed (Debian: apt-get install systemd).
#
#   deploy/verify-units.sh [BUILD_DIR]
# For CTest: add_test(NAME deploy_units COMMAND deploy/verify-units.sh)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "verify-units: SKIPPED: systemd-analyze not installed"
  exit "${VERIFY_UNITS_SKIP_CODE:-0}"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
build=${1:-}
if [ -z "$build" ] || [ ! -d "$build" ]; then
  build=$tmp/stub-build
  mkdir -p "$build"
  for b in trainctl-coordinator trainctl-worker trainctl-rank trainctl; do
    printf '#!/bin/sh\nexit 0\n' > "$build/$b"; chmod 0755 "$build/$b"
  done
fi

# Installed without DESTDIR into scratch paths, so the rendered units name
# files that exist (ExecStart=, EnvironmentFile=).
bash "$here/install.sh" --build-dir "$build" --prefix "$tmp/prefix" --sysconfdir "$tmp/etc" \
  --unitdir "$tmp/units" --sysusersdir "$tmp/sysusers" --no-activate > "$tmp/install.log" \
  || { cat "$tmp/install.log"; echo "verify-units: FAILED: install.sh"; exit 1; }

failed=0
for unit in "$tmp"/units/*.service; do
  name=${unit##*/}
  # verify: unknown keys, bad values, missing executables, dependency loops.
  # Debian 12's systemd warns (and does not fail) about syscall names its
  # libseccomp lacks; those lines are filtered from the output.
  if out=$(systemd-analyze verify --man=no "$unit" 2>&1); then rc=0; else rc=$?; fi
  out=$(printf '%s\n' "$out" | grep -v -E 'Failed to parse system call, ignoring|^$' || true)
  if [ "$rc" -eq 0 ] && [ -z "$out" ]; then
    echo "verify-units: PASS $name: systemd-analyze verify clean"
  elif [ "$rc" -eq 0 ]; then
    echo "verify-units: FAIL $name: systemd-analyze verify printed warnings:"; printf '%s\n' "$out" | sed 's/^/  /'
    failed=1
  else
    echo "verify-units: FAIL $name: systemd-analyze verify exit $rc:"; printf '%s\n' "$out" | sed 's/^/  /'
    failed=1
  fi
  score=$(systemd-analyze security --offline=true --no-pager "$unit" 2>/dev/null \
          | sed -n 's/.*Overall exposure level for [^:]*: *//p' | tail -n 1 || true)
  [ -n "$score" ] && echo "verify-units:      $name exposure (systemd-analyze security): $score"
done
if [ "$failed" -ne 0 ]; then echo "verify-units: FAILED"; exit 1; fi
echo "verify-units: all units verified"
