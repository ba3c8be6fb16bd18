#!/usr/bin/env bash
# Kills train_mlp at random moments while it saves every step with retention (keep 2),
# alternating SIGKILL of one random rank and of every rank and mpirun at once (a whole
# job lost), then checks what survived, round after round in the same directory:
#   - no listed checkpoint is broken; every committed one verifies with --deep;
#   - the newest committed step never goes backwards (nothing committed is lost);
#   - each round resumes from the newest committed checkpoint of the round before.
# Prints how many kills left a save in flight.
#   bash tests/crash_random.sh BUILD_DIR WORK_DIR [ROUNDS] [SEED] [TRAIN_MLP_ARGS]
# TRAIN_MLP_ARGS are added to train_mlp's (e.g. "--layers 4 --freeze-fraction 0.5
# --incremental": incremental saves, whose retention keeps referenced files).
set -euo pipefail
build=${1:?usage: crash_random.sh BUILD_DIR WORK_DIR [ROUNDS] [SEED]}
work=${2:?usage: crash_random.sh BUILD_DIR WORK_DIR [ROUNDS] [SEED]}
rounds=${3:-8}
RANDOM=${4:-20261122}
train=$build/train_mlp
cli=$build/distckpt
dir=$work/ckpts
command -v pgrep > /dev/null || { echo "crash_random: pgrep (Debian package procps) is needed"; exit 2; }
rm -rf "$work" && mkdir -p "$work"
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 4)
args=(--dp 2 --tp 2 --save-every 1 --keep-max 2 --resume --dir "$dir")
read -r -a extra <<< "${5:-}"
args+=("${extra[@]}")

newest=0
mid_save=0
launcher=
# A failed check must not leave a round's job running (it would keep writing into the
# directory of the next run of this test).
trap '[ -n "$launcher" ] && kill -9 "$launcher" $(pgrep -P "$launcher" 2> /dev/null) 2> /dev/null || true' EXIT
for ((round = 1; round <= rounds; round++)); do
  log=$work/round-$round.log
  "${mpirun[@]}" "$train" "${args[@]}" --steps 100000 > "$log" 2>&1 &
  launcher=$!
  # Wait until the current round saved a step (a slow machine may take long to start), and
  # until all 4 ranks are there, then a random 50-800 ms more.
  ranks=()
  for ((i = 0; i < 1200; i++)); do
    mapfile -t ranks < <(pgrep -P "$launcher" -f "$train" || true)  # the ranks, not mpirun
    if [ "${#ranks[@]}" -eq 4 ] && grep -q "^saved step" "$log"; then break; fi
    if ! kill -0 "$launcher" 2> /dev/null; then echo "round $round: train_mlp ended early"; cat "$log"; exit 1; fi
    sleep 0.05
  done
  if [ "${#ranks[@]}" -ne 4 ] || ! grep -q "^saved step" "$log"; then
    echo "round $round: training did not start within 60 s"; cat "$log"; exit 1
  fi
  if ((newest > 0)) && ! grep -q "^restored step $newest fingerprint" "$log"; then
    echo "round $round: did not resume from step $newest"; cat "$log"; exit 1
  fi
  sleep "0.$(printf '%03d' $((50 + RANDOM % 750)))"
  if ((round % 2)); then
    victims=("${ranks[RANDOM % 4]}")
    what="one rank (pid ${victims[0]})"
  else
    victims=("${ranks[@]}" "$launcher")
    what="all 4 ranks and mpirun"
  fi
  kill -9 "${victims[@]}" 2> /dev/null || true
  { wait "$launcher" || true; } 2> /dev/null
  launcher=
  # A killed rank finishes the system call it is in (a rename, an fsync on a busy disk)
  # before it dies, and ranks whose mpirun was killed too are nobody's children: the
  # listing waits until none of them runs (a zombie has stopped), 30 s at most.
  for ((i = 0; i < 600; i++)); do
    running=0
    for p in "${ranks[@]}"; do
      state=$(awk '{print $3}' "/proc/$p/stat" 2> /dev/null) || continue
      [ -z "$state" ] || [ "$state" = Z ] || [ "$state" = X ] || running=1
    done
    ((running)) || break
    sleep 0.05
  done

  listing=$("$cli" ls --json "$dir") || { echo "round $round: distckpt ls failed"; exit 1; }
  if grep -q '"state":"broken"' <<< "$listing"; then
    echo "round $round: a broken checkpoint is listed"; echo "$listing"; exit 1
  fi
  # A new in-flight save directory (not a retention leftover): this kill landed mid-save.
  in_flight=$(python3 -c 'import json,sys; print(" ".join(e["name"] for e in json.loads(sys.argv[1])["entries"] if e["state"] not in ("committed", "retired") and ".tmp-deleting-" not in e["name"]))' "$listing")
  for name in $in_flight; do
    if ! grep -qFx "$name" "$work/seen" 2> /dev/null; then mid_save=$((mid_save + 1)); echo "$name" >> "$work/seen"; break; fi
  done
  committed=$(python3 -c 'import json,sys; print(" ".join(e["name"] for e in json.loads(sys.argv[1])["entries"] if e["state"] == "committed"))' "$listing")
  for name in $committed; do
    "$cli" verify --deep "$dir/$name" > /dev/null || { echo "round $round: $name does not verify"; exit 1; }
  done
  step=$(python3 -c 'import json,sys; e=[x["step"] for x in json.loads(sys.argv[1])["entries"] if x["state"] == "committed" and x.get("advances_latest", True)]; print(max(e) if e else 0)' "$listing")
  if ((step == 0 || step < newest)); then
    echo "round $round: the newest committed step is $step (before the round: $newest)"; exit 1
  fi
  newest=$step
  echo "round $round: killed $what; newest committed step $step; committed: $committed"
done

# The last state resumes and trains on.
"${mpirun[@]}" "$train" "${args[@]}" --steps $((newest + 2)) > "$work/final.log" 2>&1 || { cat "$work/final.log"; exit 1; }
grep -q "^restored step $newest fingerprint" "$work/final.log" || {
  echo "the final run did not resume from step $newest"; cat "$work/final.log"; exit 1; }
echo "crash_random: $rounds rounds ($mid_save kills left a save in flight), every committed checkpoint verified, each round resumed from the newest"
