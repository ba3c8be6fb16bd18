#!/usr/bin/env bash
# A cluster of N hosts on one machine (root): each host is a network namespace joined to
# the others by a bridge, with its own hostname (a UTS namespace), its own node-local
# directory at /dck/local, its own /dev/shm and /tmp (a mount namespace binds per-host
# directories there; no host sees another's), and /etc/hosts naming every host. One
# directory, /dck/shared, is the same on every host: the parallel file system.
#
# Every command run in a host (`exec`, which the MPI rsh agent uses) enters the host's
# network namespace and makes a UTS and mount namespace of its own with the host's
# name and views: processes of one host, started apart, see the same directories.
# (Persistent mount namespaces cannot be entered from inside another host's, where the
# rsh agent runs: their handles are bound on a private mount by necessity.)
#
# The bridge lives in a namespace of its own (dck-switch): no host, and not the machine's
# own network, has a route to anything else; hosts talk to each other only.
#
#   netns.sh up N            hosts h1..hN (10.77.0.1..N), and the switch
#   netns.sh add HOST        one more host (a spare, or a dead host's replacement)
#   netns.sh remove HOST     the host is gone for good (namespace, link, files)
#   netns.sh kill HOST       a host dies: its link goes down first (no FIN or RST leaves
#                            it), then every process in it is killed (SIGKILL) and its
#                            node-local directory and /dev/shm are wiped
#   netns.sh crash HOST      its processes are killed; link and files stay
#   netns.sh cut HOST        its link goes down (a network partition); nothing is killed
#   netns.sh heal HOST       its link comes back up
#   netns.sh exec HOST CMD   runs CMD in the host (what the MPI rsh agent does)
#   netns.sh pids [HOST]     the processes running in the host(s)
#   netns.sh hostfile H...   an Open MPI hostfile for these hosts (slots=2 each)
#   netns.sh down            everything goes: processes, namespaces, mounts, files;
#                            idempotent
#   netns.sh check-clean     exit 1 (naming them) if any of our namespaces, bridges,
#                            mounts or processes is left
#
# Prefer the MPI wrapper (mpirun.sh) to running mpirun by hand.
set -uo pipefail
base=${DCK_CLUSTER_DIR:-/var/tmp/dck-cluster}
subnet=10.77.0
switch=dck-switch
bridge=dck-br0

die() { echo "netns.sh: $*" >&2; exit 1; }
host_ip() { echo "$subnet.${1#h}"; }
veth_host() { echo "dck-$1"; }   # the switch's end of the host's link

need_root() { [ "$(id -u)" -eq 0 ] || die "needs root (namespaces, mounts)"; }

# Lists are searched with awk reading to the end, never `| grep -q`: under pipefail, grep
# leaving at its first match can kill the writer with SIGPIPE and fail a pipeline that matched.
ns_exists() { ip netns list 2>/dev/null | awk -v n="$1" '$1 == n { found = 1 } END { exit !found }'; }
host_exists() { [ -e "/run/netns/dck-$1" ] || ns_exists "dck-$1"; }

write_hosts() {
  {
    echo "127.0.0.1 localhost"
    for d in "$base"/hosts/h*; do
      [ -d "$d" ] || continue
      h=$(basename "$d")
      echo "$(host_ip "$h") $h"
    done
  } >"$base/etc-hosts"
}

make_switch() {  # and the directories every host binds
  mkdir -p "$base/shared" "$base/hosts" /dck/local /dck/shared
  chmod 1777 "$base/shared"
  ns_exists "$switch" && return 0
  ip netns add "$switch" || die "ip netns add $switch failed"
  ip -n "$switch" link add "$bridge" type bridge || die "cannot make a bridge"
  ip -n "$switch" link set "$bridge" up
  ip -n "$switch" link set lo up
}

add_host() {
  local h=$1
  [[ "$h" =~ ^h[0-9]+$ ]] || die "host names are h1, h2, ... (got '$h')"
  host_exists "$h" && die "$h exists"
  make_switch
  local ns=dck-$h dir=$base/hosts/$h
  mkdir -p "$dir/local" "$dir/shm" "$dir/tmp"
  chmod 1777 "$dir/shm" "$dir/tmp"
  ip netns add "$ns" || die "ip netns add $ns failed"
  ip link add "$(veth_host "$h")" type veth peer name eth0 netns "$ns" || die "cannot make a veth pair"
  ip link set "$(veth_host "$h")" netns "$switch"
  ip -n "$switch" link set "$(veth_host "$h")" master "$bridge" up
  ip -n "$ns" addr add "$(host_ip "$h")/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  # A connection with unacknowledged data to a dead host is given up after 3
  # retransmissions (about 3 s) instead of 15 (about 15 minutes): mpirun's messages
  # to a dead daemon would otherwise keep it waiting that long. A live peer on this
  # local link acknowledges within a millisecond, and one whose receive buffer is full
  # answers the zero-window probes, so only a dead host reaches the limit. Per
  # namespace: the machine's own setting is untouched.
  ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=3
  write_hosts
  # Every host's /etc/hosts is the same file: hosts added later are seen by all.
  echo "$h $(host_ip "$h")"
}

