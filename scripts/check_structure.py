#!/usr/bin/env python3
"""The shape of the tree, checked (run by .ci/run). It fails on:

- a file under src/, include/ or python/ over 600 lines;
- a function over 150 lines (universal-ctags --fields=+ne; a lambda's lines are inside its
  function's) in src/, include/ or python/; in tests, benchmarks and examples too, except
  those in cmake/long_functions_allowed.txt, a list that may only shrink (an entry that is
  no longer over the limit, or no longer there, fails until it is removed);
- an include that goes up a floor (cmake/floors.txt): a file of src/<floor>/, or a public
  header of that floor, includes "<floor'>/..." or "distckpt/<header of floor'>" only for
  floor' at or below its own; every public header is on a floor;
- a folder of src/ that is not a floor, or is missing from the map in docs/design.md.

    python3 scripts/check_structure.py
"""
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES, MAX_FUNCTION = 600, 150
ALLOWED = os.path.join("cmake", "long_functions_allowed.txt")


def floors():
    """The floors in order, and the floor of each public header."""
    order, header_floor = [], {}
    with open(os.path.join(ROOT, "cmake", "floors.txt")) as f:
        for line in f:
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            order.append(words[0])
            for header in words[1:]:
                header_floor[header] = words[0]
    return order, header_floor


def sources(*patterns):
    for pattern in patterns:
        yield from sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True))


def floor_of(rel, header_floor):
    if rel.startswith("src/"):
        return rel.split("/")[1]
    if rel.startswith("include/distckpt/"):
        return header_floor.get(os.path.basename(rel))
    return None


def check_files_and_includes(order, header_floor):
    problems = []
    rank = {f: i for i, f in enumerate(order)}
    for header in sorted(glob.glob(os.path.join(ROOT, "include", "distckpt", "*.h"))):
        if os.path.basename(header) not in header_floor:
            problems.append(f"include/distckpt/{os.path.basename(header)}: on no floor of cmake/floors.txt")
    for path in sources("src/**/*.cc", "src/**/*.h", "include/**/*.h", "python/**/*.py", "python/**/*.cc",
                        "python/**/*.h"):
        with open(path) as f:
            lines = f.read().split("\n")
        rel = os.path.relpath(path, ROOT)
        if len(lines) - 1 > MAX_LINES:
            problems.append(f"{rel}: {len(lines) - 1} lines (at most {MAX_LINES})")
        floor = floor_of(rel, header_floor)
        if floor is None:
            continue
        for n, line in enumerate(lines, 1):
            m = re.match(r'#include "([a-z_]+)/([a-z_0-9]+\.h)"', line)
            if not m:
                continue
            target = header_floor.get(m.group(2)) if m.group(1) == "distckpt" else m.group(1)
            if target in rank and rank[target] > rank.get(floor, -1):
                problems.append(f"{rel}:{n}: floor '{floor}' includes {m.group(1)}/{m.group(2)} "
                                f"of floor '{target}', above it")
    return problems


def check_design_map(order):
    problems = []
    with open(os.path.join(ROOT, "docs", "design.md")) as f:
        design = f.read()
    for folder in sorted(os.listdir(os.path.join(ROOT, "src"))):
        if not os.path.isdir(os.path.join(ROOT, "src", folder)):
            continue
        if folder not in order:
            problems.append(f"src/{folder}/: not a floor of cmake/floors.txt")
        if f"src/{folder}/" not in design:
            problems.append(f"src/{folder}/: missing from the map in docs/design.md")
    return problems


def long_functions():
    """(path, name, start, lines) of every function over the limit."""
    out = subprocess.run(["ctags", "-x", "--_xformat=%N %n %e %F", "--fields=+ne", "--kinds-C++=f",
                          "--kinds-Python=fm", "--languages=C++,Python", "-R", "src", "include", "python", "tests",
                          "bench", "examples", "mpi_tests", "fuzz"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 4 or not parts[1].isdigit() or not parts[2].isdigit():
            continue
        name, start, end, path = parts[0], int(parts[1]), int(parts[2]), parts[3]
        if end - start + 1 > MAX_FUNCTION:
            found.append((os.path.normpath(path), name, start, end - start + 1))
    return found


def check_functions():
    problems = []
    with open(os.path.join(ROOT, ALLOWED)) as f:
        allowed = {l.strip() for l in f if l.strip() and not l.startswith("#")}
    seen = set()
    for path, name, start, lines in long_functions():
        key = f"{path}:{name}"
        if key in allowed and not path.startswith(("src/", "include/", "python/")):
            seen.add(key)
            continue
        problems.append(f"{path}:{start}: {name} is {lines} lines (at most {MAX_FUNCTION})")
    for key in sorted(allowed - seen):
        problems.append(f"{ALLOWED}: '{key}' is no longer over {MAX_FUNCTION} lines (or not there): "
                        "remove it (the list only shrinks)")
    return problems, len(seen)


def main():
    order, header_floor = floors()
    problems = check_files_and_includes(order, header_floor) + check_design_map(order)
    function_problems, allowed = check_functions()
    problems += function_problems
    for p in problems:
        print("structure:", p)
    if problems:
        sys.exit(1)
    print(f"structure: {len(order)} floors; files, functions ({allowed} allowed in tests, benchmarks and "
          f"examples), includes and the design map in order")


if __name__ == "__main__":
    main()
