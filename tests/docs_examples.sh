#!/usr/bin/env bash
# The ```python blocks of docs/guide/*.md, run as a reader would run them: each block that
# names no other test (<!-- run-by: TEST --> on the line before it) runs under mpirun -np 4
# (dp=2 x tp=2) after a prelude that makes what the prose leaves out; blocks of one page run
# in one program, in order, so a later block uses what an earlier one made. "/ckpt" becomes
# a fresh directory. Fails when a block neither runs here nor names its test.
# Usage: docs_examples.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
src=$1 build=$2 work=$3
py=${PYTHON:-/usr/bin/python3}
rm -rf "$work" && mkdir -p "$work"
# page -> the blocks (1-based) run together, in groups separated by spaces; groups run as
# separate programs (the numpy example is a program of its own).
declare -A groups=([python]="1,2 3")
status=0
for page in "$src"/docs/guide/*.md; do
  name=$(basename "$page" .md)
  # Every python block either is in a group here or names its test.
  "$py" - "$page" "${groups[$name]:-}" <<'PY' || status=1
import re, sys
text = open(sys.argv[1]).read().split("\n")
grouped = {int(b) for g in sys.argv[2].split() for b in g.split(",")}
n = 0
for i, line in enumerate(text):
    if line.startswith("```python"):
        n += 1
        run_by = i > 0 and text[i - 1].startswith("<!-- run-by:")
        if n not in grouped and not run_by:
            print(f"docs_examples: {sys.argv[1]}: python block {n} (line {i + 1}) is run by no test")
            sys.exit(1)
PY
  for group in ${groups[$name]:-}; do
    script=$work/$name-${group//,/-}.py
    ckpt=$work/ckpt-$name-${group//,/-}
    {
      cat "$src/tests/docs_prelude.py"
      "$py" - "$page" "$group" <<'PY'
import sys
text = open(sys.argv[1]).read().split("\n")
wanted = {int(b) for b in sys.argv[2].split(",")}
n, inside = 0, False
for line in text:
    if line.startswith("```python"):
        n, inside = n + 1, True
        continue
    if inside and line.startswith("```"):
        inside = False
        continue
    if inside and n in wanted:
        print(line)
PY
    } | sed "s#\"/ckpt#\"$ckpt#g" > "$script"
    if env PYTHONPATH="$build/python" DISTCKPT_BUILD_DIR="$build" \
         mpirun --allow-run-as-root --oversubscribe -np 4 "$py" "$script" > "$script.log" 2>&1; then
      echo "docs_examples: $name.md blocks $group ran"
    else
      echo "docs_examples: FAIL: $name.md blocks $group ($script):"; tail -30 "$script.log"; status=1
    fi
  done
done
exit $status
