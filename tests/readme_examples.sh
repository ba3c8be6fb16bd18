#!/usr/bin/env bash
# The C++ examples in README.md compile against the public headers, as users copy them:
# every ```cpp block, in order, as the body of one function (later blocks use what
# earlier ones declared), after a prelude that declares what the prose leaves out.
# (Examples are brief: results they ignore are not warned about.)
# Usage: readme_examples.sh SOURCE_DIR CXX_COMPILER WORK_DIR
set -euo pipefail
src=$1 cxx=$2 work=$3
mkdir -p "$work"
out=$work/readme_examples.cc
{
  echo '#include "distckpt/distckpt.h"'
  echo '#include <cstdint>'
  echo '#include <vector>'
  echo 'double train_step();'
  echo 'void readme_examples(int rank, int dp, int tp, int64_t hidden, int64_t in, int64_t step, int64_t steps,'
  echo '                     int64_t epoch, double loss, std::vector<float>& w1, std::vector<double>& u,'
  echo '                     double* v_fortran, int64_t nx, int64_t ny) {'
  awk '/^```cpp/{f=1;next} /^```/{f=0} f && !/^#include/' "$src/README.md"
  echo '}'
} >"$out"
n=$(grep -c '^```cpp' "$src/README.md")
"$cxx" -std=c++20 -fsyntax-only -Wall -Wno-unused-result -I "$src/include" "$out"
echo "readme examples: $n blocks compile"
