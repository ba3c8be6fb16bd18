#!/usr/bin/env bash
# The node-local tier on several hosts: checkpoints in each host's /dev/shm, protected by
# the layout's replicas, partner copies or parity, drained to the shared directory.
#
#   tier.sh BUILD_DIR kills N   3 hosts x 2 ranks, DP3 x TP2, --local-every 5
#                               --global-every 4. A host dies at each kill point of the
#                               local tier (mid local save: data written, redundancy
#                               written, node commit; mid drain) and at N random moments
#                               (the seed is printed). Each time the job resumes from
#                               the newest local checkpoint on the 2 survivors + a fresh
#                               host (6 ranks) and on the 2 survivors alone (4 ranks, a
#                               reshard), both with global=0 and the saved step's state.
#   tier.sh BUILD_DIR parity    DP1 x TP6 over 3 hosts with xor:3 and with rs:2+1: a
#                               lost host is rebuilt from parity (parity>0, global=0);
#                               partner over 2 hosts: the partner's copy is read.
#   tier.sh BUILD_DIR beyond    more hosts lost than the redundancy covers: resume says
#                               so and takes the newest checkpoint restorable (the global
#                               tier's); two of three hosts lost at DP3: the survivor's
#                               replica is enough; a damaged local file on a survivor is
#                               counted as lost and its bytes come from elsewhere.
# Hidden units divisible by TP 6, 4 and 2.
TRAIN_SHAPE=${TRAIN_SHAPE:---hidden 240 --in 64 --out 16}
source "$(dirname "$0")/lib.sh" "$1" "tier_${2:?kills, parity or beyond}"
skip_unless_possible
mode=$2
peer_timeout=$KILL_PEER_TIMEOUT  # in the jobs that lose hosts; the others keep the default
local_dir=/dev/shm/ckpt  # inside each host: its own /dev/shm
declare -A reference=()

reference_at() {  # $1 step, $2 dp, $3 tp: the uninterrupted state, computed once
  local key="$1/$2/$3"
  [ -n "${reference[$key]:-}" ] || reference[$key]=$(reference_fingerprint "$1" "$2" "$3")
  echo "${reference[$key]}"
}

# newest_any_tier ROOT: the step of the newest checkpoint at any tier (0: none).
newest_step() {
  "$build/distckpt" ls --json "$1" 2>/dev/null | python3 -c '
import json, sys
d = json.load(sys.stdin)
name = d.get("newest_any_tier", "")
steps = [e["step"] for e in d["entries"] if e["name"] == name]
print(steps[0] if steps else 0)'
}

# sources LOG: "local peer parity global" from train_mlp's restore line.
sources() {
  sed -n 's/^restore sources: local=\([0-9]*\) peer=\([0-9]*\) parity=\([0-9]*\) global=\([0-9]*\).*/\1 \2 \3 \4/p' "$1" | head -1
}

# resume_tier NAME HOSTS NP DP TP ROOT STEP [REDUNDANCY]: resumes (no further step) and
# checks the state; sets $src to "local peer parity global".
resume_tier() {
  local name=$1 hosts=$2 np=$3 dp=$4 tp=$5 root=$6 step=$7 red=${8:-auto} started rc got want
  started=$(now)
  run_job "$name" "$hosts" "$np" "$build/train_mlp" --dp "$dp" --tp "$tp" --steps "$step" --local-dir "$local_dir" \
    --local-every 5 --redundancy "$red" --log-every 100000 $TRAIN_SHAPE --resume \
    --dir "/dck/shared/${root#"$shared"/}"
  rc=$?
  [ "$rc" -eq 0 ] || { show_log "$name"; fail "$name: the resume failed (status $rc)"; }
  got=$(fingerprint "$log_dir/$name.log" restored "$step")
  want=$(reference_at "$step" "${ref_dp:-$dp}" "${ref_tp:-$tp}")  # the layout that trained it
  [ -n "$got" ] || { show_log "$name"; fail "$name: did not resume at step $step"; }
  [ "$got" = "$want" ] || fail "$name: restored step $step fingerprint $got, an uninterrupted run has $want"
  src=$(sources "$log_dir/$name.log")
  say "$name on $hosts (DP$dp x TP$tp): step $step = reference, sources local/peer/parity/global = $src, $(elapsed "$started") s"
}

