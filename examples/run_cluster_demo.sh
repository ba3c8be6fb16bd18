#!/usr/bin/env bash
# The main job: a 3-host training run that loses a host and is back from the hosts'
# memory, not from the shared file system.
#
#   bash examples/run_cluster_demo.sh BUILD_DIR WORK_DIR
#
# On the cluster of network namespaces of cluster/netns.sh (3 hosts + a spare, each with
# its own /dev/shm, and a shared directory standing in for the parallel file system):
#   (a) an uninterrupted reference run (DP3 x TP2, 6 ranks, 270 MB of state);
#   (b) the same run on h1-h3: a local checkpoint into each host's /dev/shm every 3
#       steps, every 2nd drained to the shared directory in the background; host h2 is
#       killed (link down, processes killed, memory wiped) after step 9 was saved;
#   (c) a resume on the survivors h1, h3 and a fresh spare h4, from the local tier:
#       the restore sources (bytes from the own host, a peer host, parity, the shared
#       directory) and the timings (save blocked, local commit, drain, recovery);
#   (d) the final fingerprint compared with (a).
# Without root or network namespaces it says why and runs the one-host demo
# (examples/run_train_mlp.sh) instead. Exit 0 when the fingerprints match.
set -euo pipefail
if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR WORK_DIR" >&2
  exit 2
fi
BUILD=$(cd "$1" && pwd)
WORK=$2
HERE=$(cd "$(dirname "$0")/.." && pwd)
NETNS=$HERE/cluster/netns.sh

why=
if [ "$(id -u)" -ne 0 ]; then why="not root (network and mount namespaces need it)"
elif ! command -v ip >/dev/null || ! command -v nsenter >/dev/null || ! command -v unshare >/dev/null; then
  why="ip, nsenter or unshare is missing"
elif ! ip netns list >/dev/null 2>&1; then why="ip netns does not work here"
fi
if [ -n "$why" ]; then
  echo "== the 3-host demo cannot run here: $why; running the one-host demo instead"
  exec bash "$HERE/examples/run_train_mlp.sh" "$BUILD" "$WORK"
fi

STEPS=16
MODEL=(--dp 3 --tp 2 --hidden 4096 --in 4096 --out 4160 --batch 2)  # 270 MB: weights + momentum
# DCK_DEMO_SMALL=1: the same story with a small model (the CTest variant, multinode.main_job).
# Its steps are fast (1.5 s after step 9 the killed run had committed step 15), so h2
# dies sooner, and the run goes on to step 60: a kill that lands late on a busy machine
# still restores a step the reference run has a fingerprint for.
KILL_AFTER=1.5  # seconds after "saved step 9": into step 10 or 11
[ "${DCK_DEMO_SMALL:-0}" = 1 ] && MODEL=(--dp 3 --tp 2 --hidden 240 --in 64 --out 16) && STEPS=60 && KILL_AFTER=0.3
TIER=(--local-dir /dev/shm/ckpt --local-every 3 --global-every 2 --keep-local 2 --keep-max 2)
CLUSTER=${DCK_CLUSTER_DIR:-/var/tmp/dck-cluster}
SHARED=$CLUSTER/shared  # /dck/shared inside the hosts
mkdir -p "$WORK"
LOG=$(cd "$WORK" && pwd)

