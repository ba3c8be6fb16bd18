#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each on a scratch copy of its seed corpus and prints
# the executions per target; fails on the first crash, leak or sanitizer report (the
# reproducer is left in OUT_DIR).
#   bash fuzz/run.sh BUILD_DIR [SECONDS] [OUT_DIR]
set -euo pipefail
build=${1:?usage: fuzz/run.sh BUILD_DIR [SECONDS] [OUT_DIR]}
seconds=${2:-30}
out=${3:-$(mktemp -d)}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for target in index ckpt safetensors hdf5_meta latest tier_record; do
  corpus="$out/corpus-$target"
  rm -rf "$corpus" && cp -r "$here/corpus/$target" "$corpus"
  log="$out/fuzz_$target.log"
  if ! "$build/fuzz/fuzz_$target" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 \
       -artifact_prefix="$out/crash-$target-" -print_final_stats=1 "$corpus" > "$log" 2>&1; then
    tail -n 40 "$log"
    echo "fuzz_$target: FAILED (reproducer: $out/crash-$target-*)"
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  echo "fuzz_$target: $runs executions in ${seconds} s, no crash ($(ls "$corpus" | wc -l) corpus inputs)"
done
