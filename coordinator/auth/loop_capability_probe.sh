#!/usr/bin/env bash
# loop_capability_probe_test: compiles coordinator/auth/loop_capability_probe.cc
# twice with clang's thread-safety analysis: on the loop it must compile, off
# the loop (-DPROBE_OFF_LOOP) it must be refused for not holding kLoop.
#   loop_capability_probe.sh CXX SOURCE [COMPILER FLAGS...]
set -u
cxx=$1 src=$2
shift 2
flags=(-fsyntax-only -Wthread-safety -Werror=thread-safety "$@")
if ! out=$("$cxx" "${flags[@]}" "$src" 2>&1); then
  echo "the probe that asserts the loop does not compile:"
  echo "$out"
  exit 1
fi
if out=$("$cxx" "${flags[@]}" -DPROBE_OFF_LOOP "$src" 2>&1); then
  echo "a call to a loop owner off the loop compiled: the loop-ownership analysis checks nothing"
  exit 1
fi
if ! grep -q "requires holding mutex 'kLoop'" <<<"$out"; then
  echo "the off-loop probe failed for another reason than kLoop:"
  echo "$out"
  exit 1
fi
echo "loop capability: the off-loop call is refused (kLoop), the asserted one compiles"
