# Shared by the multi-node tests (sourced): the cluster, jobs in the background, and
# the checks every scenario makes.
#   source lib.sh BUILD_DIR TEST_NAME
set -uo pipefail
build=$(cd "${1:?build directory}" && pwd)
test_name=${2:?test name}
cluster_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
netns=$cluster_dir/netns.sh
shared=${DCK_CLUSTER_DIR:-/var/tmp/dck-cluster}/shared  # /dck/shared inside the hosts
log_dir=$shared/logs/$test_name

say() { echo "[$test_name $(date +%T)] $*"; }
fail() {
  say "FAIL: $*"
  exit 1
}

# Exit 77 (CTest: skipped) when the cluster cannot be made here; under CI=true a skip
# is a failure (CI runs as root: the test bed must work there).
skip_unless_possible() {
  local why=
  if [ "$(id -u)" -ne 0 ]; then why="needs root (network and mount namespaces)"
  elif ! command -v ip >/dev/null || ! command -v nsenter >/dev/null || ! command -v unshare >/dev/null; then
    why="needs ip (iproute2), nsenter and unshare (util-linux)"
  elif ! ip netns list >/dev/null 2>&1; then why="ip netns does not work here"
  fi
  if [ -z "$why" ]; then
    mkdir -p "$log_dir"
    return 0
  fi
  if [ "${CI:-}" = true ]; then
    echo "$test_name: cannot run: $why, and CI=true forbids skipping"
    exit 1
  fi
  echo "$test_name: SKIPPED: $why"
  exit 77
}

# The hosts this test needs exist, fresh: a host a previous test killed or cut is
# replaced. Hosts: h1..hN.
fresh_hosts() {
  local h
  for h in "$@"; do
    bash "$netns" remove "$h" >/dev/null 2>&1
    bash "$netns" add "$h" >/dev/null || fail "cannot bring up host $h"
  done
}

now() { date +%s.%N; }
elapsed() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.1f\n", a - b }'; }  # seconds since $1 (a now value)
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# start_job NAME HOSTS NP ARGS...: mpirun in the background on HOSTS (host:slots,...);
# its output goes to $log_dir/NAME.log, its exit status to $log_dir/NAME.rc.
start_job() {
  local name=$1 hosts=$2 np=$3
  shift 3
  mkdir -p "$log_dir"
  rm -f "$log_dir/$name.rc"
  ( "$cluster_dir/mpirun.sh" "$hosts" -np "$np" "$@" >"$log_dir/$name.log" 2>&1
    echo $? >"$log_dir/$name.rc" ) </dev/null >/dev/null 2>&1 &
}
# run_job NAME HOSTS NP ARGS...: the same, in the foreground; returns mpirun's status
# (fails the test when the job runs longer than RUN_JOB_TIMEOUT, default 120 s).
run_job() {
  local name=$1
  start_job "$@"
  wait_job "$name" "${RUN_JOB_TIMEOUT:-120}" >/dev/null || {
    show_log "$name"
    bash "$netns" pids | while read -r p; do echo "    left: $p $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-150)"; done
    fail "$name did not end in ${RUN_JOB_TIMEOUT:-120} s"
  }
  return "$(cat "$log_dir/$name.rc")"
}
# wait_job NAME SECONDS: waits for the job to end; prints its status; 1 on timeout.
wait_job() {
  local i
  for i in $(seq 1 $(($2 * 10))); do
    [ -s "$log_dir/$1.rc" ] && { cat "$log_dir/$1.rc"; return 0; }
    sleep 0.1
  done
  return 1
}
# wait_log NAME PATTERN SECONDS: waits for PATTERN (grep -E) in the job's output.
wait_log() {
  local i
  for i in $(seq 1 $(($3 * 10))); do
    grep -qE "$2" "$log_dir/$1.log" 2>/dev/null && return 0
    [ -s "$log_dir/$1.rc" ] && break
    sleep 0.1
  done
  grep -qE "$2" "$log_dir/$1.log" 2>/dev/null
}
show_log() { sed 's/^/    | /' "$log_dir/$1.log" | grep -vE '^    \| step [0-9]+ loss' | tail -n "${2:-25}"; }

# Every process of every host: none may be left once a job has ended.
job_processes() { bash "$netns" pids; }
# wait_no_processes SECONDS: 0 when no process is left on any host within the time.
wait_no_processes() {
  local i
  for i in $(seq 1 $(($1 * 10))); do
    [ -z "$(job_processes)" ] && return 0
    sleep 0.1
  done
  return 1
}

# The steps of the committed checkpoints of a root (distckpt ls --json), oldest first.
committed_steps() {
  "$build/distckpt" ls --json "$1" 2>/dev/null |
    python3 -c 'import json,sys; print(" ".join(str(e["step"]) for e in json.load(sys.stdin)["entries"] if e["state"] == "committed"))'
}
verify_all() { "$build/distckpt" verify "$1" >"$log_dir/verify.out" 2>&1 || { cat "$log_dir/verify.out"; return 1; }; }

# fingerprint LOG WHAT STEP: the fingerprint train_mlp printed as "WHAT step STEP fingerprint F".
fingerprint() { awk -v w="$2" -v s="$3" '$1 == w && $2 == "step" && $3 == s { print $5; exit }' "$1"; }

# reference_fingerprint STEP DP TP: the state of an uninterrupted run at STEP on one
# host (training is deterministic: the same layout gives the same state).
reference_fingerprint() {
  local step=$1 dp=$2 tp=$3 dir=$shared/reference-$RANDOM
  mpirun --allow-run-as-root --oversubscribe --bind-to none -np $((dp * tp)) "$build/train_mlp" --dp "$dp" --tp "$tp" \
    --steps "$step" --save-every 0 --log-every 100000 $TRAIN_SHAPE --dir "$dir" >"$log_dir/reference.log" 2>&1 ||
    { cat "$log_dir/reference.log"; fail "the reference run failed"; }
  rm -rf "$dir"
  fingerprint "$log_dir/reference.log" final "$step"
}

# The model of the multi-node tests: big enough that a save takes a moment (so that
# a kill lands inside one), small enough for a 2-core machine.
TRAIN_SHAPE=${TRAIN_SHAPE:---hidden 256 --in 64 --out 16}
# distckpt's peer timeout (train_mlp --peer-timeout) in the jobs that lose a host: the
# survivors' wait for it is part of each test's time, so it is short. The jobs nothing
# kills keep the default (600 s), which only ends a real hang: with 5 s there, a healthy
# resume on a busy 2-core CI machine ended itself when rank 0 spent over 5 s alone (the
# final save's commit) while its peer waited. 10 s leaves the killed jobs that margin too.
KILL_PEER_TIMEOUT=10
