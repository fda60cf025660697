#!/usr/bin/env bash
# Packs the Debian packages a GPU machine lacks for building trainctl (it has
# CUDA, CMake, a compiler and a PyTorch 2.x wheel with CUDA LibTorch and
# NCCL, and no apt): gRPC, protobuf, abseil, yaml-cpp, SQLite, GoogleTest,
# CLI11 and cpp-httplib, with the runtime libraries they link. They travel
# with the checkout and are unpacked into a private prefix there
# (scripts/gpu-check.sh does; docs/gpu.md). Then checks the packed set the
# way the GPU machine will use it: every .deb unpacked into a scratch
# prefix, and every header, CMake config, library and tool CMake looks for
# (cmake/TrainctlDeps.cmake, common/CMakeLists.txt) present in that prefix.
#
#   scripts/gpu-pack-debs.sh [DIR]        # download into DIR (.devdeps), then check it
#   scripts/gpu-pack-debs.sh --check DIR  # only check an existing DIR
#   echo /.devdeps/ >> .git/info/exclude   # keep it out of git; it travels with the tree
set -euo pipefail
check_only=""
if [ "${1:-}" = "--check" ]; then
  check_only=1
  shift
fi
dir=${1:-.devdeps}

packages=(
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 protobuf-compiler-grpc
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32 protobuf-compiler
  libabsl-dev libabsl20220623 libyaml-cpp-dev libyaml-cpp0.7 libsqlite3-dev libsqlite3-0
  libre2-9 libre2-dev libc-ares2 libc-ares-dev libupb-dev libgtest-dev libgmock-dev libssl3
  libcli11-dev libcpp-httplib-dev libcpp-httplib0.11 libbrotli1
)

if [ -z "$check_only" ]; then
  mkdir -p "$dir"
  # apt-get download writes into the working directory, as user _apt when it can.
  (cd "$dir" && apt-get download "${packages[@]}" 2> >(grep -v 'unsandboxed' >&2))
  du -sh "$dir"
fi

# The check: unpack as the GPU machine does, then look for what CMake needs.
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
shopt -s nullglob
debs=("$dir"/*.deb)
if [ "${#debs[@]}" -eq 0 ]; then
  echo "gpu-pack-debs: no .deb files in $dir" >&2
  exit 1
fi
for f in "${debs[@]}"; do dpkg -x "$f" "$prefix"; done
lib=usr/lib/x86_64-linux-gnu
need=(
  usr/bin/protoc usr/bin/grpc_cpp_plugin
  usr/include/grpcpp/grpcpp.h "$lib/cmake/grpc/gRPCConfig.cmake"
  usr/include/google/protobuf/message.h "$lib/libprotobuf.so"
  usr/include/absl/synchronization/mutex.h "$lib/cmake/absl/abslConfig.cmake"
  usr/include/yaml-cpp/yaml.h "$lib/cmake/yaml-cpp/yaml-cpp-config.cmake"
  usr/include/sqlite3.h "$lib/libsqlite3.so"
  usr/include/gtest/gtest.h usr/include/gmock/gmock.h
  usr/include/CLI/CLI.hpp
  usr/include/httplib.h "$lib/libcpp-httplib.so"
)
missing=0
for f in "${need[@]}"; do
  if [ ! -e "$prefix/$f" ]; then
    echo "gpu-pack-debs: $dir lacks /$f" >&2
    missing=1
  fi
done
# Every shared library the packed ones need is packed too, or a base library
# any Linux with Python has (libc, libstdc++, libgcc, libm, zlib, ssl/crypto).
for so in "$prefix/$lib"/*.so.*; do
  [ -L "$so" ] && continue
  while read -r dep; do
    case "$dep" in
      libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*|libz.so.*|libssl.so.*|libcrypto.so.*|ld-linux*|libpthread.so.*|libdl.so.*|librt.so.*) continue ;;
    esac
    if [ ! -e "$prefix/$lib/$dep" ]; then
      echo "gpu-pack-debs: $(basename "$so") needs $dep, which $dir lacks" >&2
      missing=1
    fi
  done < <(objdump -p "$so" | awk '/NEEDED/{print $2}')
done
if [ "$missing" -ne 0 ]; then exit 1; fi
echo "gpu-pack-debs: $dir holds ${#debs[@]} packages; every header, CMake config, tool and library the build looks for is there"
