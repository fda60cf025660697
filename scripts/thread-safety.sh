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

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
list="$work/list"
# LibTorch's headers are most of a heavy file's parse: they are parsed once
# into a clang precompiled header with the defines and -isystem paths every
# file shares (a file's extra defines, such as TRAINCTL_HAVE_GLOO, are
# allowed on top) and the files that include the heavy headers are analysed
# with it (-include-pch); when that header cannot be made, each file parses
# them itself.
python3 - "$db" "$clangxx" "$work" >"$list" <<'EOF'
import json, re, shlex, sys
db, clangxx, work = sys.argv[1], sys.argv[2], sys.argv[3]
seen = set()
units = []
for e in json.load(open(db)):
    args = e["arguments"] if "arguments" in e else shlex.split(e["command"])
    if not any("torch" in a for a in args) or e["file"] in seen:
        continue
    seen.add(e["file"])
    keep, i = [], 1
    while i < len(args):
        a = args[i]
        if a in ("-isystem", "-I", "-D", "-include") and i + 1 < len(args):
            # Not CMake's precompiled <torch/torch.h> (cmake/TorchPch.cmake):
            # it is gcc's; clang reads the headers itself.
            if not (a == "-include" and args[i + 1].endswith("cmake_pch.hxx")):
                keep += [a, args[i + 1]]
            i += 2
            continue
        if a.startswith(("-D", "-I", "-std=")):
            keep.append(a)
        i += 1
    units.append((e["directory"], e["file"], keep))


def shared(keep):  # a file's -D, -std and -isystem options, as a set
    out, i = set(), 0
    while i < len(keep):
        if keep[i] == "-isystem":
            out.add(("-isystem", keep[i + 1]))
            i += 2
            continue
        if keep[i].startswith(("-D", "-std=")):
            out.add((keep[i],))
        i += 1
    return out


if units:
    common = sorted(set.intersection(*(shared(k) for _, _, k in units)))
    header = work + "/torch_pch.h"
    with open(header, "w") as f:
        f.write("#include <torch/torch.h>\n")
    cmd = [clangxx] + [x for o in common for x in o] + ["-x", "c++-header", header,
                                                       "-o", work + "/torch.pch"]
    with open(work + "/pch_cmd", "w") as f:
        f.write(shlex.join(cmd))
# As in cmake/TorchPch.cmake: only a file that includes one of LibTorch's
# heavy headers itself gains; for the others loading it costs more than
# the light headers they include.
with open("cmake/torch-heavy-headers.txt") as f:
    heavy = re.compile("#include <(%s)>" % "|".join(re.escape(h) for h in f.read().split()))
for directory, file, keep in units:
    cmd = [clangxx] + keep + ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety",
                              "-Wno-unknown-warning-option", file]
    with open(file, errors="replace") as f:
        pch = " PCH_ARGS" if heavy.search(f.read()) else ""
    sys.stdout.write("cd %s && %s%s\0" % (shlex.quote(directory), shlex.join(cmd), pch))
EOF
count=$(tr -cd '\0' <"$list" | wc -c)
if [ "$count" -eq 0 ]; then
  echo "thread-safety: no LibTorch translation units in $db (a build without LibTorch?)" >&2
  exit 2
fi
if bash -c "$(cat "$work/pch_cmd")"; then
  sed -i "s| PCH_ARGS| -include-pch $work/torch.pch|g" "$list"
  how="LibTorch's headers precompiled"
else
  echo "thread-safety: the precompiled header could not be made; each file parses LibTorch itself"
  sed -i "s| PCH_ARGS||g" "$list"
  how="no precompiled header"
fi
echo "thread-safety: analysing $count LibTorch translation units with $clangxx ($how)"
xargs -0 -P "$jobs" -n 1 bash -c <"$list"
echo "thread-safety: no findings"
