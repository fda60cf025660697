#!/usr/bin/env bash
# Generates the Python messages and gRPC stubs of trainctl/v1 into
# OUT_DIR/trainctl/v1/ (what `trainctl.client` imports), with protoc and
# grpc_python_plugin as proto/check_python.sh does.
#
#   python/gen_stubs.sh OUT_DIR
#   TRAINCTL_PYTHON_STUBS=OUT_DIR /usr/bin/python3 -c 'import trainctl; trainctl.Client()'
#
# PROTOC and GRPC_PYTHON_PLUGIN override the tools found on PATH. Only the
# generated files are written; nothing else in OUT_DIR is touched.
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
out=$1
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../proto" && pwd)
protoc=${PROTOC:-$(command -v protoc || true)}
plugin=${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || true)}
if [[ -z $protoc || -z $plugin ]]; then
  echo "$0: needs protoc and grpc_python_plugin (Debian: protobuf-compiler protobuf-compiler-grpc)" >&2
  exit 1
fi
mkdir -p "$out"
"$protoc" -I "$src" --python_out="$out" --grpc_python_out="$out" \
  --plugin=protoc-gen-grpc_python="$plugin" "$src"/trainctl/v1/*.proto
# A regular package, so that an installed copy imports like any other.
: > "$out/trainctl/v1/__init__.py"
