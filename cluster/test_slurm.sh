#!/usr/bin/env bash
# Tests cluster/train_mlp.sbatch on a one-machine Slurm cluster (Debian's slurmctld,
# slurmd and slurm-client; run as root; see ../shared/SLURM.md for the setup facts).
# The job gets a 1-minute limit and --signal=B:USR1@50, so Slurm itself signals it
# mid-run. Checks: allocation 1 commits a *_breakpoint checkpoint and requeues;
# allocation 2 (SLURM_RESTART_COUNT=1) resumes from exactly that state (the same
# fingerprint) and, with MAX_REQUEUES=1, saves again on its own signal and ends.
# Takes about 4 minutes: Slurm holds a requeued job for ~2-3 minutes.
#   bash cluster/test_slurm.sh BUILD_DIR [WORK_DIR]
set -euo pipefail
build=$(cd "$1" && pwd)
work=${2:-/tmp/distckpt-slurm-test}
here=$(cd "$(dirname "$0")" && pwd)
for tool in slurmctld slurmd sbatch scontrol; do
  command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install slurmctld slurmd slurm-client"; exit 1; }
done

rm -rf "$work"
mkdir -p "$work/state" "$work/spool" "$work/ckpt"
node=$(hostname -s)
nodeline=$(slurmd -C | head -1 | sed "s/^NodeName=[^ ]*/NodeName=$node/")
export SLURM_CONF=$work/slurm.conf
cat > "$SLURM_CONF" <<CONF
ClusterName=distckpt-test
SlurmctldHost=$node
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobRequeue=1
ReturnToService=2
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
$nodeline State=UNKNOWN
PartitionName=test Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF
stop() {
  for pid in "$work/slurmd.pid" "$work/slurmctld.pid"; do
    [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null || true
  done
}
trap stop EXIT
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 1 60); do sinfo -h -o %t 2>/dev/null | grep -q idle && break; sleep 1; done
sinfo

job=$(sbatch --parsable --time=1 --signal=B:USR1@50 --output="$work/job.out" \
  --export=ALL,BUILD_DIR="$build",CKPT_DIR="$work/ckpt",MAX_REQUEUES=1,SAVE_SECONDS=5,STEPS=1000000000 \
  "$here/train_mlp.sbatch")
echo "submitted job $job"
state=
for _ in $(seq 1 600); do
  state=$(scontrol show job "$job" | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
  case "$state" in COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY) break ;; esac
  sleep 1
done
restarts=$(scontrol show job "$job" | sed -n 's/.*Restarts=\([0-9]*\).*/\1/p')
cat "$work/job.out"
echo "job $job: state $state, restarts $restarts"
[ "$state" = COMPLETED ] || { echo "FAIL: the job ended $state"; exit 1; }
[ "$restarts" = 1 ] || { echo "FAIL: expected one requeue, got $restarts"; exit 1; }
[ "$(grep -c '^signal received: saved .*_breakpoint' "$work/job.out")" -eq 2 ] ||
  { echo "FAIL: expected a breakpoint save in each allocation"; exit 1; }
grep -q '^requeueing job' "$work/job.out" || { echo "FAIL: allocation 1 did not requeue"; exit 1; }
first=$(grep -m1 '^signal received: saved' "$work/job.out")
step=${first##*at step }; step=${step%%,*}
saved=$(awk -v s="$step" '$1 == "saved" && $3 == s {print $5; exit}' "$work/job.out")
resumed=$(grep -m1 '^resumed from' "$work/job.out")
restored=$(awk '/^restored step/ {print $3, $5; exit}' "$work/job.out")
echo "allocation 1 stopped at step $step ($saved); allocation 2: $resumed, restored $restored"
[[ "$resumed" == *"_breakpoint" ]] || { echo "FAIL: allocation 2 did not resume from the breakpoint"; exit 1; }
[ "$restored" = "$step $saved" ] || { echo "FAIL: restored state differs from the breakpoint"; exit 1; }
"$build/distckpt" verify "$work/ckpt"
echo "slurm requeue: ok"
