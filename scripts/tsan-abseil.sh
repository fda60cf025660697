#!/usr/bin/env bash
# Builds a ThreadSanitizer-instrumented copy of Debian's shared abseil (the
# libabsl20220623 that Debian's gRPC 1.51 links) from Debian's own source
# package, so that a TSan build of trainctl sees absl::Mutex, in gRPC and in
# our code, instead of reporting races on everything an absl::Mutex guards.
# Part of issue #28 (ThreadSanitizer stage).
#
#   sudo scripts/tsan-abseil.sh            # build it, or say where the cached one is
#   sudo scripts/tsan-abseil.sh --check    # only run the checks below on the cache
#   sudo scripts/tsan-abseil.sh --force    # build again even when the stamp matches
#
#   export LD_LIBRARY_PATH=/var/cache/trainctl-tsan-abseil/lib   # then run a TSan binary
#
# The libraries are drop-in replacements for Debian's: the source is
# `apt-get source abseil` at exactly the installed libabsl20220623 version, with
# Debian's patches applied (dpkg-source does that), so absl/base/options.h is
# Debian's (inline namespace absl::debian3, not upstream's lts_20220623;
# absl::any/optional/string_view/variant as abseil's own types; hardened), the
# SONAMEs are Debian's (its configure.diff sets SOVERSION 20220623 and VERSION
# 20220623.0.0 in CMake/AbseilHelpers.cmake: libabsl_synchronization.so.20220623
# and so on) and libabsl_flags.so does not exist (empty-flags-library.diff).
# The CMake options are debian/rules' own (CMAKE_CXX_STANDARD=17,
# BUILD_SHARED_LIBS=ON, no ABSL_PROPAGATE_CXX_STD, no NDEBUG); only the
# compiler (clang++) and the flags differ: -fsanitize=thread -O1 -g
# -fno-omit-frame-pointer. On top of Debian's patches goes one of ours, not an
# ABI change: the TSan annotation later abseil releases have in
# Mutex::IncrementSynchSem, without which TSan reports a false data race on
# every contended absl::Mutex (see tsan_patch below).
#
# The instrumented libraries call the TSan runtime (__tsan_*) without carrying
# it, like any sanitized shared library: only an executable linked with
# -fsanitize=thread (clang's static runtime or g++'s libtsan.so.2; both work)
# can load them. An uninstrumented program that links abseil fails with
# "undefined symbol: __tsan_init", so set LD_LIBRARY_PATH for the TSan test
# processes only, not for the build. gRPC itself stays uninstrumented: races
# TSan reports inside it (malloc/free handed over through gRPC's own atomics)
# want suppressions such as called_from_lib:libgrpc.so.29.
#
# Needs root (apt-get: a deb-src entry for the mirror apt already uses, the
# first one in /etc/apt/sources.list*, written to
# /etc/apt/sources.list.d/trainctl-deb-src.sources when there is no deb-src
# entry yet; dpkg-dev when missing; and the cache under /var/cache), clang++,
# cmake, patch, and libabsl-dev (headers, for the check's probe). The cache,
# $TSAN_CACHE (default /var/cache/trainctl-tsan-abseil), holds
#   lib/    a symlink to the current lib.<time>/: libabsl_*.so* only
#   src/    abseil-<version>/tree, the source tree as apt-get source left it
#           (kept: a rebuild does not fetch again; scripts/debian-source.sh), and
#           tsan-tree/, the copy built (with our patch; the debug info, so
#           TSan's reports, point into it)
#   .stamp  abseil source version + compiler + flags + this script's sha256;
#           written last: when it matches, the script does nothing
# The build goes into $TSAN_CACHE/build (removed when done), is installed into
# a new lib.<time>/, checked there, and only then replaces lib/ at once (a
# symlink swap): a running test never sees half a directory, a failed check
# leaves the old lib/ in place.
# Everything heavy runs under `nice -n 19`. Checks itself at the end: every
# Debian libabsl_* has a counterpart with the same SONAME that exports all its
# strong symbols, every abseil symbol that a program or library on this machine
# imports is there, a Debian library that links gRPC and abseil resolves every
# libabsl_* to the cache under that LD_LIBRARY_PATH, libabsl_synchronization
# calls __tsan_*, and a small program built with -fsanitize=thread, two
# threads counting under one contended absl::Mutex, runs without a TSan report
# on them. Prints the time of each stage last; exits non-zero when any stage or
# check fails. One run at a time per cache (a lock file).
#
# Environment: TSAN_CACHE, DEBIAN_MIRROR, JOBS (2), CXX (clang++),
# TSAN_CHECK_BINARY (the gRPC binary or library the check uses; default the
# first of /usr/bin/grpc_cpp_plugin, libgrpc++.so.*, libgrpc.so.* that links
# libabsl_synchronization).
set -euo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

