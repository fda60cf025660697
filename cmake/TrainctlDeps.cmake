# Finds every dependency; a missing one stops configuration with the Debian
# package that provides it (scripts/install-deps.sh installs them all).

macro(trainctl_require found what package)
  if(NOT ${found})
    message(FATAL_ERROR "trainctl: ${what} not found. Install the Debian package "
      "'${package}' (or run scripts/install-deps.sh).")
  endif()
endmacro()

find_package(Threads REQUIRED)

find_package(Protobuf QUIET)
trainctl_require(Protobuf_FOUND "protobuf" "libprotobuf-dev protobuf-compiler")
find_program(TRAINCTL_PROTOC protoc)
trainctl_require(TRAINCTL_PROTOC "protoc" "protobuf-compiler")

find_package(gRPC CONFIG QUIET)
trainctl_require(gRPC_FOUND "gRPC C++" "libgrpc++-dev")
find_program(TRAINCTL_GRPC_CPP_PLUGIN grpc_cpp_plugin)
trainctl_require(TRAINCTL_GRPC_CPP_PLUGIN "grpc_cpp_plugin" "protobuf-compiler-grpc")

find_package(absl CONFIG QUIET)
trainctl_require(absl_FOUND "abseil" "libabsl-dev")

find_package(yaml-cpp CONFIG QUIET)
trainctl_require(yaml-cpp_FOUND "yaml-cpp" "libyaml-cpp-dev")

find_package(SQLite3 QUIET)
trainctl_require(SQLite3_FOUND "SQLite" "libsqlite3-dev")

# libpq, for the coordinator's PostgreSQL store (--store postgresql://...).
# Optional: without it the store is SQLite only and says so when asked for
# PostgreSQL. scripts/install-deps.sh installs it (libpq-dev).
find_package(PostgreSQL QUIET)
if(PostgreSQL_FOUND)
  message(STATUS "trainctl: PostgreSQL store backend with libpq ${PostgreSQL_VERSION_STRING}")
else()
  message(WARNING "trainctl: libpq not found (Debian: libpq-dev): the coordinator's store is SQLite only")
endif()

find_package(GTest QUIET)
trainctl_require(GTest_FOUND "GoogleTest" "libgtest-dev libgmock-dev")

# CLI11 is header-only; searched (not assumed in /usr/include) so that a
# private prefix in CMAKE_PREFIX_PATH works too (bench/gpu/run.sh).
find_path(TRAINCTL_CLI11_INCLUDE CLI/CLI.hpp)
trainctl_require(TRAINCTL_CLI11_INCLUDE "CLI11" "libcli11-dev")

if(TRAINCTL_SANITIZE AND TRAINCTL_TSAN)
  message(FATAL_ERROR "trainctl: TRAINCTL_SANITIZE (address) and TRAINCTL_TSAN (thread) cannot be combined")
endif()
if(TRAINCTL_SANITIZE OR TRAINCTL_FUZZ OR TRAINCTL_TSAN)
  set(TRAINCTL_WITH_TORCH OFF CACHE BOOL "" FORCE)
endif()
set(TRAINCTL_TSAN_ABSEIL "" CACHE PATH
    "With TRAINCTL_TSAN: the lib dir of an instrumented abseil (scripts/tsan-abseil.sh)")
if(TRAINCTL_TSAN)
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
  if(TRAINCTL_TSAN_ABSEIL)
    # Debian's shared abseil is swapped for the instrumented build, so that
    # TSan sees its mutexes: an old-style RPATH (not RUNPATH) is searched for
    # every library the program loads, Debian's libgrpc's own abseil too,
    # while other programs the tests start (python3 with Debian's grpcio)
    # keep Debian's abseil (LD_LIBRARY_PATH would hand them libraries that
    # need the TSan runtime).
    add_link_options(-Wl,--disable-new-dtags -Wl,-rpath,${TRAINCTL_TSAN_ABSEIL})
  endif()
endif()
if(TRAINCTL_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()

if(TRAINCTL_WITH_TORCH)
  find_package(Torch QUIET)
  trainctl_require(Torch_FOUND "LibTorch" "libtorch-dev")
  # Gloo is optional at build time: pip LibTorch on GPU machines may lack its headers.
  find_path(TRAINCTL_GLOO_INCLUDE gloo/allreduce.h)
  find_library(TRAINCTL_GLOO_LIB gloo)
  if(TRAINCTL_GLOO_INCLUDE AND TRAINCTL_GLOO_LIB)
    set(TRAINCTL_HAVE_GLOO ON)
  else()
    set(TRAINCTL_HAVE_GLOO OFF)
    message(WARNING "trainctl: Gloo not found (Debian package 'libgloo-dev'); the CPU collective engine is disabled")
  endif()
endif()

# CUDA toolkit + NCCL: compiled when found (AUTO) or demanded (ON).
set(TRAINCTL_HAVE_CUDA OFF)
if(NOT TRAINCTL_WITH_CUDA STREQUAL "OFF")
  find_package(CUDAToolkit QUIET)
  find_path(TRAINCTL_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
  find_library(TRAINCTL_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR} /usr/local/cuda/lib64)
  if(CUDAToolkit_FOUND AND TRAINCTL_NCCL_INCLUDE AND TRAINCTL_NCCL_LIB)
    set(TRAINCTL_HAVE_CUDA ON)
  elseif(TRAINCTL_WITH_CUDA STREQUAL "ON")
    message(FATAL_ERROR "trainctl: TRAINCTL_WITH_CUDA=ON but the CUDA toolkit or NCCL was not found")
  endif()
endif()
message(STATUS "trainctl: LibTorch engine=${TRAINCTL_WITH_TORCH} gloo=${TRAINCTL_HAVE_GLOO} cuda/nccl=${TRAINCTL_HAVE_CUDA} sanitize=${TRAINCTL_SANITIZE} tsan=${TRAINCTL_TSAN}")