in_host() {  # HOST CMD...: run in the host's namespaces
  local h=$1
  shift
  host_exists "$h" || die "no host $h"
  local dir=$base/hosts/$h
  # A repository checked out under /tmp or /dev/shm, which each host replaces with its
  # own, stays visible at its path (its build, the rsh agent): bound into the host's view
  # first, which is then bound with its submounts.
  local repo at=""
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
  case "$repo/" in
    /tmp/*) at=tmp${repo#/tmp} ;;
    /dev/shm/*) at=shm${repo#/dev/shm} ;;
  esac
  # A new mount namespace, a slave of the one it is made in (mounts made later outside,
  # such as new hosts' network namespaces, still appear), over which the host's views
  # are bound.
  exec nsenter --net="/run/netns/dck-$h" -- unshare --mount --uts --propagation slave -- \
    sh -c 'hostname "$0" && { [ -z "$4" ] || { mkdir -p "$1/$4" && mount --bind "$3" "$1/$4"; }; } &&
           mount --bind "$1/local" /dck/local && mount --rbind "$1/shm" /dev/shm && mount --rbind "$1/tmp" /tmp &&
           mount --bind "$2/shared" /dck/shared && mount --bind "$2/etc-hosts" /etc/hosts && shift 5 && exec "$@"' \
    "$h" "$dir" "$base" "$repo" "$at" -- "$@"
}

host_pids() { ip netns pids "dck-$1" 2>/dev/null; }

kill_procs() {
  local h=$1 pids
  for _ in 1 2 3 4 5; do
    pids=$(host_pids "$h")
    [ -z "$pids" ] && return 0
    kill -KILL $pids 2>/dev/null
    sleep 0.2
  done
}

case ${1:-} in
up)
  need_root
  n=${2:?hosts}
  for i in $(seq 1 "$n"); do add_host "h$i"; done
  ;;
add)
  need_root
  add_host "${2:?host}"
  ;;
kill)
  need_root
  h=${2:?host}
  ip -n "$switch" link set "$(veth_host "$h")" down 2>/dev/null  # first: nothing more leaves it
  ip -n "dck-$h" link set eth0 down 2>/dev/null
  kill_procs "$h"
  rm -rf "${base:?}/hosts/$h/local/"* "${base:?}/hosts/$h/shm/"* "${base:?}/hosts/$h/tmp/"* 2>/dev/null
  ;;
remove)
  need_root
  h=${2:?host}
  host_exists "$h" || exit 0
  kill_procs "$h"
  ip netns del "dck-$h" 2>/dev/null   # takes eth0 and so its peer on the switch with it
  ip -n "$switch" link del "$(veth_host "$h")" 2>/dev/null
  rm -rf "${base:?}/hosts/$h"
  write_hosts
  ;;
crash)
  need_root
  kill_procs "${2:?host}"
  ;;
cut)
  need_root
  ip -n "$switch" link set "$(veth_host "${2:?host}")" down
  ;;
heal)
  need_root
  ip -n "$switch" link set "$(veth_host "${2:?host}")" up
  # Addresses that failed to resolve while the link was down stay "FAILED" in the
  # hosts' neighbour tables for a while, and connections to them fail at once (No route
  # to host): an Open MPI daemon started then cannot reach mpirun and mpirun waits
  # for it forever. A healed network resolves again; so do the hosts here.
  for d in "$base"/hosts/h*; do ip -n "dck-$(basename "$d")" neigh flush all 2>/dev/null; done
  ;;
exec)
  need_root
  h=${2:?host}
  shift 2
  in_host "$h" "$@"
  ;;
pids)
  if [ -n "${2:-}" ]; then host_pids "$2"; else for d in "$base"/hosts/h*; do [ -d "$d" ] && host_pids "$(basename "$d")"; done; fi
  ;;
hostfile)
  shift
  for h in "$@"; do echo "$h slots=2"; done
  ;;
down)
  [ "$(id -u)" -eq 0 ] || exit 0
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^dck-'); do
    pids=$(ip netns pids "$ns" 2>/dev/null)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null
  done
  sleep 0.2
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^dck-'); do ip netns del "$ns" 2>/dev/null; done
  rm -rf "${base:?}"
  rmdir /dck/local /dck/shared /dck 2>/dev/null
  ;;
check-clean)
  left=
  ns=$(ip netns list 2>/dev/null | awk '{print $1}' | grep '^dck-')
  [ -n "$ns" ] && left+=" namespaces: $ns;"
  ip -o link show 2>/dev/null | awk '/dck-/ { found = 1 } END { exit !found }' && left+=" links: $(ip -o link show | awk -F': ' '/dck-/{print $2}');"
  grep -q "$base" /proc/mounts && left+=" mounts: $(grep "$base" /proc/mounts | awk '{print $2}' | tr '\n' ' ');"
  [ -e "$base" ] && left+=" directory $base;"
  procs=$(pgrep -f "$base|/dck/shared|dck-cluster" | grep -v "^$$\$" || true)
  [ -n "$procs" ] && left+=" processes: $procs;"
  if [ -n "$left" ]; then echo "netns.sh: left behind:$left"; exit 1; fi
  echo "netns.sh: clean"
  ;;
*)
  sed -n '2,30p' "$0"
  exit 2
  ;;
esac
