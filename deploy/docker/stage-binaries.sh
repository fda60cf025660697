#!/usr/bin/env bash
# Used by the image build stages (not by hand): stages each image's files under
# STAGE/<image>/ and writes STAGE/<image>.packages, the Debian/Ubuntu packages
# that provide the shared libraries the image's binaries link directly
# (DT_NEEDED), so that the runtime stage installs exactly those; apt adds
# their dependencies. It fails when any library, direct or indirect, does not
# resolve in the build stage.
#
#   stage-binaries.sh BUILD_DIR STAGE_DIR
#
# STAGE_SKIP_PREFIXES: space-separated directories whose libraries are copied
#   in by the Dockerfile itself instead (the GPU image's /opt/libtorch).
# STAGE_IGNORE_MISSING: space-separated sonames allowed to be unresolved at
#   build time because the runtime host injects them (libcuda.so.1).
set -euo pipefail
build=${1:?BUILD_DIR}
stage=${2:?STAGE_DIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
skip_prefixes=${STAGE_SKIP_PREFIXES:-}
ignore_missing=${STAGE_IGNORE_MISSING:-}

all=$(mktemp -d)
bash "$here/install.sh" --build-dir "$build" --prefix /usr/local --destdir "$all" --binaries-only --strip
bin=$all/usr/local/bin

mkdir -p "$stage/common/usr/local/bin" "$stage/common/usr/local/share/trainctl/examples"
install -m 0755 "$here/trainctl-healthcheck" "$stage/common/usr/local/bin/trainctl-healthcheck"
if ls examples/*.yaml >/dev/null 2>&1; then
  install -m 0644 examples/*.yaml "$stage/common/usr/local/share/trainctl/examples/"
fi

# Package owning a library path (merged /usr: try the path as given, its
# canonical form, and the /lib <-> /usr/lib twin).
owner() {
  local p=$1 c
  c=$(readlink -f "$p")
  for q in "$p" "$c" "${p/#\/usr\/lib\//\/lib\/}" "${p/#\/lib\//\/usr\/lib\/}" \
           "${c/#\/usr\/lib\//\/lib\/}" "${c/#\/lib\//\/usr\/lib\/}"; do
    if out=$(dpkg -S "$q" 2>/dev/null); then
      echo "$out" | grep -v '^diversion' | head -n 1 | sed 's/: .*//; s/:[a-z0-9_]*$//; s/,.*//'
      return 0
    fi
  done
  return 1
}

packages_for() {  # binaries... -> package names on stdout
  local missing=0 path soname needed
  # Direct dependencies only: the packages' own Depends bring the rest.
  needed=" $(for f in "$@"; do readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; done | sort -u | tr '\n' ' ') "
  while read -r soname path; do
    if [ "$path" = "not" ]; then
      case " $ignore_missing " in
        *" $soname "*) echo "stage-binaries: $soname unresolved at build time (provided by the host at run time)" >&2 ;;
        *) echo "stage-binaries: $soname: not found" >&2; missing=1 ;;
      esac
      continue
    fi
    case "$needed" in *" $soname "*) ;; *) continue ;; esac
    for pre in $skip_prefixes; do
      case "$path" in "$pre"/*) continue 2 ;; esac
    done
    if ! owner "$path"; then
      echo "stage-binaries: no package owns $path" >&2; missing=1
    fi
  done < <(ldd "$@" | awk '/=>/ { if ($3 == "not") print $1, "not"; else print $1, $3 }' | sort -u)
  return $missing
}

stage_image() {  # image names...
  local image=$1; shift
  local files=()
  mkdir -p "$stage/$image/usr/local/bin"
  for name in "$@"; do
    if [ -x "$bin/$name" ]; then
      install -m 0755 "$bin/$name" "$stage/$image/usr/local/bin/$name"
      files+=("$bin/$name")
    fi
  done
  packages_for "${files[@]}" | sort -u > "$stage/$image.packages"
  echo "stage-binaries: $image: ${files[*]##*/}"
  echo "stage-binaries: $image runtime packages: $(tr '\n' ' ' < "$stage/$image.packages")"
}

stage_image coordinator trainctl-coordinator trainctl
stage_image worker trainctl-worker trainctl-rank trainctl
rm -rf "$all"
