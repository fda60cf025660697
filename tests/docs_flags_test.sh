#!/usr/bin/env bash
# Every flag a daemon's --help lists is documented in docs/ (in the
# kebab-case spelling --help prints).
#   tests/docs_flags_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1" src="$2" missing=0
for b in coordinator/trainctl-coordinator worker/daemon/trainctl-worker; do
  flags=$("$build/$b" --help | grep -oE '^  --[a-z0-9-]+' | sed 's/^  //')
  [ -n "$flags" ] || { echo "$b --help lists no flags"; exit 1; }
  for f in $flags; do
    if ! grep -rqF -- "$f" "$src/docs"; then
      echo "${b##*/} $f: in --help, not in docs/"
      missing=1
    fi
  done
done
exit "$missing"
