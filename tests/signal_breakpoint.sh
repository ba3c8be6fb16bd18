#!/usr/bin/env bash
# SIGUSR1 mid-run (what Slurm's --signal and `scancel -s USR1` deliver; mpirun forwards
# it to every rank): train_mlp finishes its step, commits a *_breakpoint checkpoint on
# every rank and exits 0; a resume at another shape restores exactly that state.
# Usage: signal_breakpoint.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1
work=$2
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
rm -rf "$work"
mkdir -p "$work"
"${mpirun[@]}" -np 4 "$build/train_mlp" --dp 2 --tp 2 --steps 100000000 --save-every 0 --keep-max 2 \
  --dir "$work/ckpt" > "$work/run.log" 2>&1 &
pid=$!
# Wait until training is under way, then signal mpirun.
for _ in $(seq 1 600); do grep -q "^step 10 " "$work/run.log" 2>/dev/null && break; sleep 0.1; done
grep -q "^step 10 " "$work/run.log" || { cat "$work/run.log"; kill "$pid"; echo "no step 10 within 60 s"; exit 1; }
sleep 1
kill -USR1 "$pid"
rc=0
wait "$pid" || rc=$?
cat "$work/run.log"
[ "$rc" -eq 0 ] || { echo "train_mlp exited $rc after SIGUSR1 (expected 0)"; exit 1; }
line=$(grep "^signal received: saved" "$work/run.log") || { echo "no breakpoint save reported"; exit 1; }
step=${line##*at step }; step=${step%%,*}
saved=$(awk -v s="$step" '$1 == "saved" && $3 == s {print $5}' "$work/run.log")
[ -n "$saved" ] || { echo "no fingerprint for step $step"; exit 1; }
compgen -G "$work/ckpt/*_breakpoint" >/dev/null || { echo "no *_breakpoint checkpoint"; exit 1; }
"$build/distckpt" verify "$work/ckpt"
restored=$("${mpirun[@]}" -np 4 "$build/train_mlp" --dp 1 --tp 4 --steps "$step" --save-every 0 --dir "$work/ckpt" \
           --resume | awk '/^restored step/ {print $5}')
echo "breakpoint at step $step: saved $saved, restored at DP1 x TP4 $restored"
[ "$restored" = "$saved" ] || { echo "MISMATCH"; exit 1; }
echo "signal breakpoint: fingerprints match"
