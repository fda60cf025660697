#!/usr/bin/env bash
# The four binaries of the quick start (trainctl, trainctl-rank,
# trainctl-coordinator, trainctl-worker) load only libraries that Debian
# packages of the quick start's list install (scripts/install-deps.sh
# --print build) or that apt pulls in for them: ldd's libraries, each mapped
# to its package with dpkg, checked against that list's dependency closure
# (apt-cache depends --recurse; alternatives and the providers of virtual
# packages count as in it, so the closure is an upper bound; a library
# whose package is outside it, or that no package owns, fails).
# Skipped (exit 77) where dpkg or apt-cache is missing (not Debian).
set -euo pipefail
build=$1 src=$2

for tool in ldd dpkg-query apt-cache; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: no $tool (not a Debian system)"
    exit 77
  fi
done

bins=(client/trainctl worker/trainer/trainctl-rank coordinator/trainctl-coordinator worker/daemon/trainctl-worker)
for b in "${bins[@]}"; do
  test -x "$build/$b" || { echo "FAIL: $build/$b is not built"; exit 1; }
done

mapfile -t listed < <(bash "$src/scripts/install-deps.sh" --print build)
declare -A direct=() closure=()
for p in "${listed[@]}"; do direct[$p]=1; done
while read -r name; do
  name=${name%%:*}
  name=${name#<}
  name=${name%>}
  closure[$name]=1
done < <(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
           --no-replaces --no-enhances "${listed[@]}" | sed -n 's/^ *\(|\?[A-Za-z]*Depends: \)\?//p' | sort -u)

# Every library path ldd names (the loader too), per binary.
fail=0
declare -A libs=()
for b in "${bins[@]}"; do
  out=$(ldd "$build/$b")
  if grep -q "not found" <<<"$out"; then
    echo "FAIL: $b: libraries not found:"
    grep "not found" <<<"$out"
    fail=1
  fi
  while read -r path; do
    libs[$path]+="${libs[$path]:+ }${b##*/}"
  done < <(sed -n -e 's/^.*=> \(\/[^ ]*\) (.*$/\1/p' -e 's/^[[:space:]]*\(\/[^ ]*\) (.*$/\1/p' <<<"$out")
done
test "${#libs[@]}" -gt 0 || { echo "FAIL: ldd named no libraries"; exit 1; }

# Each path's real path (one realpath call), and the package that installed
# it (one dpkg-query call over every candidate: the path as ldd names it and
# its real path, each also without /usr: with a merged /usr dpkg knows a file
# under the path its package shipped it).
declare -A real=()
mapfile -t paths < <(printf '%s\n' "${!libs[@]}")
mapfile -t reals < <(realpath -- "${paths[@]}")
for i in "${!paths[@]}"; do real[${paths[$i]}]=${reals[$i]}; done
declare -A owned=()
while IFS= read -r line; do
  pkg=${line%%: /*}
  pkg=${pkg%%, *}
  owned[${line#*: }]=${pkg%%:*}
done < <(for p in "${paths[@]}" "${reals[@]}"; do printf '%s\n%s\n' "$p" "${p#/usr}"; done |
         sort -u | xargs -d '\n' dpkg-query -S 2>/dev/null || true)
owner() {  # owner PATH: sets $pkg to PATH's package, or to nothing
  local c
  pkg=""
  for c in "$1" "${1#/usr}" "${real[$1]}" "${real[$1]#/usr}"; do
    if [ -n "${owned[$c]:-}" ]; then pkg=${owned[$c]}; return; fi
  done
}

declare -A packages=()
build_real=$(realpath "$build")
for path in "${paths[@]}"; do
  case "${real[$path]}" in
    "$build_real"/*) continue ;;  # built here
  esac
  owner "$path"
  if [ -z "$pkg" ]; then
    echo "FAIL: $path (loaded by ${libs[$path]}) belongs to no Debian package"
    fail=1
    continue
  fi
  packages[$pkg]=1
  if [ -z "${closure[$pkg]:-}" ]; then
    echo "FAIL: $path (loaded by ${libs[$path]}) is from $pkg, which the quick start's packages do not pull in (scripts/install-deps.sh: add it to a build group)"
    fail=1
  fi
done

n_direct=0
for p in "${!packages[@]}"; do
  if [ -n "${direct[$p]:-}" ]; then n_direct=$((n_direct + 1)); fi
done
echo "${#libs[@]} libraries from ${#packages[@]} packages (${n_direct} listed, the rest their dependencies); the closure of the ${#direct[@]} listed packages has ${#closure[@]} names"
# Which BLAS LibTorch loads: Debian's alternatives choose it; OpenBLAS
# (libopenblas0-openmp, in the list) is several times faster than the
# reference BLAS. Said, not checked: the machine's alternatives decide.
blas=$(ldd "$build/worker/trainer/trainctl-rank" | sed -n 's/^.*libblas.so.3 => \(\/[^ ]*\) .*$/\1/p')
if [ -n "$blas" ]; then
  owner "$blas"
  echo "trainctl-rank's BLAS: ${real[$blas]:-$blas} (${pkg:-no package})"
fi

if [ "$fail" -eq 0 ]; then echo "PASS"; fi
exit "$fail"
