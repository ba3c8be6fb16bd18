#!/usr/bin/env bash
# A whole host dies while train_mlp (DP2 x TP2 on h1 and h2, saving every 2 steps,
# keeping 2) trains and saves. The host's link goes down first (no FIN or RST leaves
# it), then its processes are killed and its node-local files wiped (netns.sh kill).
# For each death:
#   - mpirun ends within 90 s of the kill, and no process of the job is left on any
#     host 30 s after that;
#   - every listed checkpoint verifies, and the newest committed before the kill is
#     still listed (nothing committed is lost);
#   - the job resumes on the surviving host alone at DP1 x TP2, and on the survivor
#     plus a fresh spare host (h3) at DP2 x TP2, both exactly at the newest committed
#     step: the restored state's fingerprint equals an uninterrupted run's at that step.
#
#   host_loss.sh BUILD_DIR phases     the host dies at each phase of a save, reached
#                                     deterministically through kill points: data write
#                                     (h2 dies; h1's ranks wait for it), commit rename,
#                                     latest, retention, holding the root's commit-number
#                                     lock (h1 dies: rank 0's host, where mpirun runs, as
#                                     on the first node of an allocation)
#   host_loss.sh BUILD_DIR random N   N deaths at random moments of random hosts; the
#                                     seed is printed (DCK_SEED=... repeats a run)
source "$(dirname "$0")/lib.sh" "$1" "host_loss_${2:?phases or random}"
skip_unless_possible
mode=$2
peer_timeout=$KILL_PEER_TIMEOUT  # in the jobs that lose a host (lib.sh says why)
declare -A reference=()

reference_at() {  # the uninterrupted DP2 x TP2 state at step $1, computed once per step
  [ -n "${reference[$1]:-}" ] || reference[$1]=$(reference_fingerprint "$1" 2 2)
  echo "${reference[$1]}"
}

# resume NAME HOSTS NP DP ROOT EXPECTED_STEP: resumes and checks the restored state.
resume_and_check() {
  local name=$1 hosts=$2 np=$3 dp=$4 dir=$5 step=$6 started rc
  started=$(now)
  run_job "$name" "$hosts" "$np" "$build/train_mlp" --dp "$dp" --tp 2 --steps $((step + 2)) --save-every 0 \
    --log-every 100000 $TRAIN_SHAPE --resume --dir "/dck/shared/${dir#"$shared"/}"
  rc=$?
  [ "$rc" -eq 0 ] || { show_log "$name"; fail "$name: the resume failed (status $rc)"; }
  if [ "$step" -eq 0 ]; then
    grep -q "no committed checkpoint" "$log_dir/$name.log" || { show_log "$name"; fail "$name: expected a fresh start"; }
    say "$name on $hosts: nothing was committed, started from step 0"
    return
  fi
  local got want
  got=$(fingerprint "$log_dir/$name.log" restored "$step")
  want=$(reference_at "$step")
  [ -n "$got" ] || { show_log "$name"; fail "$name: did not resume at step $step"; }
  [ "$got" = "$want" ] || fail "$name: restored step $step fingerprint $got, an uninterrupted run has $want"
  say "$name on $hosts (DP$dp x TP2): restored step $step fingerprint $got = reference, in $(elapsed "$started") s"
}