# shellcheck source=scripts/debian-source.sh
. "$(dirname "$self")/debian-source.sh"
debian_rebuild_mode tsan-abseil "$@"

cache=${TSAN_CACHE:-/var/cache/trainctl-tsan-abseil}
jobs=${JOBS:-2}
cxx=${CXX:-clang++}
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
syslib=/usr/lib/$multiarch
binpkg=libabsl20220623   # the shared-library package Debian's gRPC depends on
flags=(-fsanitize=thread -O1 -g -fno-omit-frame-pointer)
# --as-needed: Debian's libraries name only the libraries they use (its
# libabsl_bad_any_cast_impl needs libstdc++ alone); without it ours would
# also need libm, libgcc_s, libatomic (harmless, but not Debian's).
ldflags="-fsanitize=thread -Wl,--as-needed"
# debian/rules: dh_auto_configure -Bshared -- -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON
# (dh's CMAKE_BUILD_TYPE=None: no -O, no -DNDEBUG from CMake)
cmake_args=(-DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON
            -DBUILD_TESTING=OFF -DABSL_BUILD_TESTING=OFF)

for tool in "$cxx" cmake patch; do
  if ! command -v "$tool" >/dev/null; then
    echo "tsan-abseil: $tool not found (apt-get install clang cmake patch)" >&2
    exit 1
  fi
done

# The exact version of the installed shared libraries: the source must be theirs.
version=$(dpkg-query -W -f='${source:Version}' "$binpkg" 2>/dev/null || true)
if [ -z "$version" ]; then
  echo "tsan-abseil: $binpkg is not installed (it comes with libgrpc++-dev)" >&2
  exit 1
fi

mkdir -p "$cache"
exec 9>"$cache/lock"
if ! flock -n 9; then
  echo "tsan-abseil: another run holds $cache/lock; waiting"
  flock 9
fi

stamp=$(printf '%s\n' "abseil $version" "compiler $("$cxx" --version | head -1)" \
          "flags ${flags[*]}" "ldflags $ldflags" "cmake ${cmake_args[*]}" \
          "script $(sha256sum "$self" | cut -d' ' -f1)")

declare -a timings=()
summary() {
  local rc=$?
  if [ "${#timings[@]}" -gt 0 ]; then
    echo
    echo "== tsan-abseil (abseil $version): stage times"
    printf '%-10s %8s  %s\n' STAGE SECONDS RESULT
    local t
    for t in "${timings[@]}"; do
      IFS='|' read -r name secs res <<<"$t"
      printf '%-10s %8s  %s\n' "$name" "$secs" "$res"
    done
  fi
  if [ "$rc" -eq 0 ]; then
    echo "cache: $cache ($(du -sh "$cache/lib/" 2>/dev/null | cut -f1) in lib/)"
    echo "use:   -DTRAINCTL_TSAN_ABSEIL=$cache/lib (scripts/tsan.sh), or LD_LIBRARY_PATH=$cache/lib for one TSan program"
  fi
  exit "$rc"
}

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

srcdir=$cache/src/abseil-$version     # holds $srctree and $tsantree
srctree=$srcdir/tree                  # as apt-get source left it (Debian's patches applied)
tsantree=$srcdir/tsan-tree            # a copy with ours (below); the debug info points here
build=$cache/build
stage_dir=$cache/build/install
newlib=$cache/lib.$(date +%Y%m%d-%H%M%S)  # checked before lib/ points to it

# --- fetch: apt-get source abseil=$version (idempotent) ---------------------
fetch() { debian_source_fetch tsan-abseil abseil "$version" "$srctree"; }

