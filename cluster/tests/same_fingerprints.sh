#!/usr/bin/env bash
# train_mlp at DP2 x TP2 on two hosts (2 ranks each, TCP between them, shared memory
# within) reaches exactly the state of the same run on one host, saves and resumes
# across hosts, and stats.jsonl says what each host wrote and how long it took.
#   same_fingerprints.sh BUILD_DIR
source "$(dirname "$0")/lib.sh" "$1" same_fingerprints
skip_unless_possible
fresh_hosts h1 h2
root=$shared/same_fingerprints
rm -rf "$root" "$root.one"
train=("$build/train_mlp" --dp 2 --tp 2 --save-every 6 --log-every 100 $TRAIN_SHAPE)

run_job two h1:2,h2:2 4 "${train[@]}" --steps 12 --dir /dck/shared/same_fingerprints || { show_log two; fail "two-host run"; }
run_job two_resume h1:2,h2:2 4 "${train[@]}" --steps 15 --resume --dir /dck/shared/same_fingerprints ||
  { show_log two_resume; fail "two-host resume"; }
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 "${train[@]}" --steps 12 --dir "$root.one" \
  >"$log_dir/one.log" 2>&1 || { cat "$log_dir/one.log"; fail "one-host run"; }
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4 "${train[@]}" --steps 15 --resume --dir "$root.one" \
  >"$log_dir/one_resume.log" 2>&1 || { cat "$log_dir/one_resume.log"; fail "one-host resume"; }

fingerprints() { grep -hE '^(saved|restored|final) step' "$@"; }
fingerprints "$log_dir/two.log" "$log_dir/two_resume.log" >"$log_dir/two.fp"
fingerprints "$log_dir/one.log" "$log_dir/one_resume.log" >"$log_dir/one.fp"
cat "$log_dir/two.fp"
[ "$(wc -l <"$log_dir/two.fp")" -ge 6 ] || fail "too few fingerprints printed"
diff "$log_dir/one.fp" "$log_dir/two.fp" || fail "two hosts and one host disagree"
say "fingerprints: two hosts = one host ($(wc -l <"$log_dir/two.fp") lines)"

# Where the ranks ran: each host wrote its ranks' share of every checkpoint.
python3 - "$root/stats.jsonl" <<'PY' || fail "stats.jsonl has no per-host figures"
import json, sys
lines = [j for j in map(json.loads, open(sys.argv[1])) if "event" not in j]  # saves, not the resume
assert len(lines) == 3, f"{len(lines)} saves recorded, expected 3"
for j in lines:
    hosts = j["hosts"]
    names = [h["host"] for h in hosts]
    assert names == ["h1", "h2"], f"step {j['step']}: hosts {names}"
    assert all(h["ranks"] == 2 and h["bytes"] > 0 and h["write_s"] >= 0 for h in hosts), hosts
    assert sum(h["bytes"] for h in hosts) == j["bytes"], (hosts, j["bytes"])
    assert max(h["write_s"] for h in hosts) == j["write_s_slowest_rank"], j
    print(f"step {j['step']}: " + ", ".join(f"{h['host']} {h['bytes']} bytes in {h['write_s']:.4f} s" for h in hosts))
PY
"$build/distckpt" verify "$root" >/dev/null || fail "verify"
say "ok"
