#!/usr/bin/env bash
# Kills train_mlp at random moments while it saves every step with retention (keep 2),
# alternating SIGKILL of one random rank and of every rank at once (a whole job lost),
# then checks what survived, round after round in the same directory:
#   - no listed checkpoint is broken; every committed one verifies with --deep;
#   - the newest committed step never goes backwards (nothing committed is lost);
#   - the next round resumes from the newest committed checkpoint (train_mlp --resume).
# Prints how many rounds were killed while a save was in flight.
#   bash tests/crash_random.sh BUILD_DIR WORK_DIR [ROUNDS] [SEED]
set -euo pipefail
build=${1:?usage: crash_random.sh BUILD_DIR WORK_DIR [ROUNDS] [SEED]}
work=${2:?usage: crash_random.sh BUILD_DIR WORK_DIR [ROUNDS] [SEED]}
rounds=${3:-8}
RANDOM=${4:-20261122}
train=$build/train_mlp
cli=$build/distckpt
dir=$work/ckpts
rm -rf "$work" && mkdir -p "$work"

newest=0
mid_save=0
for ((round = 1; round <= rounds; round++)); do
  log=$work/round-$round.log
  mpirun --allow-run-as-root --oversubscribe -np 4 "$train" --dp 2 --tp 2 --steps 100000 --save-every 1 \
    --keep-max 2 --resume --dir "$dir" > "$log" 2>&1 &
  launcher=$!
  # Wait for training to start (a step printed), then a random 50-800 ms more.
  for ((i = 0; i < 200; i++)); do grep -q "^step \|saved step" "$log" 2>/dev/null && break; sleep 0.05; done
  sleep "0.$(printf '%03d' $((50 + RANDOM % 750)))"
  mapfile -t ranks < <(pgrep -P "$launcher" -f "$train" || true)  # the ranks, not mpirun
  if [ "${#ranks[@]}" -eq 0 ]; then
    echo "round $round: train_mlp is not running"; cat "$log"; exit 1
  fi
  if ((round % 2)); then
    victims=("${ranks[RANDOM % ${#ranks[@]}]}")
    what="one rank (pid ${victims[0]})"
  else
    victims=("${ranks[@]}" "$launcher")
    what="all ${#ranks[@]} ranks and mpirun"
  fi
  kill -9 "${victims[@]}" 2> /dev/null || true
  { wait "$launcher" || true; } 2> /dev/null

  listing=$("$cli" ls --json "$dir")
  if grep -q '"state":"broken"' <<< "$listing"; then
    echo "round $round: a broken checkpoint is listed"; echo "$listing"; exit 1
  fi
  # A new in-flight directory: this kill landed while a save was being written.
  in_flight=$(python3 -c 'import json,sys; print(" ".join(e["name"] for e in json.loads(sys.argv[1])["entries"] if e["state"] != "committed"))' "$listing")
  for name in $in_flight; do
    if ! grep -qx "$name" "$work/seen" 2> /dev/null; then mid_save=$((mid_save + 1)); echo "$name" >> "$work/seen"; break; fi
  done
  committed=$(python3 -c 'import json,sys; print(" ".join(e["name"] for e in json.loads(sys.argv[1])["entries"] if e["state"] == "committed"))' "$listing")
  for name in $committed; do
    "$cli" verify --deep "$dir/$name" > /dev/null || { echo "round $round: $name does not verify"; exit 1; }
  done
  step=$(python3 -c 'import json,sys; e=[x["step"] for x in json.loads(sys.argv[1])["entries"] if x["state"] == "committed" and x.get("advances_latest", True)]; print(max(e) if e else 0)' "$listing")
  if ((step < newest)); then
    echo "round $round: the newest committed step went back from $newest to $step"; exit 1
  fi
  newest=$step
  echo "round $round: killed $what; newest committed step $step; committed: $committed"
done

# The last state resumes and trains on.
mpirun --allow-run-as-root --oversubscribe -np 4 "$train" --dp 2 --tp 2 --steps $((newest + 2)) --save-every 1 \
  --keep-max 2 --resume --dir "$dir" > "$work/final.log" 2>&1 || { cat "$work/final.log"; exit 1; }
grep -q "resumed from .*step $newest\|resumed at step $newest\|step $newest" "$work/final.log" || {
  echo "the final run did not resume from step $newest"; cat "$work/final.log"; exit 1; }
echo "crash_random: $rounds rounds ($mid_save killed while a save was in flight), every committed checkpoint verified, newest step $newest resumed"
