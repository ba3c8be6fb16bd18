#!/usr/bin/env bash
# SIGUSR1 to mpirun on a two-host job (what a batch script's trap does when Slurm
# signals it): mpirun forwards it to every rank on every host, the checkpoint manager
# finishes the step, every rank on both hosts writes its share of a "*_breakpoint"
# checkpoint, the job exits 0, and a new job resumes from exactly that state.
#   signal.sh BUILD_DIR
source "$(dirname "$0")/lib.sh" "$1" signal
skip_unless_possible
fresh_hosts h1 h2
root=$shared/signal
rm -rf "$root"
mkdir -p "$root"
start_job train h1:2,h2:2 4 "$build/train_mlp" --dp 2 --tp 2 --steps 100000000 --save-every 0 --log-every 20 \
  $TRAIN_SHAPE --dir /dck/shared/signal
wait_log train "^step 40 loss" 60 || { show_log train; fail "the job did not start training"; }
mpirun_pid=
for p in $(bash "$netns" pids h1); do [ "$(cat /proc/"$p"/comm 2>/dev/null)" = mpirun ] && mpirun_pid=$p; done
[ -n "$mpirun_pid" ] || fail "no mpirun on h1"
kill -USR1 "$mpirun_pid"
say "SIGUSR1 to mpirun (pid $mpirun_pid)"
rc=$(wait_job train 60) || { show_log train; fail "the job did not stop within 60 s of the signal"; }
[ "$rc" = 0 ] || { show_log train; fail "the job exited $rc after the signal"; }
line=$(grep -m1 "^signal received: saved" "$log_dir/train.log") || { show_log train; fail "no breakpoint save"; }
step=${line##* at step }
step=${step%%,*}
saved=$(fingerprint "$log_dir/train.log" saved "$step")
say "$line (fingerprint $saved)"
[[ "$line" == *_breakpoint* ]] || fail "the signal's checkpoint is not a breakpoint"
python3 - "$root/stats.jsonl" <<'PY' || fail "the breakpoint was not written by both hosts"
import json, sys
j = [json.loads(l) for l in open(sys.argv[1])][-1]
assert j["name"].endswith("_breakpoint"), j["name"]
hosts = {h["host"]: h for h in j["hosts"]}
assert sorted(hosts) == ["h1", "h2"] and all(h["ranks"] == 2 and h["bytes"] > 0 for h in hosts.values()), j["hosts"]
print("breakpoint written by " + ", ".join(f"{n} ({h['bytes']} bytes)" for n, h in sorted(hosts.items())))
PY
verify_all "$root" || fail "the breakpoint does not verify"
run_job resume h1:2,h2:2 4 "$build/train_mlp" --dp 2 --tp 2 --steps $((step + 3)) --save-every 0 --log-every 100000 \
  $TRAIN_SHAPE --resume --dir /dck/shared/signal || { show_log resume; fail "resume"; }
got=$(fingerprint "$log_dir/resume.log" restored "$step")
[ -n "$got" ] && [ "$got" = "$saved" ] || { show_log resume; fail "restored '$got', the breakpoint saved $saved"; }
grep -q "resumed from .*_breakpoint" "$log_dir/resume.log" || fail "did not resume from the breakpoint"
say "ok: resumed at step $step from the breakpoint, fingerprint $got"
