#!/usr/bin/env bash
# `distckpt rm` and the node-local tier on one node: removing a checkpoint removes its
# node-local copy's record too (else the next resume restores the removed checkpoint from
# the local tier), a local-only checkpoint can be removed by name, and `ls --json` gives
# every entry a format.
# Usage: local_tier_cli.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1
work=$2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
local_dir=/dev/shm/distckpt-local-tier-cli-$$
trap 'rm -rf "$local_dir"' EXIT
rm -rf "$work" "$local_dir"
mkdir -p "$work"
train=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 "$build/train_mlp" --dp 1 --tp 2
       --dir "$work/root" --local-dir "$local_dir" --local-every 5 --global-every 2)
dc=$build/distckpt
"${train[@]}" --steps 20 > "$work/train.log" 2>&1
"$dc" ls "$work/root"
# step-20 is local and global, step-15 local only.
"$dc" ls --json "$work/root" | python3 -c '
import json, sys
entries = {e["name"]: e for e in json.load(sys.stdin)["entries"]}
assert entries["step-15"]["tiers"] == ["local"] and entries["step-20"]["tiers"] == ["local", "global"], entries
assert all("format" in e for e in entries.values()), "an entry without a format"'
out=$("$dc" rm "$work/root" step-20)
echo "$out"
grep -q "removed step-20 and its node-local copy" <<<"$out" || { echo "FAIL: the local copy was not named"; exit 1; }
# A drain of step-15 in flight (its tmp entry in the root): the record stays.
mkdir "$work/root/step-15.tmp-0123456789abcdef"
rc=0
"$dc" rm "$work/root" step-15 2> "$work/busy.err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "is in flight" "$work/busy.err" || { cat "$work/busy.err"; echo "FAIL: removed under a drain"; exit 1; }
rmdir "$work/root/step-15.tmp-0123456789abcdef"
out=$("$dc" rm "$work/root" step-15)
echo "$out"
grep -q "removed step-15 (node-local only" <<<"$out" || { echo "FAIL: a local-only checkpoint was not removed"; exit 1; }
rc=0
"$dc" rm "$work/root" step-15 2> "$work/again.err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "no committed checkpoint 'step-15'" "$work/again.err" || { echo "FAIL: removed twice"; exit 1; }
"$dc" ls "$work/root"
"${train[@]}" --steps 22 --resume > "$work/resume.log" 2>&1
grep -q "resumed from $work/root/step-10\$" "$work/resume.log" ||
  { cat "$work/resume.log"; echo "FAIL: the resume did not skip the removed checkpoints"; exit 1; }
echo "local tier cli: ok"
