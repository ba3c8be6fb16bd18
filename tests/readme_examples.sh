#!/usr/bin/env bash
# The C++ examples of README.md and of the guides (docs/guide/*.md) compile against the
# public headers, as users copy them: each file's ```cpp blocks, in order, as the body of
# one function of its own (later blocks use what earlier ones of the same file declared),
# after a prelude that declares what the prose leaves out. Warnings are errors, as in a
# strict consumer's build (tests/install_consumer): every example handles what it gets.
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
    echo "void examples_${name}([[maybe_unused]] int rank, [[maybe_unused]] int dp, [[maybe_unused]] int tp,"
    echo '    [[maybe_unused]] int64_t hidden, [[maybe_unused]] int64_t in, [[maybe_unused]] int64_t step,'
    echo '    [[maybe_unused]] int64_t steps, [[maybe_unused]] int64_t epoch, [[maybe_unused]] double loss,'
    echo '    [[maybe_unused]] std::vector<float>& w1, [[maybe_unused]] std::vector<double>& u,'
    echo '    [[maybe_unused]] double* v_fortran, [[maybe_unused]] int64_t nx, [[maybe_unused]] int64_t ny) {'
    awk '/^```cpp/{f=1;next} /^```/{f=0} f && !/^#include/' "$f"
    echo '}'
  done
} >"$out"
# The standard and OMPI_SKIP_MPICXX are what the distckpt::distckpt target gives a consumer.
"$cxx" -std=c++20 -DOMPI_SKIP_MPICXX=1 -fsyntax-only -Wall -Wextra -Werror -I "$src/include" "$out"
echo "readme examples: $n blocks compile"
