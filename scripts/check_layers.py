#!/usr/bin/python3
"""Checks that each coordinator folder includes only the folders it links.

Usage: check_layers.py COORDINATOR_DIR NAME=DEP,DEP ... (from coordinator/
CMakeLists.txt: each folder's library and the folders it links). A file in
folder F may include coordinator/G/... when G is F or a folder F links,
directly or through the folders it links. Exit status 1 names every crossing.
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"coordinator/([a-z_]+)/')


def closure(links):
    reach = {}

    def visit(name, path):
        if name in reach:
            return reach[name]
        if name in path:
            sys.exit("check_layers: the folders link in a cycle: " + " -> ".join(path + [name]))
        if name not in links:
            sys.exit(f"check_layers: '{name}' is linked but is not a coordinator folder")
        out = set()
        for dep in links[name]:
            out.add(dep)
            out |= visit(dep, path + [name])
        reach[name] = out
        return out

    for name in links:
        visit(name, [])
    return reach


def main():
    root = sys.argv[1]
    links = {}
    for arg in sys.argv[2:]:
        name, _, deps = arg.partition("=")
        links[name] = [d for d in deps.split(",") if d]
    reach = closure(links)
    crossings = []
    for entry in sorted(os.listdir(root)):
        folder = os.path.join(root, entry)
        if not os.path.isdir(folder):
            continue
        if entry not in links:
            crossings.append(f"coordinator/{entry}/: a folder with no library in coordinator/CMakeLists.txt")
            continue
        for dirpath, _, files in os.walk(folder):
            for f in sorted(files):
                if not f.endswith((".h", ".cc")):
                    continue
                path = os.path.join(dirpath, f)
                with open(path, encoding="utf-8") as src:
                    for n, line in enumerate(src, 1):
                        m = INCLUDE.match(line)
                        if m and m.group(1) != entry and m.group(1) not in reach[entry]:
                            rel = os.path.relpath(path, os.path.dirname(root))
                            crossings.append(f"{rel}:{n}: includes coordinator/{m.group(1)}/, "
                                             f"which coordinator/{entry}/ does not link")
    for c in crossings:
        print(c)
    if crossings:
        return 1
    print(f"check_layers: {len(links)} folders, every include within what its folder links")
    return 0


if __name__ == "__main__":
    sys.exit(main())
