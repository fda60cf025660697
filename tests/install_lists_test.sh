#!/usr/bin/env bash
# scripts/install-deps.sh's two lists: the quick start's (build) is a subset
# of the test command's (test), `--list` is the test list, and what only the
# tests need stays out of the quick start's list (the point of the split:
# docs/testing.md).
set -euo pipefail
src=$1
deps="$src/scripts/install-deps.sh"
fail=0

build=$(bash "$deps" --print build | sort -u)
test=$(bash "$deps" --print test | sort -u)
test -n "$build" || { echo "FAIL: install-deps.sh --print build printed nothing"; exit 1; }
test -n "$test" || { echo "FAIL: install-deps.sh --print test printed nothing"; exit 1; }
echo "build list: $(wc -l <<<"$build") packages; test list: $(wc -l <<<"$test")"

extra=$(comm -23 <(echo "$build") <(echo "$test"))
if [ -n "$extra" ]; then
  echo "FAIL: in the quick start's list (--print build) but not in the test command's (--print test):" $extra
  fail=1
fi

if [ "$(bash "$deps" --list)" != "$(bash "$deps" --print test)" ]; then
  echo "FAIL: --list differs from --print test (scripts/test-libtorch2.sh stamps its root with --list)"
  fail=1
fi

# Test-only packages (a browser, a metrics server, a database server, a
# second compiler and its formatter, Python reference packages, a data set, a time faker).
for p in chromium prometheus postgresql clang clang-format faketime python3-torch python3-numpy python3-grpcio dataset-fashion-mnist; do
  if ! grep -qx -- "$p" <<<"$test"; then
    echo "FAIL: $p is not in the test list"
    fail=1
  fi
  if grep -qx -- "$p" <<<"$build"; then
    echo "FAIL: $p (only the tests need it) is in the quick start's list"
    fail=1
  fi
done

# What the four binaries and the example need is in the quick start's list
# (tests/binary_deps_test.sh checks the libraries they load).
for p in cmake ninja-build libtorch-dev libopenblas0-openmp libgrpc++-dev libgtest-dev; do
  if ! grep -qx -- "$p" <<<"$build"; then
    echo "FAIL: $p is not in the quick start's list"
    fail=1
  fi
done

# The quick start configures build/ with the test command's flags (so that
# scripts/test.sh reuses its build): the -D options of their `cmake -S . -B
# build` lines are the same.
cmake_flags() {  # the -D options of FILE's `cmake -S . -B build` command
  awk '/cmake -S \. -B build /{on=1} on{print; if ($0 !~ /\\$/) on=0}' "$1" |
    grep -o -- '-D[A-Za-z_]*=[^" ]*' | sort
}
qs_flags=$(cmake_flags "$src/scripts/quickstart.sh")
test_flags=$(cmake_flags "$src/scripts/test.sh")
if [ -z "$qs_flags" ] || [ "$qs_flags" != "$test_flags" ]; then
  echo "FAIL: quickstart.sh configures build/ with [$(echo $qs_flags)], test.sh with [$(echo $test_flags)]"
  fail=1
fi

# Bad input is refused, naming it.
if out=$(bash "$deps" --print nonsense 2>&1); then
  echo "FAIL: --print nonsense succeeded"; fail=1
elif ! grep -q "unknown mode 'nonsense'" <<<"$out"; then
  echo "FAIL: --print nonsense did not name the mode: $out"; fail=1
fi
if out=$(bash "$deps" --frobnicate 2>&1); then
  echo "FAIL: --frobnicate succeeded"; fail=1
elif ! grep -q "unknown argument '--frobnicate'" <<<"$out"; then
  echo "FAIL: --frobnicate was not named: $out"; fail=1
fi

if [ "$fail" -eq 0 ]; then echo "PASS"; fi
exit "$fail"