# train NAME HOSTS NP DP TP ROOT STEPS REDUNDANCY [GLOBAL_EVERY]: trains to STEPS, saving locally every 5.
train() {
  local name=$1 hosts=$2 np=$3 dp=$4 tp=$5 root=$6 steps=$7 red=$8 every=${9:-4}
  run_job "$name" "$hosts" "$np" "$build/train_mlp" --dp "$dp" --tp "$tp" --steps "$steps" --local-dir "$local_dir" \
    --local-every 5 --global-every "$every" --redundancy "$red" --log-every 100000 \
    $TRAIN_SHAPE --dir "/dck/shared/${root#"$shared"/}" || { show_log "$name"; fail "$name: training failed"; }
}

# kill_round NAME [POINT | DELAY]: the DP3 x TP2 job on h1-h3 loses a host there.
kill_round() {
  local name=$1 point=${2:-} delay=${3:-} victim=$4 root=$shared/tier/$1 newest rc survivors
  fresh_hosts h1 h2 h3
  bash "$netns" remove h4 >/dev/null 2>&1
  rm -rf "$root" && mkdir -p "$root"
  local env=()
  [ -n "$point" ] && env=(env "DISTCKPT_PAUSE_AT=$point" "DISTCKPT_PAUSE_HOST=$victim")
  start_job "$name" h1:2,h2:2,h3:2 6 "${env[@]}" "$build/train_mlp" --dp 3 --tp 2 --steps 100000000 \
    --local-dir "$local_dir" --local-every 5 --global-every 4 --keep-local 2 --keep-max 2 --log-every 100000 \
    --peer-timeout "$peer_timeout" $TRAIN_SHAPE --dir "/dck/shared/tier/$name"
  if [ -n "$point" ]; then
    wait_log "$name" "paused at kill point ${point%@*}" 60 || { show_log "$name"; fail "$name: never reached $point"; }
    sleep 0.3
  else
    wait_log "$name" "^saved step" 60 || { show_log "$name"; fail "$name: no save within 60 s"; }
    sleep "$delay"
  fi
  [ -s "$log_dir/$name.rc" ] && { show_log "$name"; fail "$name: the job ended before the kill"; }
  bash "$netns" kill "$victim"
  rc=$(wait_job "$name" 90) || { show_log "$name"; fail "$name: mpirun still running 90 s after the kill"; }
  wait_no_processes 60 || fail "$name: processes left after the job: $(job_processes | tr '\n' ' ')"
  [ "$rc" -ne 0 ] || fail "$name: mpirun reported success for a job that lost a host"
  if compgen -G "$root/*/index.pb" >/dev/null; then
    verify_all "$root" || fail "$name: a global checkpoint does not verify"
  fi
  newest=$(newest_step "$root")
  say "$name: killed $victim${point:+ at $point}; newest checkpoint at any tier: step $newest ($(committed_steps "$root" | wc -w) listed)"
  survivors=$(for h in h1 h2 h3; do [ "$h" = "$victim" ] || printf '%s:2,' "$h"; done)
  survivors=${survivors%,}
  if [ "$newest" -eq 0 ]; then
    say "$name: nothing was committed before the kill"
    return
  fi
  # The survivors alone first (4 ranks, a reshard): then a fresh host joins them.
  ref_dp=3 ref_tp=2 resume_tier "$name.survivors" "$survivors" 4 2 2 "$root" "$newest"
  read -r l p q g <<<"$src"
  [ "$g" -eq 0 ] || fail "$name.survivors: $g bytes from the global tier (expected 0)"
  [ "$l" -gt 0 ] || fail "$name.survivors: nothing from the local tier"
  bash "$netns" add h4 >/dev/null || fail "cannot add the spare host"
  resume_tier "$name.spare" "$survivors,h4:2" 6 3 2 "$root" "$newest"
  read -r l p q g <<<"$src"
  [ "$g" -eq 0 ] || fail "$name.spare: $g bytes from the global tier (expected 0)"
  [ "$p" -gt 0 ] || fail "$name.spare: the fresh host received nothing from its peers"
  bash "$netns" remove h4 >/dev/null
}

