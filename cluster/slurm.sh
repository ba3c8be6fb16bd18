#!/usr/bin/env bash
# Slurm on the namespace cluster (netns.sh): slurmctld on a host of its own (h10, the
# "login node", which runs no job), one slurmd per compute host, each inside its
# host's namespaces (so its jobs are too). Debian 12's Slurm 22.05 with auth/none.
# Client commands (sbatch, squeue, scontrol, scancel) reach the
# controller from h10: `slurm.sh cmd sbatch ...`.
#
#   slurm.sh up H...         the controller, and the compute hosts H (h1 h2 ...) in
#                            slurm.conf; starts slurmd on each host that is up
#   slurm.sh start-node H    starts slurmd on H (a spare host joining)
#   slurm.sh cmd CMD...      runs a client command on h10 (SLURM_CONF set)
#   slurm.sh wait-idle N     waits (up to 60 s) until N nodes are idle
#   slurm.sh down            stops the daemons (netns.sh down takes the rest)
#
# Settings that matter for failures:
#   SlurmdTimeout=6      a host that stops answering is marked DOWN within seconds
#                        (the controller pings every SlurmdTimeout/3), so its jobs
#                        are requeued quickly;
#   AuthInfo=cred_expire=10  a requeued job is held this long before it may start
#                        again (default 120 s: the "requeue hold" of SLURM.md);
#   sched_interval=2, bf_interval=2  a pending job whose hold has ended is looked at
#                        within 2 s (defaults: 60 s and 30 s);
#   ReturnToService=2    a host that comes back answering is usable again;
#   JobRequeue=1         batch jobs may be requeued (node failure, scontrol requeue).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
base=${DCK_CLUSTER_DIR:-/var/tmp/dck-cluster}
conf_dir=$base/shared/slurm   # /dck/shared/slurm inside the hosts
inside=/dck/shared/slurm
controller=h10

die() { echo "slurm.sh: $*" >&2; exit 1; }
in_host() { "$here/netns.sh" exec "$@"; }

write_conf() {
  local nodes=("$@") cpus
  cpus=$(nproc)
  mkdir -p "$conf_dir/state" "$conf_dir/log"
  {
    cat <<CONF
ClusterName=dck
SlurmctldHost=$controller(10.77.0.${controller#h})
AuthType=auth/none
CredType=cred/none
AuthInfo=cred_expire=10
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
JobRequeue=1
ReturnToService=2
SlurmdTimeout=6
SlurmctldTimeout=10
MessageTimeout=5
InactiveLimit=0
KillWait=5
MinJobAge=300
SchedulerParameters=batch_sched_delay=1,sched_min_interval=100000,sched_interval=2,bf_interval=2
StateSaveLocation=$inside/state
SlurmdSpoolDir=/dck/local/slurmd
SlurmctldPidFile=$inside/slurmctld.pid
SlurmdPidFile=/dck/local/slurmd.pid
SlurmctldLogFile=$inside/log/slurmctld.log
SlurmdLogFile=$inside/log/slurmd-%n.log
SlurmctldParameters=enable_configless
CONF
    for h in "${nodes[@]}"; do
      echo "NodeName=$h NodeAddr=10.77.0.${h#h} CPUs=$cpus State=UNKNOWN"
    done
    echo "PartitionName=dck Nodes=$(IFS=,; echo "${nodes[*]}") Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4"
  } >"$conf_dir/slurm.conf"
}

start_node() {
  local h=$1
  in_host "$h" sh -c "mkdir -p /dck/local/slurmd && SLURM_CONF=$inside/slurm.conf slurmd -N $h" ||
    die "slurmd did not start on $h"
}

case ${1:-} in
up)
  shift
  [ $# -ge 1 ] || die "name the compute hosts"
  for tool in slurmctld slurmd sbatch scontrol; do
    command -v "$tool" >/dev/null || die "$tool not found: apt-get install slurmctld slurmd slurm-client"
  done
  rm -rf "$conf_dir"
  write_conf "$@"
  "$here/netns.sh" add "$controller" >/dev/null 2>&1 || true
  in_host "$controller" sh -c "SLURM_CONF=$inside/slurm.conf slurmctld" || die "slurmctld did not start"
  for h in "$@"; do if [ -e "/run/netns/dck-$h" ]; then start_node "$h"; fi; done
  ;;
start-node)
  start_node "${2:?host}"
  ;;
cmd)
  shift
  in_host "$controller" env SLURM_CONF="$inside/slurm.conf" "$@"
  ;;
wait-idle)
  for _ in $(seq 1 120); do
    n=$("$0" cmd sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)
    [ "$n" -ge "${2:?count}" ] && exit 0
    sleep 0.5
  done
  "$0" cmd sinfo -N
  die "fewer than $2 idle nodes after 60 s"
  ;;
down)
  for h in $(ls "$base/hosts" 2>/dev/null); do
    [ -e "/run/netns/dck-$h" ] || continue
    for p in $("$here/netns.sh" pids "$h"); do
      case $(cat "/proc/$p/comm" 2>/dev/null) in slurmd|slurmctld|slurmstepd) kill -KILL "$p" 2>/dev/null ;; esac
    done
  done
  ;;
*)
  sed -n '2,25p' "$0"
  exit 2
  ;;
esac
