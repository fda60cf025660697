#!/usr/bin/env bash
# clang's thread-safety analysis over the code only the LibTorch build
# compiles (worker/engine, worker/dist, worker/trainer, their tests and
# tools): every translation unit of build/compile_commands.json that
# includes LibTorch is parsed again by clang with -fsyntax-only
# -Werror=thread-safety and the build's own defines and include paths (no
# code is generated, so it costs a parse per file). The clang builds
# (build-asan, build-tsan) analyse everything else; together the analysis
# covers all of trainctl's code. Exits non-zero when any file has a
# finding, after printing clang's diagnostics for every file.
#
#   scripts/thread-safety.sh            # after `cmake --build build` (scripts/test.sh runs it)
#   BUILD=build-other scripts/thread-safety.sh
#
# Environment: BUILD (build), JOBS (2), CLANGXX (clang++).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
cd "$src"
build=${BUILD:-build}
jobs=${JOBS:-2}
clangxx=${CLANGXX:-clang++}
db="$build/compile_commands.json"
if [ ! -f "$db" ]; then
  echo "thread-safety: $db not found: configure and build $build first" >&2
  exit 2
fi

list=$(mktemp)
trap 'rm -f "$list"' EXIT
# One NUL-separated shell command per LibTorch translation unit: the build's
# -D, -I, -isystem and -std arguments, nothing of gcc's code generation.
python3 - "$db" "$clangxx" >"$list" <<'EOF'
import json, shlex, sys
db, clangxx = sys.argv[1], sys.argv[2]
seen = set()
for e in json.load(open(db)):
    args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
    if not any("torch" in a for a in args) or e["file"] in seen:
        continue
    seen.add(e["file"])
    keep, i = [], 1
    while i < len(args):
        a = args[i]
        if a in ("-isystem", "-I", "-D", "-include") and i + 1 < len(args):
            keep += [a, args[i + 1]]
            i += 2
            continue
        if a.startswith(("-D", "-I", "-std=")):
            keep.append(a)
        i += 1
    cmd = [clangxx] + keep + ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
                              "-Wno-unknown-warning-option", e["file"]]
    sys.stdout.write("cd %s && %s\0" % (shlex.quote(e["directory"]), shlex.join(cmd)))
EOF
count=$(tr -cd '\0' <"$list" | wc -c)
if [ "$count" -eq 0 ]; then
  echo "thread-safety: no LibTorch translation units in $db (a build without LibTorch?)" >&2
  exit 2
fi
echo "thread-safety: analysing $count LibTorch translation units with $clangxx"
xargs -0 -P "$jobs" -n 1 bash -c <"$list"
echo "thread-safety: no findings"
