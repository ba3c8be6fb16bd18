#!/usr/bin/env python3
"""The shape of the tree, checked (run by .ci/run):

- no file under src/, include/ or python/ over 600 lines;
- no include that goes up a floor (cmake/floors.txt: a file of src/<floor>/ includes
  "<floor'>/..." only for floor' at or below its own);
- every folder of src/ is a floor of cmake/floors.txt and named in docs/design.md's map.

With --functions it lists the functions over 150 lines (universal-ctags, lambdas counted
inside their function) and fails on any: not yet part of .ci/run, since eleven are still
longer (load, restore_one and resume_global the longest).

    python3 scripts/check_structure.py [--functions]
"""
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES, MAX_FUNCTION = 600, 150


def floors():
    with open(os.path.join(ROOT, "cmake", "floors.txt")) as f:
        return [l.strip() for l in f if l.strip() and not l.startswith("#")]


def sources(*patterns):
    for pattern in patterns:
        yield from sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True))


def main():
    problems = []
    order = floors()
    rank = {f: i for i, f in enumerate(order)}
    for path in sources("src/**/*.cc", "src/**/*.h", "include/**/*.h", "python/**/*.py", "python/**/*.cc",
                        "python/**/*.h"):
        with open(path) as f:
            lines = f.read().split("\n")
        rel = os.path.relpath(path, ROOT)
        if len(lines) - 1 > MAX_LINES:
            problems.append(f"{rel}: {len(lines) - 1} lines (at most {MAX_LINES})")
        if rel.startswith("src/"):
            floor = rel.split("/")[1]
            for n, line in enumerate(lines, 1):
                m = re.match(r'#include "([a-z_]+)/', line)
                if m and m.group(1) in rank and rank[m.group(1)] > rank.get(floor, -1):
                    problems.append(f"{rel}:{n}: floor '{floor}' includes from '{m.group(1)}', a floor above it")
    with open(os.path.join(ROOT, "docs", "design.md")) as f:
        design = f.read()
    for folder in sorted(os.listdir(os.path.join(ROOT, "src"))):
        if not os.path.isdir(os.path.join(ROOT, "src", folder)):
            continue
        if folder not in rank:
            problems.append(f"src/{folder}/: not a floor of cmake/floors.txt")
        if f"src/{folder}/" not in design:
            problems.append(f"src/{folder}/: missing from the map in docs/design.md")
    if "--functions" in sys.argv[1:]:
        problems += long_functions()
    for p in problems:
        print("structure:", p)
    if problems:
        sys.exit(1)
    print(f"structure: {len(order)} floors; files, includes and the design map in order")


def long_functions():
    out = subprocess.run(["ctags", "-x", "--_xformat=%N %n %e %F", "--fields=+ne", "--kinds-C++=f", "-R",
                          os.path.join(ROOT, "src"), os.path.join(ROOT, "include")],
                         capture_output=True, text=True, check=True).stdout
    long = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 4 or not parts[1].isdigit() or not parts[2].isdigit():
            continue
        name, start, end, path = parts[0], int(parts[1]), int(parts[2]), parts[3]
        if end - start + 1 > MAX_FUNCTION:
            long.append(f"{os.path.relpath(path, ROOT)}:{start}: {name} is {end - start + 1} lines "
                        f"(at most {MAX_FUNCTION})")
    return long


if __name__ == "__main__":
    main()