# Debian's ABI choices are in the patched tree; make sure they are there.
check_source() {
  local t=$srctree
  # dpkg-source -x records the patches it applied (3.0 (quilt)) in .pc/.
  if ! diff <(grep -vE '^[[:space:]]*(#|$)' "$t/debian/patches/series") "$t/.pc/applied-patches" \
       >/dev/null 2>&1; then
    echo "tsan-abseil: $t: not every patch in debian/patches/series is applied" >&2
    return 1
  fi
  if ! grep -q 'SOVERSION 20220623' "$t/CMake/AbseilHelpers.cmake"; then
    echo "tsan-abseil: debian/patches/configure.diff is not applied (SOVERSION)" >&2
    return 1
  fi
  if [ -f /usr/include/absl/base/options.h ] &&
     ! cmp -s /usr/include/absl/base/options.h "$t/absl/base/options.h"; then
    echo "tsan-abseil: $t/absl/base/options.h differs from the installed" \
         "/usr/include/absl/base/options.h (libabsl-dev): not Debian's ABI" >&2
    diff /usr/include/absl/base/options.h "$t/absl/base/options.h" >&2 || true
    return 1
  fi
  echo "inline namespace: absl::$(sed -nE 's/^#define ABSL_OPTION_INLINE_NAMESPACE_NAME (.*)/\1/p' \
    "$t/absl/base/options.h"); Debian's patches applied: $(tr '\n' ' ' <"$t/.pc/applied-patches")"
}

# --- our one patch -------------------------------------------------------------
# Not an ABI change (a function body in mutex.cc): a TSan-only annotation that
# later abseil releases carry in Mutex::IncrementSynchSem. TSan ignores the
# synchronisation inside absl::Mutex's own code (between __tsan_mutex_pre_* and
# __tsan_mutex_post_*), so it never sees a waiting thread hand its
# PerThreadSynch (in memory it mmap'ed through LowLevelAlloc) to the unlocking
# thread, and reports the unlocker's Waiter::Post (futex_.fetch_add) as a race
# with that mmap: a false positive on any contended absl::Mutex (abseil issues
# #217, #760, #1239; google/sanitizers#953). Without it every contended Mutex
# in gRPC reports; the other workaround, TSAN_OPTIONS=report_atomic_races=0,
# hides real races on atomics too.
tsan_patch() {
  cat <<'EOF'
--- a/absl/synchronization/mutex.cc
+++ b/absl/synchronization/mutex.cc
@@ -563,7 +563,12 @@
   if (mu) {
     ABSL_TSAN_MUTEX_PRE_DIVERT(mu, 0);
   }
+  // trainctl scripts/tsan-abseil.sh: w was handed over inside the Mutex code,
+  // where TSan sees no synchronisation; ignore the accesses to w's semaphore
+  // (no-ops unless built with -fsanitize=thread).
+  ABSL_ANNOTATE_IGNORE_READS_AND_WRITES_BEGIN();
   PerThreadSem::Post(w->thread_identity());
+  ABSL_ANNOTATE_IGNORE_READS_AND_WRITES_END();
   if (mu) {
     ABSL_TSAN_MUTEX_POST_DIVERT(mu, 0);
   }
EOF
}

prepare() {
  rm -rf "$tsantree"
  cp -a "$srctree" "$tsantree"
  tsan_patch | patch -d "$tsantree" -p1 --forward --no-backup-if-mismatch
}

# --- configure / build / install ---------------------------------------------
configure() {
  rm -rf "$build"
  local gen=()
  if command -v ninja >/dev/null; then gen=(-G Ninja); fi
  nice -n 19 cmake -S "$tsantree" -B "$build" "${gen[@]}" "${cmake_args[@]}" \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="${flags[*]}" \
    -DCMAKE_SHARED_LINKER_FLAGS="$ldflags" \
    -DCMAKE_INSTALL_PREFIX="$stage_dir" -DCMAKE_INSTALL_LIBDIR=lib
}

build_it() {
  nice -n 19 cmake --build "$build" -j "$jobs"
}

install_it() {
  nice -n 19 cmake --install "$build" >/dev/null
  rm -rf "$newlib.tmp" "$newlib"
  mkdir -p "$newlib.tmp"
  # Only the shared libraries: the real files and their SONAME / dev links.
  cp -a "$stage_dir"/lib/libabsl_*.so* "$newlib.tmp/"
  mv "$newlib.tmp" "$newlib"
  echo "$(find "$newlib" -name 'libabsl_*.so.*.*' | wc -l) libraries in $newlib"
}

