#!/usr/bin/env bash
# Every flag a daemon's --help lists is documented in docs/ (in the
# kebab-case spelling --help prints), and every flag of every `trainctl`
# verb (and of `trainctl` itself) is in docs/cli.md.
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

# trainctl: CLI11's help lists options as "  -f,--follow ..." or "  --set ...",
# and subcommands (verbs, and `token`'s own) under "Subcommands:".
cli="$build/client/trainctl"
subcommands() { "$cli" "$@" --help | sed -n '/^Subcommands:/,/^$/p' | grep -oE '^  [a-z][a-z0-9-]*' | sed 's/^  //' || true; }
options() { "$cli" "$@" --help | sed '/^Subcommands:/,$d' | grep -oE '^ +(-[a-z], *)?--[a-z0-9][a-z0-9_-]*' | grep -oE -- '--[a-z0-9_-]+' || true; }
check_cli() {
  local f
  for f in $(options "$@"); do
    [ "$f" = --help ] && continue
    if ! grep -qF -- "$f" "$src/docs/cli.md"; then
      echo "trainctl $* $f: in --help, not in docs/cli.md"
      missing=1
    fi
  done
}
if [ -x "$cli" ]; then
  verbs=$(subcommands)
  [ -n "$verbs" ] || { echo "trainctl --help lists no verbs"; exit 1; }
  check_cli
  for v in $verbs; do
    check_cli "$v"
    for s in $(subcommands "$v"); do check_cli "$v" "$s"; done
  done
fi
exit "$missing"