final_fingerprint() { awk '$1 == "final" && $4 == "fingerprint" { fp = $5 } END { print fp }' "$1"; }
saved_fingerprint() { awk -v s="$2" '$1 == "saved" && $3 == s { fp = $5 } END { print fp }' "$1"; }  # LOG STEP
# A cluster already up (the CTest fixture) is used and left up, with fresh hosts;
# otherwise the demo brings it up and takes it down.
was_up=0
ip netns list 2>/dev/null | awk '$1 == "dck-switch" { up = 1 } END { exit !up }' && was_up=1
cleanup() {
  if [ "$was_up" = 1 ]; then bash "$NETNS" remove h4 >/dev/null 2>&1 || true
  else bash "$NETNS" down >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

echo "== (a) reference: $STEPS uninterrupted steps on this machine (6 ranks, DP3 x TP2)"
rm -rf "$LOG/ref"
mpirun --allow-run-as-root --oversubscribe --bind-to none -np 6 "$BUILD/train_mlp" "${MODEL[@]}" --steps "$STEPS" \
  --save-every 3 --keep-max 1 --log-every 4 --dir "$LOG/ref" >"$LOG/ref.log" 2>&1 || { cat "$LOG/ref.log"; exit 1; }
REF=$(final_fingerprint "$LOG/ref.log")
echo "reference: final step $STEPS fingerprint $REF"

echo
echo "== (b) 3 hosts (h1 h2 h3 x 2 ranks): local checkpoints in each host's /dev/shm, drained to the shared directory"
if [ "$was_up" = 1 ]; then
  for h in h1 h2 h3 h4; do bash "$NETNS" remove "$h" >/dev/null 2>&1 || true; done
  for h in h1 h2 h3; do bash "$NETNS" add "$h" >/dev/null; done
else
  bash "$NETNS" down >/dev/null 2>&1 || true
  bash "$NETNS" up 3 >/dev/null
fi
rm -rf "$SHARED/demo"
mkdir -p "$SHARED/demo"
start=$(date +%s.%N)
rm -f "$LOG/run.rc"
( set +e  # the job fails when its host dies: its status is wanted, not an exit
  bash "$HERE/cluster/mpirun.sh" h1:2,h2:2,h3:2 -np 6 "$BUILD/train_mlp" "${MODEL[@]}" "${TIER[@]}" --steps 100000 \
    --log-every 3 --peer-timeout 10 --dir /dck/shared/demo/run >"$LOG/run.log" 2>&1
  echo $? >"$LOG/run.rc" ) &
for _ in $(seq 1 1200); do
  grep -q "^saved step 9 " "$LOG/run.log" 2>/dev/null && break
  [ -s "$LOG/run.rc" ] && { cat "$LOG/run.log"; echo "the run ended early" >&2; exit 1; }
  sleep 0.1
done
grep -vE "^step [0-9]+ loss" "$LOG/run.log" | sed 's/^/   | /'
sleep "$KILL_AFTER"
killed=$(date +%s.%N)
bash "$NETNS" kill h2
echo "-- killed host h2 (link down, processes killed, its /dev/shm and local disk wiped)"
for _ in $(seq 1 900); do [ -s "$LOG/run.rc" ] && break; sleep 0.1; done
ended=$(awk -v a="$(date +%s.%N)" -v b="$killed" 'BEGIN { printf "%.1f", a - b }')
echo "-- mpirun ended ${ended} s after the kill (status $(cat "$LOG/run.rc" 2>/dev/null || echo '?'))"
grep -m1 "waited" "$LOG/run.log" | sed 's/^/   | /' || true
"$BUILD/distckpt" ls "$SHARED/demo/run" | sed 's/^/   /'

echo
echo "== (c) resume on h1, h3 and a fresh spare h4 (6 ranks): from the hosts' memory"
bash "$NETNS" add h4 >/dev/null
bash "$HERE/cluster/mpirun.sh" h1:2,h3:2,h4:2 -np 6 "$BUILD/train_mlp" "${MODEL[@]}" "${TIER[@]}" --steps "$STEPS" \
  --log-every 4 --dir /dck/shared/demo/run --resume >"$LOG/resume.log" 2>&1 ||
  { cat "$LOG/resume.log"; exit 1; }
grep -vE "^step [0-9]+ loss" "$LOG/resume.log" | sed 's/^/   | /'
RESUMED=$(final_fingerprint "$LOG/resume.log")
restored=$(awk '$1 == "restored" { print $3 }' "$LOG/resume.log")
# The uninterrupted run's fingerprint at that step. The killed run prints its own only
# once every rank has the fingerprint: a host that dies just after a commit leaves
# a checkpoint that the killed run never printed.
expected=$(saved_fingerprint "$LOG/ref.log" "$restored")
saved=$(saved_fingerprint "$LOG/run.log" "$restored")
got=$(awk '$1 == "restored" { print $5 }' "$LOG/resume.log")
echo "-- restored step $restored fingerprint $got; the uninterrupted run had ${expected:-<none>} there," \
  "the killed run saved ${saved:-<died before printing it>}"

echo
echo "== timings (stats.jsonl in the shared directory; medians over the run's saves)"
python3 - "$SHARED/demo/run/stats.jsonl" <<'EOF'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
local = [l for l in lines if l.get("tier") == "local"]
drain = [l for l in lines if l.get("tier") == "drain"]
resume = [l for l in lines if l.get("event") == "resume"]
med = lambda xs: statistics.median(xs) if xs else float("nan")
if local:
    print(f"   local save: training blocked {med([l['blocking_s'] for l in local]):.2f} s "
          f"(write {med([l['write_s'] for l in local]):.2f} s, local commit {med([l['commit_s'] for l in local]):.2f} s), "
          f"{local[-1]['bytes_local'] / 1e6:.0f} MB over 3 hosts, storage per host {local[-1]['storage_ratio']:.2f} x its state")
if drain:
    print(f"   drain to the shared directory, in the background: {med([l['drain_s'] for l in drain]):.2f} s "
          f"({drain[-1]['bytes'] / 1e6:.0f} MB, once per replica set)")
for r in resume:
    s = r["sources"]
    print(f"   recovery of {r['name']}: {r['restore_s']:.2f} s; bytes from the own host {s['local']}, "
          f"a peer host {s['peer']}, parity {s['parity']}, the shared directory {s['global']}")
EOF

echo
echo "== (d) comparing final fingerprints"
echo "reference: ${REF:-<none>}"
echo "resumed:   ${RESUMED:-<none>}"
if [[ -n $REF && $REF == "$RESUMED" && -n $expected && $expected == "$got" && ( -z $saved || $saved == "$got" ) ]]; then
  echo "fingerprints match: $REF"
  exit 0
fi
echo "fingerprints MISMATCH" >&2
exit 1