publish() {  # lib -> lib.<time> at once (rename(2) of a symlink over a symlink)
  if [ -e "$cache/lib" ] && [ ! -L "$cache/lib" ]; then rm -rf "${cache:?}/lib"; fi
  ln -sfn "$(basename "$newlib")" "$cache/lib.link"
  mv -T "$cache/lib.link" "$cache/lib"
  local d
  for d in "$cache"/lib.*; do
    if [ "$d" != "$newlib" ] && [ -d "$d" ]; then rm -rf "$d"; fi
  done
  printf '%s\n' "$stamp" >"$cache/.stamp.tmp"
  mv "$cache/.stamp.tmp" "$cache/.stamp"
  rm -rf "$build"
  for d in "$cache"/src/abseil-*; do   # an older Debian version's source
    if [ "$d" != "$srcdir" ]; then rm -rf "$d"; fi
  done
  echo "$cache/lib -> $(readlink "$cache/lib")"
}

# --- checks ------------------------------------------------------------------
find_grpc_binary() {
  local c
  for c in ${TSAN_CHECK_BINARY:-} /usr/bin/grpc_cpp_plugin \
           "$(ldconfig -p | awk '/libgrpc\+\+\.so\./{print $NF; exit}')" \
           "$(ldconfig -p | awk '/libgrpc\.so\./{print $NF; exit}')"; do
    if [ -n "$c" ] && [ -e "$c" ] && ldd "$c" 2>/dev/null | grep 'libabsl_synchronization' >/dev/null; then
      echo "$c"
      return 0
    fi
  done
  return 1
}

check() {  # check DIR: DIR holds a usable instrumented abseil
  local lib=$1 fail=0
  # Drop-in: every Debian libabsl_* has an instrumented one of the same SONAME
  # that exports all its strong symbols. Weak ones (inline functions, template
  # instantiations) differ between g++ -O2 and clang++ -O1, which is harmless
  # as long as no program imports one that ours lacks: checked next, for every
  # binary and library on this machine that links abseil.
  local f soname ours missing n=0
  local -a debs=()
  for f in "$syslib"/libabsl_*.so.*; do
    [ -L "$f" ] && continue   # the real files only (...so.20220623.0.0)
    debs+=("$f")
    soname=$(objdump -p "$f" | awk '/SONAME/{print $2}')
    ours=$lib/$soname
    if [ ! -e "$ours" ]; then
      echo "MISSING: $ours (Debian has $f)"; fail=1; continue
    fi
    if [ "$(objdump -p "$ours" | awk '/SONAME/{print $2}')" != "$soname" ]; then
      echo "SONAME differs: $ours is not $soname"; fail=1
    fi
    missing=$(comm -23 <(nm -D --defined-only "$f" | awk '$2 !~ /^[WVu]$/ {print $3}' | sort -u) \
                       <(nm -D --defined-only "$ours" | awk '{print $3}' | sort -u))
    if [ -n "$missing" ]; then
      echo "SYMBOLS: $ours lacks $(echo "$missing" | wc -l) of Debian's exports:"
      echo "$missing" | head -5 | c++filt | sed 's/^/  /'
      fail=1
    fi
    n=$((n + 1))
  done
  echo "$n Debian libabsl_*.so: same SONAME, all strong exports in $lib"
  local notfound
  notfound=$(for f in "$lib"/libabsl_*.so.*.*; do LD_LIBRARY_PATH=$lib ldd "$f" | sed "s|^|$f: |"; done |
             grep 'not found' || true)
  if [ -n "$notfound" ]; then
    echo "UNRESOLVED: libraries the instrumented ones need:"; echo "$notfound"; fail=1
  fi
  local -a users=()
  mapfile -t users < <(find "$syslib" -maxdepth 1 -name '*.so.*' -type f ! -name 'libabsl_*' -print0 |
                         cat - <(find /usr/bin /usr/sbin -maxdepth 1 -type f -print0) |
                         xargs -0 grep -l 'libabsl_' 2>/dev/null || true)
  local imports exports
  exports=$(nm -D --defined-only "${debs[@]}" | awk 'NF == 3 {print $3}' | sort -u)
  imports=$( (for f in "${users[@]}"; do nm -D --undefined-only "$f" 2>/dev/null; done) |
            awk '{print $2}' | sed 's/@.*//' | sort -u | comm -12 - <(echo "$exports"))
  missing=$(comm -23 <(echo "$imports") \
                     <(nm -D --defined-only "$lib"/libabsl_*.so.*.* | awk 'NF == 3 {print $3}' | sort -u))
  if [ -n "$missing" ]; then
    echo "SYMBOLS: the instrumented abseil lacks $(echo "$missing" | wc -l) symbols that" \
         "programs here import from Debian's:"
    echo "$missing" | head -10 | c++filt | sed 's/^/  /'
    fail=1
  else
    echo "${#users[@]} programs and libraries here link abseil; all $(echo "$imports" | wc -l)" \
         "abseil symbols they import are in $lib"
  fi

  local tsan
  tsan=$(nm -D "$lib"/libabsl_synchronization.so.* 2>/dev/null | grep -c '__tsan' || true)
  if [ "$tsan" -eq 0 ]; then
    echo "NOT INSTRUMENTED: $lib/libabsl_synchronization.so.* references no __tsan symbol"; fail=1
  else
    echo "libabsl_synchronization: $tsan __tsan_* symbols ($(nm -D "$lib"/libabsl_synchronization.so.* |
      grep -oE '__tsan_mutex_[a-z_]+' | sort -u | tr '\n' ' '))"
  fi

  local bin out bad
  if ! bin=$(find_grpc_binary); then
    echo "NO CHECK BINARY: nothing among grpc_cpp_plugin, libgrpc++, libgrpc links abseil" \
         "(set TSAN_CHECK_BINARY)"; fail=1
  else
    out=$(LD_LIBRARY_PATH=$lib ldd "$bin")
    bad=$(echo "$out" | grep 'libabsl_' | grep -v "=> $lib/" || true)
    if [ -n "$bad" ]; then
      echo "NOT RESOLVED to $lib: with LD_LIBRARY_PATH=$lib, ldd $bin gives"
      echo "$bad"
      fail=1
    else
      echo "$bin: $(echo "$out" | grep -c 'libabsl_') libabsl_* resolve to $lib"
    fi
  fi

  # TSan sees absl::Mutex: a counter guarded by one, in two threads.
  if [ -f /usr/include/absl/synchronization/mutex.h ]; then
    local tmp rc=0
    tmp=$(mktemp -d)
    cat >"$tmp/mutex.cc" <<'EOF'
