# shellcheck shell=bash
# Sourced by scripts that rebuild a Debian library from Debian's own source
# package at exactly the installed version (scripts/tsan-abseil.sh,
# scripts/grpc-release.sh). Needs root.
#
#   debian_rebuild_mode WHO "$@"    (sets mode: build, check or force)
#   debian_source_fetch WHO SOURCE VERSION TREE
#
# debian_rebuild_mode reads the scripts' one optional argument (--check,
# --force) and stops, saying why, on anything else or without root.
#
# leaves `apt-get source SOURCE=VERSION` (Debian's patches applied by
# dpkg-source) in the directory TREE, marked with TREE/.trainctl-fetched; a
# no-op when that mark is there. Adds a deb-src entry for the Debian mirror
# apt already uses (/etc/apt/sources.list.d/trainctl-deb-src.sources; or
# $DEBIAN_MIRROR) when there is none, installs dpkg-dev when missing, and
# runs `apt-get update` only when the index lacks VERSION. WHO names the
# caller in messages. Returns non-zero, saying why, when the mirror has no
# source of that version.

# shellcheck disable=SC2034  # mode is the sourcing script's
debian_rebuild_mode() {
  local who=$1
  shift
  mode=build
  case "${1:-}" in
    --check) mode=check ;;
    --force) mode=force ;;
    "") ;;
    *) echo "usage: $who.sh [--check | --force]" >&2; exit 2 ;;
  esac
  if [ "$(id -u)" -ne 0 ]; then
    echo "$who: needs root (apt-get source, /var/cache); run it with sudo" >&2
    exit 1
  fi
}

debian_host_mirror() {  # the Debian (not -security) mirror apt on this host uses
  local m
  m=$(grep -hsE '^[[:space:]]*URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' |
      grep -E '/debian/?$' | head -1 || true)
  if [ -z "$m" ]; then
    m=$(grep -hsE '^[[:space:]]*deb[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
        sed -E 's/\[[^]]*\]//' | awk '{print $2}' | grep -E '/debian/?$' | head -1 || true)
  fi
  echo "${m:-http://deb.debian.org/debian}"
}

debian_has_deb_src() {
  grep -hsqE '^[[:space:]]*Types:.*deb-src' /etc/apt/sources.list.d/*.sources ||
    grep -hsqE '^[[:space:]]*deb-src[[:space:]]' /etc/apt/sources.list /etc/apt/sources.list.d/*.list
}

debian_source_fetch() {
  local who=$1 source=$2 version=$3 tree=$4
  if [ -f "$tree/.trainctl-fetched" ]; then
    echo "source: $tree (fetched before)"
    return 0
  fi
  if ! debian_has_deb_src; then
    local mirror=${DEBIAN_MIRROR:-$(debian_host_mirror)} codename
    # shellcheck disable=SC1091  # Debian's own file
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
    echo "adding deb-src $mirror $codename main: /etc/apt/sources.list.d/trainctl-deb-src.sources"
    cat >/etc/apt/sources.list.d/trainctl-deb-src.sources <<EOF
# Written by trainctl scripts/$who.sh: Debian's source packages
# (apt-get source $source) from the mirror apt already uses.
Types: deb-src
URIs: $mirror
Suites: $codename $codename-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  fi
  if ! command -v dpkg-source >/dev/null; then
    nice -n 19 apt-get install -y -qq --no-install-recommends dpkg-dev
  fi
  # (No `| grep -q` under pipefail: grep stopping early would fail the pipe.)
  if ! apt-cache showsrc "$source" 2>/dev/null | grep -x "Version: $version" >/dev/null; then
    nice -n 19 apt-get update -qq
  fi
  if ! apt-cache showsrc "$source" 2>/dev/null | grep -x "Version: $version" >/dev/null; then
    echo "$who: the mirror has no source for $source $version (the installed version);" \
         "apt-get source $source would build another version" >&2
    return 1
  fi
  local tmp=$tree.tmp dir
  rm -rf "$tmp"
  mkdir -p "$tmp"
  # dpkg-source -x (run by apt-get source) applies debian/patches.
  (cd "$tmp" && nice -n 19 apt-get source -q --only-source "$source=$version")
  dir=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d -name "$source-*" | head -1)
  [ -n "$dir" ] || { echo "$who: apt-get source made no $source-* directory" >&2; return 1; }
  touch "$dir/.trainctl-fetched"
  rm -rf "$tree"
  mkdir -p "$(dirname "$tree")"
  mv "$dir" "$tree"
  rm -rf "$tmp"
  echo "source: $tree"
}
