#!/usr/bin/env bash
# Exception saves under mpirun (CheckpointManager::run with exception_save):
#  1. every rank throws at the start of step 25 (a check all ranks make, like a NaN
#     loss): each saves step-24_exception, the job exits 3, `latest` stays on the last
#     periodic save, and the exception checkpoint holds exactly the state of step 24;
#  2. one rank throws while the others are inside the training step's collectives: it
#     gives up after --exception-timeout, nothing is saved, the job ends (no hang).
# Usage: exception_save.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1
work=$2
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
train=("$build/train_mlp" --dp 2 --tp 2)
rm -rf "$work"
mkdir -p "$work"

rc=0
"${mpirun[@]}" -np 4 "${train[@]}" --steps 40 --save-every 10 --dir "$work/all" --exception-save --throw-at-step 25 \
  > "$work/all.log" 2>&1 || rc=$?
cat "$work/all.log"
[ "$rc" -ne 0 ] || { echo "the job exited 0 after an exception"; exit 1; }
[ "$(grep -c "saved $work/all/step-24_exception" "$work/all.log")" -eq 4 ] || { echo "not saved on every rank"; exit 1; }
[ "$(cat "$work/all/latest")" = "step-20" ] || { echo "latest moved to the exception save"; exit 1; }
"$build/distckpt" verify "$work/all/step-24_exception"
info=$("$build/distckpt" inspect --json "$work/all/step-24_exception")
grep -q '"exception"' <<<"$info" || { echo "no exception info"; exit 1; }
# The same state, reached by training again from step 20 on the same layout.
expected=$("${mpirun[@]}" -np 4 "${train[@]}" --steps 24 --dir "$work/all" --resume-from step-20 --save-every 0 \
           | awk '/^final step 24/ {print $5}')
restored=$("${mpirun[@]}" -np 4 "${train[@]}" --steps 24 --dir "$work/all" --resume-from step-24_exception --save-every 0 \
           | awk '/^restored step 24/ {print $5}')
echo "step 24: retrained $expected, exception checkpoint $restored"
[ -n "$expected" ] && [ "$restored" = "$expected" ] || { echo "MISMATCH"; exit 1; }

rc=0
start=$(date +%s)
timeout 120 "${mpirun[@]}" -np 4 "${train[@]}" --steps 40 --save-every 10 --dir "$work/one" --exception-save --exception-timeout 3 \
  --throw-at-step 25 --throw-rank 2 > "$work/one.log" 2>&1 || rc=$?
cat "$work/one.log"
echo "one rank threw: exit $rc after $(( $(date +%s) - start )) s"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "expected a failed job, not success or a hang (exit $rc)"; exit 1; }
grep -q "did not reach the checkpoint manager within 3 s" "$work/one.log" || { echo "no timeout report"; exit 1; }
if compgen -G "$work/one/*_exception*" >/dev/null; then echo "saved a state mixing two steps"; exit 1; fi
[ "$(cat "$work/one/latest")" = "step-20" ] || { echo "latest changed"; exit 1; }
"$build/distckpt" verify "$work/one"
echo "exception saves: ok"
