#!/usr/bin/env bash
# The C++ examples of README.md and of the guides (docs/guide/*.md) compile against the
# public headers, as users copy them: each file's ```cpp blocks, in order, as the body of
# one function of its own (later blocks use what earlier ones of the same file declared),
# after a prelude that declares what the prose leaves out.
# (Examples are brief: results they ignore are not warned about.)
# Usage: readme_examples.sh SOURCE_DIR CXX_COMPILER WORK_DIR
set -euo pipefail
src=$1 cxx=$2 work=$3
mkdir -p "$work"
out=$work/readme_examples.cc
files=("$src/README.md")
for f in "$src"/docs/guide/*.md; do
  [ -e "$f" ] && files+=("$f")
done
n=0
{
  echo '#include "distckpt/distckpt.h"'
  echo '#include <cstdint>'
  echo '#include <vector>'
  echo 'double train_step();'
  for f in "${files[@]}"; do
    blocks=$(grep -c '^```cpp' "$f" || true)
    [ "$blocks" -gt 0 ] || continue
    n=$((n + blocks))
    rel=${f#"$src"/}
    name=$(printf '%s' "${rel%.md}" | tr -c 'A-Za-z0-9' '_')
    echo "// ${rel}: ${blocks} cpp block(s), in order"
    echo "void examples_${name}(int rank, int dp, int tp, int64_t hidden, int64_t in, int64_t step, int64_t steps,"
    echo '                     int64_t epoch, double loss, std::vector<float>& w1, std::vector<double>& u,'
    echo '                     double* v_fortran, int64_t nx, int64_t ny) {'
    awk '/^```cpp/{f=1;next} /^```/{f=0} f && !/^#include/' "$f"
    echo '}'
  done
} >"$out"
"$cxx" -std=c++20 -fsyntax-only -Wall -Wno-unused-result -I "$src/include" "$out"
echo "readme examples: $n blocks compile"