case $mode in
kills)
  rounds=${3:-4}
  kill_round local_write local-write@2 "" h2          # data files written on every node, not agreed
  kill_round local_redundancy local-redundancy@2 "" h3  # redundancy written, not agreed
  kill_round node_commit local-node-commit@2 "" h1     # renamed on the nodes, record not committed (rank 0's host)
  kill_round drain drain-write@1 "" h2                 # a drain copying in the background
  seed=${DCK_SEED:-$(($(date +%s) % 100000))}
  say "random rounds: $rounds, seed $seed (DCK_SEED=$seed repeats them)"
  RANDOM=$seed
  for round in $(seq 1 "$rounds"); do
    victim=h$((RANDOM % 3 + 1))
    delay=$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.2 + (r % 2500) / 1000 }')
    say "round $round: $victim dies $delay s after the first save"
    kill_round "round$round" "" "$delay" "$victim"
  done
  ;;
parity)
  for red in xor:3 rs:2+1; do
    name=${red/:/_}
    name=${name/+/_}
    root=$shared/tier/$name
    fresh_hosts h1 h2 h3
    rm -rf "$root" && mkdir -p "$root"
    train "$name" h1:2,h2:2,h3:2 6 1 6 "$root" 10 "$red" 0
    bash "$netns" kill h2
    bash "$netns" add h4 >/dev/null
    # The fresh host takes h2's place: its ranks' bytes are rebuilt from parity.
    resume_tier "$name.rebuild" h1:2,h3:2,h4:2 6 1 6 "$root" 10 "$red"
    read -r l p q g <<<"$src"
    [ "$q" -gt 0 ] || fail "$name: nothing was rebuilt from parity"
    [ "$g" -eq 0 ] || fail "$name: $g bytes from the global tier (expected 0)"
    grep -q '"parity_read"' "$root/stats.jsonl" || fail "$name: stats.jsonl has no parity_read"
    bash "$netns" remove h4 >/dev/null
  done
  root=$shared/tier/partner
  fresh_hosts h1 h2
  rm -rf "$root" && mkdir -p "$root"
  train partner h1:2,h2:2 4 1 4 "$root" 10 partner 0
  bash "$netns" kill h2
  bash "$netns" add h4 >/dev/null
  resume_tier partner.resume h1:2,h4:2 4 1 4 "$root" 10 partner
  read -r l p q g <<<"$src"
  [ "$p" -gt 0 ] && [ "$g" -eq 0 ] || fail "partner: expected the partner copy (peer > 0, global = 0): $src"
  bash "$netns" remove h4 >/dev/null
  ;;