# scenario NAME KILL_HOST [POINT PAUSE_HOST | DELAY]
scenario() {
  local name=$1 victim=$2 point=${3:-} pause_host=${4:-} delay=${5:-}
  local survivor=h1 root=$shared/host_loss/$1 before after killed ended rc newest
  [ "$victim" = h1 ] && survivor=h2
  fresh_hosts h1 h2
  bash "$netns" remove h3 >/dev/null 2>&1
  rm -rf "$root" "$root.spare"
  mkdir -p "$root"
  local env=()
  [ -n "$point" ] && env=(env "DISTCKPT_PAUSE_AT=$point" "DISTCKPT_PAUSE_HOST=$pause_host")
  start_job "$name" h1:2,h2:2 4 "${env[@]}" "$build/train_mlp" --dp 2 --tp 2 --steps 100000000 --save-every 2 \
    --keep-max 2 --log-every 100000 --peer-timeout "$peer_timeout" $TRAIN_SHAPE --dir "/dck/shared/host_loss/$name"
  if [ -n "$point" ]; then
    wait_log "$name" "paused at kill point ${point%@*}" 60 || { show_log "$name"; fail "$name: never reached $point"; }
    sleep 0.3  # the other ranks get where they wait for the paused ones
  else
    wait_log "$name" "^saved step" 60 || { show_log "$name"; fail "$name: no save within 60 s"; }
    sleep "$delay"
  fi
  [ -s "$log_dir/$name.rc" ] && { show_log "$name"; fail "$name: the job ended before the kill"; }
  killed=$(now)
  bash "$netns" kill "$victim"
  # Listed after the kill: before it, the job may commit more saves (and retention
  # retire older ones) in the moment between the listing and the link going down. Rank
  # 0 may still finish one commit the ranks agreed on before the kill, never two.
  before=$(committed_steps "$root")
  say "$name: killed $victim${point:+ at $point} (committed then: ${before:-none})"
  rc=$(wait_job "$name" 90) || { show_log "$name"; fail "$name: mpirun still running 90 s after the kill"; }
  ended=$(elapsed "$killed")
  wait_no_processes 60 || fail "$name: processes left 60 s after mpirun ended: $(job_processes | tr '\n' ' ')"
  say "$name: mpirun ended $ended s after the kill (status $rc); no process left after $(elapsed "$killed") s"
  grep -E "waited .* for its peers|lost communication|paused at" "$log_dir/$name.log" | sort | uniq -c | head -5 |
    sed 's/^/    | /'
  [ "$rc" -ne 0 ] || fail "$name: mpirun reported success for a job that lost a host"

  after=$(committed_steps "$root")
  verify_all "$root" || fail "$name: a listed checkpoint does not verify"
  newest=${after##* }
  if [ -n "$before" ]; then
    [[ " $after " == *" ${before##* } "* ]] || fail "$name: step ${before##* } was committed before the kill, now: $after"
  fi
  say "$name: committed after: ${after:-none}; all verify"
  [ -n "$newest" ] || newest=0
  cp -a "$root" "$root.spare"
  resume_and_check "$name.survivor" "$survivor:2" 2 1 "$root" "$newest"
  bash "$netns" add h3 >/dev/null || fail "cannot add the spare host"
  resume_and_check "$name.spare" "$survivor:2,h3:2" 4 2 "$root.spare" "$newest"
  if [ "$newest" -gt 0 ]; then
    local final want
    final=$(fingerprint "$log_dir/$name.spare.log" final $((newest + 2)))
    want=$(reference_at $((newest + 2)))
    [ "$final" = "$want" ] || fail "$name: after the resume at DP2 x TP2 step $((newest + 2)) is $final, not $want"
  fi
  bash "$netns" remove h3 >/dev/null
}

case $mode in
phases)
  scenario write h2 save-write@2 h2        # h2's ranks are writing their data
  scenario commit h1 commit-rename@2 h1    # rank 0 is about to rename the checkpoint into place
  scenario latest h1 commit-latest@2 h1    # committed, `latest` not yet moved
  scenario retention h1 retire-remove@1 h1  # the oldest is renamed to trash, not yet removed
  # Rank 0's host dies holding the root's commit-number lock: the resumes' saves (on
  # other hosts) break it once its heartbeat has stood still for 10 s.
  scenario seq_lock h1 seq-locked@2 h1
  grep -q "broke the lock .*seq.lock" "$log_dir/seq_lock.survivor.log" ||
    fail "seq_lock: the survivor's save did not break the dead host's lock"
  ;;
random)
  rounds=${3:-3}
  seed=${DCK_SEED:-$(( $(date +%s) % 100000 ))}
  say "random rounds: $rounds, seed $seed (DCK_SEED=$seed repeats them)"
  RANDOM=$seed
  for round in $(seq 1 "$rounds"); do
    victim=h$((RANDOM % 2 + 1))
    delay=$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 0.2 + (r % 3000) / 1000 }')
    say "round $round: $victim dies $delay s after the first save"
    scenario "round$round" "$victim" "" "" "$delay"
  done
  ;;
*) fail "unknown mode $mode" ;;
esac
fresh_hosts h1 h2
say "ok"
