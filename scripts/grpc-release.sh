#!/usr/bin/env bash
# Builds Debian's gRPC (the installed libgrpc29 / libgrpc++1.51 version) from
# Debian's own source package with -DNDEBUG, for a coordinator that holds many
# thousands of workers (docs/operator.md, "A coordinator for 10,000 workers").
#
#   sudo scripts/grpc-release.sh            # build it, or say where the cached one is
#   sudo scripts/grpc-release.sh --check    # only run the checks below on the cache
#   sudo scripts/grpc-release.sh --force    # build again even when the stamp matches
#
#   LD_LIBRARY_PATH=/var/cache/trainctl-grpc-release/lib trainctl-coordinator ...
#
# Why: Debian builds gRPC without NDEBUG (debian/rules leaves
# CMAKE_BUILD_TYPE=Release commented out), so gRPC core's debug checks are
# compiled in. One of them, cq_check_tag in completion_queue.cc, searches the
# list of every operation outstanding on a completion queue each time one
# completes. Every worker's Session stream keeps two operations outstanding
# on the coordinator's callback queue, so each heartbeat's read and its ack
# search a list twice as long as the workers (bench/RESULTS.md, "A release
# build of Debian's gRPC").
#
# The libraries are drop-in replacements for the ones the coordinator loads:
# libgrpc, libgpr, libupb, libaddress_sorting (SONAME .29) and libgrpc++
# (.1.51), from `apt-get source grpc` at exactly the installed version with
# Debian's patches applied, the CMake options of debian/rules and its
# compiler flags (dpkg-buildflags), with two differences: -DNDEBUG, and no -g
# (no debug info). libgrpc++ is rebuilt too because Debian's calls core
# functions whose signatures differ without NDEBUG (grpc_cq_internal_ref).
# libgrpc++_reflection and everything else stays Debian's. Only the
# coordinator needs them: a worker daemon has one stream.
#
# Needs root (apt-get source: scripts/debian-source.sh; the cache under
# /var/cache), cmake, ninja or make, g++, and the -dev packages of gRPC's
# dependencies (libabsl-dev libre2-dev libc-ares-dev libssl-dev zlib1g-dev
# libprotobuf-dev, which scripts/install-deps.sh installs). About 850 files to
# compile (the script prints its time), everything under `nice -n 19`; CMake
# uses a compile cache named by CMAKE_CXX_COMPILER_LAUNCHER (ccache) when set. The cache,
# $GRPC_RELEASE_CACHE (default /var/cache/trainctl-grpc-release), holds
#   lib/    a symlink to the current lib.<time>/: the five libraries' files
#   src/    grpc-<version>/, the source tree (kept: a rebuild does not fetch again)
#   .stamp  gRPC version + compiler + flags + this script's sha256; written
#           last: when it matches, the script only checks
# The build goes into $GRPC_RELEASE_CACHE/build (kept: a compile cache), is
# copied into a new lib.<time>/, checked there, and only then replaces lib/
# at once (a symlink swap). Checks: each library has Debian's SONAME; every
# symbol that Debian's libgrpc++_reflection and the libraries themselves
# import from one another is exported; NDEBUG took (Debian's libgrpc exports
# grpc_cq_internal_ref with its debug signature, the release one does not);
# and, with TRAINCTL_COORDINATOR=PATH, that binary resolves every gRPC library
# to the cache and prints its --help. One run at a time per cache (a lock).
set -euo pipefail
self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")

# shellcheck source=scripts/debian-source.sh
. "$(dirname "$self")/debian-source.sh"
debian_rebuild_mode grpc-release "$@"

cache=${GRPC_RELEASE_CACHE:-/var/cache/trainctl-grpc-release}
jobs=${JOBS:-2}
multiarch=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
syslib=/usr/lib/$multiarch
libs=(libgrpc.so.29 libgpr.so.29 libupb.so.29 libaddress_sorting.so.29 libgrpc++.so.1.51)

version=$(dpkg-query -W -f='${source:Version}' libgrpc29 2>/dev/null || true)
if [ -z "$version" ]; then
  echo "grpc-release: libgrpc29 is not installed (it comes with libgrpc++-dev)" >&2
  exit 1