beyond)
  # xor:3 survives one host. The job pauses in its 4th local save (step 20; step 10 was
  # drained, step 15 is local only) and two hosts die: step 15 cannot be restored, and
  # resume says so and takes step 10, from the survivor's local tier and the global one.
  root=$shared/tier/beyond
  # Step 10's drain commits at a step_end after every rank's copy finished, in the ten
  # steps before the pause: a copy slower than those (fsyncs on a busy disk) leaves no
  # global step 10, which is this scenario's premise, not a defect. Then it runs again.
  for attempt in 1 2 3; do
    fresh_hosts h1 h2 h3
    rm -rf "$root" && mkdir -p "$root"
    rm -f "$log_dir/beyond.log"  # start_job truncates it in the background: no earlier attempt's line
    start_job beyond h1:2,h2:2,h3:2 6 env DISTCKPT_PAUSE_AT=local-write@4 DISTCKPT_PAUSE_HOST=h2 "$build/train_mlp" \
      --dp 1 --tp 6 --steps 100000 --local-dir "$local_dir" --local-every 5 --global-every 2 --redundancy xor:3 \
      --log-every 100000 --peer-timeout "$peer_timeout" $TRAIN_SHAPE --dir /dck/shared/tier/beyond
    wait_log beyond "paused at kill point local-write" 60 || { show_log beyond; fail "beyond: never paused"; }
    sleep 0.3
    [ -f "$root/step-10/index.pb" ] && break
    say "beyond: attempt $attempt: step 10's drain had not committed before the pause; again"
    [ "$attempt" -lt 3 ] || fail "beyond: step 10's drain never committed before step 20's save (3 attempts)"
    bash "$netns" kill h1; bash "$netns" kill h2; bash "$netns" kill h3
    wait_job beyond 90 >/dev/null || fail "beyond: mpirun still running 90 s after the kill"
    wait_no_processes 60 || fail "beyond: processes left"
  done
  bash "$netns" kill h2
  bash "$netns" kill h3
  wait_job beyond 90 >/dev/null || fail "beyond: mpirun still running 90 s after the kill"
  wait_no_processes 60 || fail "beyond: processes left"
  bash "$netns" add h4 >/dev/null
  bash "$netns" add h5 >/dev/null
  newest=$(newest_step "$root")
  [ "$newest" = 15 ] || fail "beyond: the newest checkpoint at any tier is step $newest, not 15"
  resume_tier beyond.resume h1:2,h4:2,h5:2 6 1 6 "$root" 10 xor:3
  grep -q "passed over step-15" "$log_dir/beyond.resume.log" ||
    { show_log beyond.resume; fail "beyond: resume does not say why step 15 was passed over"; }
  read -r l p q g <<<"$src"
  [ "$g" -gt 0 ] || fail "beyond: nothing from the global tier: $src"
  say "beyond: $(grep 'passed over' "$log_dir/beyond.resume.log" | head -1 | cut -c1-200)"
  bash "$netns" remove h4 >/dev/null
  bash "$netns" remove h5 >/dev/null

  # DP3 x TP2 (each host holds a whole replica): two hosts lost, the third has it all.
  root=$shared/tier/dp3
  fresh_hosts h1 h2 h3
  rm -rf "$root" && mkdir -p "$root"
  train dp3 h1:2,h2:2,h3:2 6 3 2 "$root" 10 auto 0
  bash "$netns" kill h1
  bash "$netns" kill h3
  bash "$netns" add h4 >/dev/null
  bash "$netns" add h5 >/dev/null
  resume_tier dp3.resume h2:2,h4:2,h5:2 6 3 2 "$root" 10
  read -r l p q g <<<"$src"
  [ "$g" -eq 0 ] && [ "$p" -gt 0 ] || fail "dp3: expected the survivor's replica (peer > 0, global = 0): $src"

  # A damaged local file on a survivor: lost, not data; its bytes come from a replica.
  root=$shared/tier/corrupt
  fresh_hosts h1 h2 h3
  rm -rf "$root" && mkdir -p "$root"
  train corrupt h1:2,h2:2,h3:2 6 3 2 "$root" 10 auto 0
  file=$(ls "${DCK_CLUSTER_DIR:-/var/tmp/dck-cluster}"/hosts/h1/shm/ckpt/step-10/data-*.bin | head -1)
  [ -f "$file" ] || fail "corrupt: no local data file on h1"
  printf '\x5a' | dd of="$file" bs=1 seek=17 conv=notrunc status=none
  resume_tier corrupt.resume h1:2,h2:2,h3:2 6 3 2 "$root" 10
  grep -q "counted as lost" "$log_dir/corrupt.resume.log" || fail "corrupt: the damaged file was not reported"
  read -r l p q g <<<"$src"
  [ "$p" -gt 0 ] && [ "$g" -eq 0 ] || fail "corrupt: expected the bytes from a replica on another host: $src"
  say "corrupt: $(grep 'counted as lost' "$log_dir/corrupt.resume.log" | head -1 | cut -c1-160)"
  for h in h4 h5; do bash "$netns" remove "$h" >/dev/null 2>&1; done
  ;;
*) fail "unknown mode $mode" ;;
esac
fresh_hosts h1 h2
bash "$netns" remove h3 >/dev/null 2>&1
say "ok"
