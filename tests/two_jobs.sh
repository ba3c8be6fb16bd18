#!/usr/bin/env bash
# Two jobs in one checkpoint directory, and the collection of abandoned saves.
#
# 1. Two train_mlp jobs (DISTCKPT_JOB_ID a and b, as a requeued Slurm job keeps its
#    SLURM_JOB_ID) save into one root at the same time, each collecting the other's
#    leftovers before every save: both finish; each series is whole (keep-max 3 each:
#    retention never removed the other's checkpoints); every checkpoint verifies; no two
#    share a commit sequence number; `latest` names the highest.
# 2. Each job's --resume takes its own series' newest, though the other's is newer.
# 3. A save killed (kill -9, the whole job) just before its commit leaves a temporary
#    entry with its dead owner's record; `distckpt gc` killed -9 half way through
#    removing it leaves it collectable; the next gc removes it; nothing else is touched.
# Usage: two_jobs.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
work=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpirun=(mpirun --oversubscribe --bind-to none)
train=("$build/train_mlp" --dp 1 --tp 2 --save-every 2 --keep-max 3 --log-every 1000)
dc=$build/distckpt
root=$work/root
rm -rf "$work"
mkdir -p "$root"
die() { echo "two jobs: FAIL: $*"; exit 1; }

echo "== 1. two jobs save into one root at once"
DISTCKPT_JOB_ID=a "${mpirun[@]}" -np 2 "${train[@]}" --steps 40 --dir "$root" >"$work/a.log" 2>&1 &
a=$!
DISTCKPT_JOB_ID=b "${mpirun[@]}" -np 2 "${train[@]}" --steps 30 --dir "$root" >"$work/b.log" 2>&1 &
b=$!
wait "$a" || { cat "$work/a.log"; die "job a failed"; }
wait "$b" || { cat "$work/b.log"; die "job b failed"; }
"$dc" ls --json "$root" >"$work/ls.json"
python3 - "$work/ls.json" <<'PY' || die "listing"
import json, sys, re
ls = json.load(open(sys.argv[1]))
committed = [e for e in ls["entries"] if e["state"] == "committed"]
others = [e for e in ls["entries"] if e["state"] != "committed"]
assert not others, f"not committed: {others}"
series = {}
for e in committed:
    prefix, step = re.fullmatch(r"(step(?:_\d+)?)-(\d+)", e["name"]).groups()
    series.setdefault(prefix, []).append(int(step))
assert len(series) == 2, series
ends = sorted(max(v) for v in series.values())
assert ends == [30, 40], series
for prefix, steps in series.items():
    top = max(steps)
    assert sorted(steps) == [top - 4, top - 2, top], f"{prefix}: {sorted(steps)} (keep-max 3 each)"
seqs = [e["commit_seq"] for e in committed]
assert len(set(seqs)) == len(seqs), f"shared commit sequence numbers: {seqs}"
newest = max(committed, key=lambda e: e["commit_seq"])
assert ls["latest"] == newest["name"], f"latest {ls['latest']} != highest {newest['name']}"
print("series:", {k: sorted(v) for k, v in series.items()}, "latest:", ls["latest"])
PY
for d in "$root"/step*; do "$dc" verify "$d" >/dev/null || die "$d does not verify"; done
prefix_a=$(grep -o 'step[_0-9]*-40' <<<"$(ls "$root")" | sed 's/-40$//')
prefix_b=$(grep -o 'step[_0-9]*-30' <<<"$(ls "$root")" | sed 's/-30$//')

echo "== 2. each job resumes its own series"
DISTCKPT_JOB_ID=b "${mpirun[@]}" -np 2 "${train[@]}" --steps 32 --dir "$root" --resume >"$work/rb.log" 2>&1 ||
  { cat "$work/rb.log"; die "resume b"; }
grep -q "resumed from $root/$prefix_b-30" "$work/rb.log" || { cat "$work/rb.log"; die "b did not resume its own series"; }
DISTCKPT_JOB_ID=a "${mpirun[@]}" -np 2 "${train[@]}" --steps 42 --dir "$root" --resume >"$work/ra.log" 2>&1 ||
  { cat "$work/ra.log"; die "resume a"; }
grep -q "resumed from $root/$prefix_a-40" "$work/ra.log" || { cat "$work/ra.log"; die "a did not resume its own series"; }

echo "== 3. a killed save, a killed gc, and the gc after them"
DISTCKPT_PAUSE_AT=commit-rename "${mpirun[@]}" -np 2 "${train[@]}" --steps 46 --dir "$root" --resume \
  >"$work/killed.log" 2>&1 &
job=$!
for _ in $(seq 600); do grep -q "paused at kill point commit-rename" "$work/killed.log" && break; sleep 0.1; done
grep -q "paused at kill point" "$work/killed.log" || die "the save never reached its commit"
pkill -KILL -f "train_mlp.*--steps 46" || true
wait "$job" || true
for _ in $(seq 100); do pgrep -f "train_mlp.*--steps 46" >/dev/null || break; sleep 0.1; done
left=$(find "$root" -maxdepth 1 -name '*.tmp-*')
[ -n "$left" ] || die "the killed save left no temporary entry"
DISTCKPT_PAUSE_AT=gc-removing "$dc" gc "$root" >"$work/gc2.log" 2>&1 &
gcpid=$!
for _ in $(seq 100); do grep -q "paused at kill point gc-removing" "$work/gc2.log" && break; sleep 0.1; done
grep -q "paused" "$work/gc2.log" || { cat "$work/gc2.log"; die "gc never removed anything"; }
kill -KILL "$gcpid"
wait "$gcpid" 2>/dev/null || true
[ -e "$left/.distckpt-owner.json" ] || die "a killed gc lost the owner record first"
"$dc" gc "$root" | tee "$work/gc3.log"
[ ! -e "$left" ] || die "the abandoned save is still there"
for d in "$root"/step*; do "$dc" verify "$d" >/dev/null || die "$d does not verify after gc"; done
echo "two jobs: all checks passed"
