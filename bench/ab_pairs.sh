#!/usr/bin/env bash
# Old against new: two builds' ckpt_bench alternate (ABAB..., PAIRS pairs) on the same
# directory, 1 GiB at DP2 x TP2 on 4 ranks, and the median of the per-pair ratios
# new/old is printed for save and load. A refactoring that leaves speed alone gives
# medians within 0.97-1.03. Alternation cancels slow drifts of the machine (page cache,
# thermal, other tenants) that would bias "all of A, then all of B".
# Usage: ab_pairs.sh OLD_BUILD NEW_BUILD DIR [PAIRS=7] [SIZE=1G]
set -euo pipefail
old=$1 new=$2 dir=$3 pairs=${4:-7} size=${5:-1G}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
run() {  # prints "save_s load_s" of one run of build $1
  rm -rf "$dir/ab_pairs"
  mpirun -np 4 "$1/ckpt_bench" --size "$size" --tp 2 --dir "$dir/ab_pairs" --json 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; r=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(r["save_s"], r["load_s"])'
}
results=$(mktemp)
run "$old" >/dev/null  # warm-up: first touch of the directory and the page cache
for i in $(seq "$pairs"); do
  echo "$(run "$old") $(run "$new")" >>"$results"
done
rm -rf "$dir/ab_pairs"
/usr/bin/python3 - "$results" "$dir" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1]) if l.strip()]
for name, a, b in (("save", 0, 2), ("load", 1, 3)):
    ratios = [r[b] / r[a] for r in rows]
    print(f"ab_pairs {sys.argv[2]}: {name} new/old time, median of {len(rows)} pairs: "
          f"{statistics.median(ratios):.3f} (pairs: {' '.join(f'{x:.2f}' for x in ratios)})")
PY
rm -f "$results"