#include <thread>
#include "absl/synchronization/mutex.h"
int main() {
  absl::Mutex mu;
  long n = 0;
  auto work = [&] { for (int i = 0; i < 100000; ++i) { absl::MutexLock l(&mu); ++n; } };
  std::thread a(work), b(work);
  a.join();
  b.join();
  return n == 200000 ? 0 : 1;
}
EOF
    local libs=()
    read -ra libs <<<"$(pkg-config --libs absl_synchronization 2>/dev/null ||
                        echo -labsl_synchronization)"
    nice -n 19 "$cxx" -std=gnu++17 "${flags[@]}" "$tmp/mutex.cc" -o "$tmp/mutex" "${libs[@]}" -lpthread
    LD_LIBRARY_PATH=$lib TSAN_OPTIONS="exitcode=66" "$tmp/mutex" >"$tmp/out" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
      echo "TSAN PROBE FAILED (exit $rc) on $lib: an absl::Mutex-guarded counter"
      head -30 "$tmp/out" | sed 's/^/  /'
      fail=1
    else
      echo "absl::Mutex probe (-fsanitize=thread): race-free on $lib"
      rc=0
      TSAN_OPTIONS="exitcode=66" "$tmp/mutex" >/dev/null 2>&1 || rc=$?
      if [ "$rc" -eq 66 ]; then
        echo "  (on Debian's uninstrumented $syslib it reports a data race, as expected)"
      else
        echo "  (on Debian's uninstrumented $syslib it exited $rc this time)"
      fi
    fi
    rm -rf "$tmp"
  else
    echo "absl::Mutex probe skipped: /usr/include/absl (libabsl-dev) not installed"
  fi

  if [ "$fail" -ne 0 ]; then
    echo "tsan-abseil: $lib is not a usable instrumented abseil (see above)" >&2
    return 1
  fi
}

trap summary EXIT

if [ "$mode" = check ]; then
  stage check check "$cache/lib"
  exit 0
fi
if [ "$mode" = build ] && [ "$(cat "$cache/.stamp" 2>/dev/null || true)" = "$stamp" ] &&
   [ -d "$cache/lib/" ]; then
  echo "== abseil $version with TSan: cached in $cache/lib (stamp matches; --force builds again)"
  exit 0
fi

echo "== abseil $version with TSan into $cache (no cache yet, or its stamp differs)"
stage fetch fetch
stage source check_source
stage patch prepare
stage configure configure
stage build build_it
stage install install_it
stage check check "$newlib"
stage publish publish