fi
cxxversion=$(dpkg-query -W -f='${source:Version}' libgrpc++1.51 2>/dev/null || true)
if [ "$cxxversion" != "$version" ]; then
  echo "grpc-release: libgrpc++1.51 ($cxxversion) is not from the same source as libgrpc29 ($version)" >&2
  exit 1
fi

srctree=$cache/src/grpc-$version
build=$cache/build
# dpkg-buildflags' value for $1 without -g, with -DNDEBUG, and with the source
# tree (not the current directory) mapped to "." as in Debian's own build.
flags() {
  local f
  f=$(dpkg-buildflags --get "$1" | sed -E 's/(^| )-g( |$)/ /; s/-ffile-prefix-map=[^ ]*//' | tr -s ' ')
  f=${f# }
  echo "${f% } -ffile-prefix-map=$srctree=. -DNDEBUG"
}
cflags=$(flags CFLAGS)
cxxflags=$(flags CXXFLAGS)
# debian/rules' COMMON_BUILD_FLAGS with the shared build's options; no tests,
# no code generators (only the libraries are used).
cmake_args=(-DCMAKE_BUILD_TYPE=None -DBUILD_SHARED_LIBS=ON -DgRPC_BUILD_TESTS=OFF
            -DgRPC_ABSL_PROVIDER=package -DgRPC_CARES_PROVIDER=package
            -DgRPC_PROTOBUF_PROVIDER=package -DgRPC_RE2_PROVIDER=package
            -DgRPC_SSL_PROVIDER=package -DgRPC_ZLIB_PROVIDER=package
            -DgRPC_BACKWARDS_COMPATIBILITY_MODE=OFF -DgRPC_BUILD_CODEGEN=OFF
            -DgRPC_BUILD_GRPC_CPP_PLUGIN=OFF -DgRPC_BUILD_GRPC_CSHARP_PLUGIN=OFF
            -DgRPC_BUILD_GRPC_NODE_PLUGIN=OFF -DgRPC_BUILD_GRPC_OBJECTIVE_C_PLUGIN=OFF
            -DgRPC_BUILD_GRPC_PHP_PLUGIN=OFF -DgRPC_BUILD_GRPC_PYTHON_PLUGIN=OFF
            -DgRPC_BUILD_GRPC_RUBY_PLUGIN=OFF)

mkdir -p "$cache"
exec 9>"$cache/lock"
if ! flock -n 9; then
  echo "grpc-release: another run holds $cache/lock; waiting"
  flock 9
fi
stamp=$(printf '%s\n' "grpc $version" "compiler $(g++ --version | head -1)" \
          "cflags $cflags" "cxxflags $cxxflags" "cmake ${cmake_args[*]}" \
          "script $(sha256sum "$self" | cut -d' ' -f1)")

# check DIR: the libraries in DIR are drop-in release builds (see the top).
check() {
  local dir=$1 lib soname missing
  for lib in "${libs[@]}"; do
    [ -f "$dir/$lib" ] || { echo "grpc-release: $dir/$lib is missing" >&2; return 1; }
    soname=$(objdump -p "$dir/$lib" | awk '/SONAME/ {print $2}')
    if [ "$soname" != "$lib" ]; then
      echo "grpc-release: $dir/$lib has SONAME '$soname', Debian's is $lib" >&2
      return 1
    fi
  done
  local defined imports
  defined=$(for lib in "${libs[@]}"; do nm -D --defined-only "$dir/$lib"; done | awk '{print $3}' | sort -u)
  # Symbols Debian's reflection library and ours take from these libraries.
  imports=$( (nm -D --undefined-only "$syslib/libgrpc++_reflection.so.1.51"
              for lib in "${libs[@]}"; do nm -D --undefined-only "$dir/$lib"; done) |
             awk '{print $2}' | sort -u)
  local debian
  debian=$(for lib in "${libs[@]}"; do nm -D --defined-only "$syslib/$lib"; done | awk '{print $3}' | sort -u)
  missing=$(comm -12 <(echo "$imports") <(echo "$debian") | comm -23 - <(echo "$defined"))
  if [ -n "$missing" ]; then
    echo "grpc-release: symbols imported from gRPC that $dir does not export:" >&2
    echo "$missing" | c++filt | head -20 >&2
    return 1
  fi
  # With NDEBUG, grpc_cq_internal_ref takes the queue alone.
  if nm -D --defined-only "$dir/libgrpc.so.29" | c++filt | grep -F 'grpc_cq_internal_ref(grpc_completion_queue*, char const*' >/dev/null; then
    echo "grpc-release: $dir/libgrpc.so.29 has the debug grpc_cq_internal_ref: not built with NDEBUG" >&2
    return 1
  fi
  if [ -n "${TRAINCTL_COORDINATOR:-}" ]; then
    local unresolved
    unresolved=$(LD_LIBRARY_PATH=$dir ldd "$TRAINCTL_COORDINATOR" |
                 grep -E 'lib(grpc|gpr|upb|address_sorting)' | grep -vF "$dir/" |
                 grep -v 'libgrpc++_reflection' || true)
    if [ -n "$unresolved" ]; then
      echo "grpc-release: $TRAINCTL_COORDINATOR does not load these from $dir:" >&2
      echo "$unresolved" >&2
      return 1
    fi
    LD_LIBRARY_PATH=$dir "$TRAINCTL_COORDINATOR" --help >/dev/null
  fi
  echo "checked: $dir (gRPC $version, NDEBUG, Debian's SONAMEs and symbols)"
}

if [ "$mode" = check ]; then
  check "$cache/lib"
  exit 0
fi
if [ "$mode" = build ] && [ -f "$cache/.stamp" ] && [ "$(cat "$cache/.stamp")" = "$stamp" ] &&
   [ -d "$cache/lib/" ]; then
  check "$cache/lib"
  echo "cache: $cache/lib (up to date)"
  exit 0
fi

t0=$SECONDS
debian_source_fetch grpc-release grpc "$version" "$srctree"
for tool in cmake g++ objdump nm; do
  command -v "$tool" >/dev/null || { echo "grpc-release: $tool not found" >&2; exit 1; }
done
gen=()
if command -v ninja >/dev/null; then gen=(-G Ninja); fi
# gRPC's CMakeLists names libprotoc for its code generators even when they are off.
protoc_lib=$(find "$syslib" -maxdepth 1 -name 'libprotoc.so*' | sort | head -1)
nice -n 19 cmake -S "$srctree" -B "$build" "${gen[@]}" "${cmake_args[@]}" \
  -DCMAKE_C_FLAGS="$cflags" -DCMAKE_CXX_FLAGS="$cxxflags" \
  ${protoc_lib:+-DProtobuf_PROTOC_LIBRARY="$protoc_lib"} >"$cache/configure.log" ||
  { tail -30 "$cache/configure.log" >&2; exit 1; }
echo "== building gRPC $version with NDEBUG ($jobs jobs; $build)"
nice -n 19 cmake --build "$build" -j "$jobs" --target grpc grpc++ >"$cache/build.log" ||
  { tail -30 "$cache/build.log" >&2; exit 1; }
newlib=$cache/lib.$(date +%Y%m%d-%H%M%S)
rm -rf "$newlib"
mkdir -p "$newlib"
for lib in "${libs[@]}"; do cp -a "$build/$lib"* "$newlib/"; done
check "$newlib"
ln -sfn "$(basename "$newlib")" "$cache/lib.link"
mv -T "$cache/lib.link" "$cache/lib"
for d in "$cache"/lib.*; do
  if [ "$d" != "$newlib" ] && [ -d "$d" ]; then rm -rf "$d"; fi
done
for d in "$cache"/src/grpc-*; do   # an older Debian version's source
  if [ "$d" != "$srctree" ]; then rm -rf "$d"; fi
done
printf '%s\n' "$stamp" >"$cache/.stamp.tmp"
mv "$cache/.stamp.tmp" "$cache/.stamp"
echo "cache: $cache/lib -> $(readlink "$cache/lib") ($((SECONDS - t0)) s)"
echo "use:   LD_LIBRARY_PATH=$cache/lib for trainctl-coordinator (docs/operator.md)"
