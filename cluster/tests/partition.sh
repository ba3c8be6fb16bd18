#!/usr/bin/env bash
# A network partition during a save: one host's link to the switch goes down (nothing
# is killed; both sides keep running). train_mlp runs DP2 x TP2 on h1 and h2; the
# other host's ranks are held at the data write of the second save (a kill point)
# so that the cut lands inside it. Checks:
#   - mpirun ends within 90 s of the cut, and 30 s later no process of the job is left
#     on any host, the cut-off one included (its ranks give up by distckpt's peer
#     timeout or by losing their daemon; its daemon by losing mpirun: keepalive);
#   - the previous checkpoint is intact (listed, verifies, still the newest);
#   - once the link is back, the job resumes from it exactly.
#   partition.sh BUILD_DIR
source "$(dirname "$0")/lib.sh" "$1" partition
skip_unless_possible
peer_timeout=$KILL_PEER_TIMEOUT

cut_during_save() {  # NAME CUT_HOST HELD_HOST
  local name=$1 cut=$2 held=$3 root=$shared/partition/$1 before after rc cut_at
  fresh_hosts h1 h2
  rm -rf "$root"
  mkdir -p "$root"
  start_job "$name" h1:2,h2:2 4 env DISTCKPT_PAUSE_AT=save-write@2 DISTCKPT_PAUSE_HOST="$held" \
    "$build/train_mlp" --dp 2 --tp 2 --steps 100000000 --save-every 2 --log-every 100000 \
    --peer-timeout "$peer_timeout" $TRAIN_SHAPE --dir "/dck/shared/partition/$name"
  wait_log "$name" "paused at kill point save-write" 60 || { show_log "$name"; fail "$name: the second save never started"; }
  before=$(committed_steps "$root")
  cut_at=$(now)
  bash "$netns" cut "$cut"
  say "$name: cut $cut off while $held's ranks are writing step 4 (committed: $before)"
  rc=$(wait_job "$name" 90) || { show_log "$name"; fail "$name: mpirun still running 90 s after the cut"; }
  say "$name: mpirun ended $(elapsed "$cut_at") s after the cut (status $rc)"
  for _ in $(seq 1 60); do
    [ -z "$(job_processes)" ] && break
    for p in $(job_processes); do echo "$(date +%T.%N) $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-80)"; done >>"$log_dir/$name.lingering"
    sleep 0.5
  done
  wait_no_processes 60 || fail "$name: processes left 60 s after mpirun ended: $(job_processes | tr '\n' ' ')"
  say "$name: no process left on any host $(elapsed "$cut_at") s after the cut"
  [ "$rc" -ne 0 ] || fail "$name: mpirun reported success"
  show_log "$name" 8
  after=$(committed_steps "$root")
  [ "$after" = "$before" ] || fail "$name: committed before the cut: '$before', after: '$after'"
  verify_all "$root" || fail "$name: the previous checkpoint does not verify"
  bash "$netns" heal "$cut"
  DCK_MPIRUN_ARGS="${RESUME_MPIRUN_ARGS:-}" run_job "$name.resume" h1:2,h2:2 4 "$build/train_mlp" --dp 2 --tp 2 --steps 6 --save-every 0 --log-every 100000 \
    $TRAIN_SHAPE --resume --dir "/dck/shared/partition/$name" || { show_log "$name.resume"; fail "$name: resume"; }
  local got want
  got=$(fingerprint "$log_dir/$name.resume.log" restored "${before##* }")
  want=$(reference_fingerprint "${before##* }" 2 2)
  [ -n "$got" ] && [ "$got" = "$want" ] || fail "$name: restored '$got', reference $want"
  say "$name: healed; resumed at step ${before##* } with the reference fingerprint $got"
}

if [ -n "${PARTITION_ONLY:-}" ]; then
  cut_during_save "$PARTITION_ONLY" "${PARTITION_ONLY#cut_}" "$([ "$PARTITION_ONLY" = cut_h2 ] && echo h1 || echo h2)"
else
  cut_during_save cut_h2 h2 h1  # the host without mpirun is cut off
  cut_during_save cut_h1 h1 h2  # mpirun's host (and rank 0) is cut off from the ranks on h2
fi
fresh_hosts h1 h2
say "ok"
