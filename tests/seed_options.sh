#!/usr/bin/env bash
# The seeds' options from the shell (train_mlp and distckpt), under mpirun:
#  1. MindSpore names with epochs: --prefix net --steps-per-epoch 4 --epochs 3 --by-epoch in
#     .ckpt gives net-1_4.ckpt, net-2_4.ckpt, net-3_4.ckpt; --resume-epoch 2 restores the end
#     of epoch 2 and training continues to the same state as a run that never stopped;
#     --epochs with --steps is refused;
#  2. MMEngine's --filename-tmpl iter_{}.pth names iter_2, iter_4, ...;
#  3. --eval-every 5 --save-best loss: the loss is a metric only every 5 steps, a
#     best_loss_* checkpoint follows the best value, `distckpt ls --json` marks it;
#  4. distckpt convert --exclude/--rename selects and renames as a load does.
# Usage: seed_options.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1
work=$2
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
train=("$build/train_mlp" --dp 1 --tp 2)
rm -rf "$work"
mkdir -p "$work"

"${mpirun[@]}" -np 2 "${train[@]}" --epochs 3 --steps-per-epoch 4 --by-epoch --save-every 1 --prefix net \
  --format ckpt --keep-max 0 --dir "$work/ms" > "$work/ms.log" 2>&1
names=$(cd "$work/ms" && ls -1 | grep '\.ckpt$' | tr '\n' ' ')
echo "MindSpore names: $names"
[ "$names" = "net-1_4.ckpt net-2_4.ckpt net-3_4.ckpt " ] || { echo "unexpected names"; exit 1; }
final=$(awk '/^final step 12/ {print $5}' "$work/ms.log")
"${mpirun[@]}" -np 2 "${train[@]}" --epochs 3 --steps-per-epoch 4 --by-epoch --save-every 1 --prefix net \
  --format ckpt --keep-max 0 --dir "$work/ms" --resume-epoch 2 > "$work/ms2.log" 2>&1
grep -q "resumed from $work/ms/net-2_4.ckpt" "$work/ms2.log" || { cat "$work/ms2.log"; echo "not resumed from epoch 2"; exit 1; }
again=$(awk '/^final step 12/ {print $5}' "$work/ms2.log")
echo "final state: straight $final, from the end of epoch 2 $again"
[ -n "$final" ] && [ "$final" = "$again" ] || { echo "MISMATCH"; exit 1; }
rc=0
"${mpirun[@]}" -np 2 "${train[@]}" --epochs 3 --steps 5 --steps-per-epoch 4 --dir "$work/bad" > "$work/bad.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "not both" "$work/bad.log" || { echo "--epochs with --steps was not refused"; exit 1; }

"${mpirun[@]}" -np 2 "${train[@]}" --steps 6 --save-every 2 --filename-tmpl 'iter_{}.pth' --dir "$work/mm" > /dev/null 2>&1
names=$(cd "$work/mm" && ls -1d iter_* | tr '\n' ' ')
echo "MMEngine names: $names"
[ "$names" = "iter_2 iter_4 iter_6 " ] || { echo "unexpected names"; exit 1; }

"${mpirun[@]}" -np 2 "${train[@]}" --steps 40 --save-every 10 --eval-every 5 --save-best loss --keep-max 2 \
  --dir "$work/best" > "$work/best.log" 2>&1
"$build/distckpt" ls "$work/best"
best=$("$build/distckpt" ls --json "$work/best" | python3 -c '
import json, sys
entries = json.load(sys.stdin)["entries"]
print(" ".join(e["name"] for e in entries if e.get("best") == "loss"))')
echo "best: $best"
[ "$(echo "$best" | wc -w)" -eq 1 ] && [[ "$best" == best_loss_step-* ]] || { echo "no single best_loss checkpoint"; exit 1; }
step=${best#best_loss_step-}
[ $((step % 5)) -eq 0 ] || { echo "a best at step $step, where no loss was reported"; exit 1; }
"$build/distckpt" verify "$work/best/$best"

"$build/distckpt" convert "$work/best/$best" "$work/model" --to safetensors --exclude optim. \
  --rename mlp.fc1.weight=encoder.weight
tensors=$("$build/distckpt" inspect "$work/model.safetensors" | awk '/^  [a-z]/ && $2 ~ /^(float|bfloat|int|uint|bool)/ {print $1}' | sort | tr '\n' ' ')
echo "converted: $tensors"
[ "$tensors" = "encoder.weight mlp.fc1.bias mlp.fc2.bias mlp.fc2.weight " ] || { echo "unexpected selection"; exit 1; }
echo "seed options: ok"
