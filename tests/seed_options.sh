#!/usr/bin/env bash
# The seeds' options from the shell (train_mlp and distckpt), under mpirun:
#  1. MindSpore names with epochs: --prefix net --steps-per-epoch 4 --epochs 3 --by-epoch in
#     .ckpt gives net-1_4.ckpt, net-2_4.ckpt, net-3_4.ckpt; --resume-epoch 2 restores the end
#     of epoch 2 and training continues to the same state as a run that never stopped;
#     --epochs with --steps is refused;
#  2. MMEngine's --filename-tmpl iter_{}.pth names iter_2, iter_4, ...;
#  3. --eval-every 5 --save-best loss: the loss is a metric only every 5 steps, a
#     best_loss_* checkpoint follows the best value, `distckpt ls --json` marks it;
#  4. distckpt convert --exclude/--rename selects and renames as a load does;
#  5. MindSpore's integrated_save=False (--format ckpt --no-integrated) on 4 ranks: one
#     .ckpt per rank in each set, listed as one checkpoint, a crashed run resumes to the
#     same state, and the set loads onto 2 ranks (DP1 x TP2) and converts to one file;
#  6. a truncated newest checkpoint: --resume refuses it, --fall-back resumes from the one
#     before (the manager's fall_back_to_previous);
#  7. --save-begin, --no-save-last, --append-info, --no-crc-footer name, skip and record as
#     their seeds' options do.
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
# The seeds' remaining flags: save_begin, no final save, append_info, a .ckpt without its footer.
"${mpirun[@]}" -np 2 "${train[@]}" --steps 8 --save-every 2 --save-begin 3 --no-save-last --append-info lr=0.05 \
  --append-info tag=x --format ckpt --no-crc-footer --allow-unchecked --keep-max 0 --dir "$work/flags" \
  > "$work/flags.log" 2>&1
names=$(cd "$work/flags" && ls -1 | grep '\.ckpt$' | tr '\n' ' ')
echo "save_begin 3, every 2, 8 steps, no final save: $names"
[ "$names" = "step-3.ckpt step-5.ckpt step-7.ckpt " ] || { echo "unexpected names"; exit 1; }
"$build/distckpt" inspect "$work/flags/step-5.ckpt" > "$work/flags.inspect"
grep -q "tag = x" "$work/flags.inspect" && grep -q "lr = 0.05" "$work/flags.inspect" || { echo "append_info missing"; exit 1; }
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

set_args=(--dp 2 --tp 2 --steps 8 --save-every 4 --format ckpt --no-integrated --keep-max 1)
"${mpirun[@]}" -np 4 "$build/train_mlp" "${set_args[@]}" --dir "$work/set" > "$work/set.log" 2>&1
rc=0
"${mpirun[@]}" -np 4 "$build/train_mlp" "${set_args[@]}" --dir "$work/set2" --crash-at-step 6 > "$work/set2.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || { echo "the crash did not happen"; exit 1; }
"${mpirun[@]}" -np 4 "$build/train_mlp" "${set_args[@]}" --dir "$work/set2" --resume > "$work/set3.log" 2>&1
straight=$(awk '/^final step 8/ {print $5}' "$work/set.log")
resumed=$(awk '/^final step 8/ {print $5}' "$work/set3.log")
echo "per-rank sets: straight $straight, resumed $resumed"
[ -n "$straight" ] && [ "$straight" = "$resumed" ] || { cat "$work/set3.log"; echo "MISMATCH"; exit 1; }
"$build/distckpt" ls "$work/set2"
[ "$("$build/distckpt" ls --json "$work/set2" | python3 -c '
import json, sys
print(" ".join(e["name"] for e in json.load(sys.stdin)["entries"] if e.get("per_rank_files")))')" = "step-8" ] ||
  { echo "the set is not listed as one checkpoint"; exit 1; }
for r in 0 1 2 3; do [ -f "$work/set2/step-8/rank_$r/step-8.ckpt" ] || { echo "rank $r's file is missing"; exit 1; }; done
[ ! -e "$work/set2/step-4" ] || { echo "retention left step-4"; exit 1; }
"$build/distckpt" verify "$work/set2/step-8"
"${mpirun[@]}" -np 2 "$build/train_mlp" --dp 1 --tp 2 --steps 8 --save-every 4 --dir "$work/set2" --resume \
  > "$work/set4.log" 2>&1
grep -q "restored step 8 fingerprint $straight" "$work/set4.log" || { cat "$work/set4.log"; echo "not loaded onto 2 ranks"; exit 1; }
"$build/distckpt" convert "$work/set2/step-8" "$work/merged" --to ckpt
"$build/distckpt" verify "$work/merged.ckpt"

# 6. A truncated newest checkpoint (safetensors): --resume refuses it, saying how to fall
#    back; --fall-back resumes from the one before and ends where a run that never
#    stopped ends.
fb_args=(--dp 1 --tp 2 --save-every 4 --format safetensors --keep-max 0)
"${mpirun[@]}" -np 2 "$build/train_mlp" "${fb_args[@]}" --steps 12 --dir "$work/fb" > "$work/fb.log" 2>&1
truncate -s 4096 "$work/fb/step-12.safetensors"
rc=0
"${mpirun[@]}" -np 2 "$build/train_mlp" "${fb_args[@]}" --steps 16 --dir "$work/fb" --resume > "$work/fb2.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "step-12.safetensors.*fall_back_to_previous" "$work/fb2.log" ||
  { cat "$work/fb2.log"; echo "a damaged newest checkpoint was not refused"; exit 1; }
"${mpirun[@]}" -np 2 "$build/train_mlp" "${fb_args[@]}" --steps 16 --dir "$work/fb" --resume --fall-back \
  > "$work/fb3.log" 2>&1
"${mpirun[@]}" -np 2 "$build/train_mlp" "${fb_args[@]}" --steps 16 --dir "$work/fb-straight" > "$work/fb4.log" 2>&1
grep -q "resumed from $work/fb/step-8.safetensors" "$work/fb3.log" &&
  grep -q "passed over $work/fb/step-12.safetensors (damaged)" "$work/fb3.log" ||
  { cat "$work/fb3.log"; echo "--fall-back did not resume from step 8"; exit 1; }
fell=$(awk '/^final step 16/ {print $5}' "$work/fb3.log")
straight=$(awk '/^final step 16/ {print $5}' "$work/fb4.log")
echo "fall back past a truncated file: straight $straight, resumed $fell"
[ -n "$fell" ] && [ "$fell" = "$straight" ] || { echo "MISMATCH"; exit 1; }
echo "seed options: ok"
