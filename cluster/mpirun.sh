#!/usr/bin/env bash
# mpirun across hosts of the namespace cluster (netns.sh). mpirun itself runs in the
# first host named, as it would on the first node of a batch allocation; its daemons
# reach the other hosts through the rsh agent (agent.sh), which enters their
# namespaces. Between hosts ranks use TCP on eth0, within a host shared memory.
#
#   cluster/mpirun.sh h1:2,h2:2 [mpirun options] program [args]
#
# The first argument lists host:slots; ranks fill the hosts in that order (ranks 0,1
# on the first host, ...). Every other argument goes to mpirun unchanged. mpirun runs in
# the first host, or in DCK_LAUNCH_HOST (a host that runs no rank unless listed).
# DCK_MPIRUN_ARGS adds mpirun options (e.g. "--mca plm_base_verbose 5" to debug).
#
# Failure detection (why each parameter is set):
#   oob_tcp_keepalive_*  mpirun and its daemons probe idle connections every second
#                        after 3 s of silence and give up after 3 missed probes: a host
#                        that loses power (no FIN, no RST) is seen in about 6 s, not Open
#                        MPI's default 8 minutes (300 s + 9 x 20 s). (Probes are answered
#                        by the kernel, so a busy host does not miss them; on a real
#                        network docs/guide/tiers.md "Several nodes" suggests 10/5/3.)
#   net.ipv4.tcp_retries2 (set per host by netns.sh) bounds the time a connection with
#                        unacknowledged data waits for a dead peer (keepalive only
#                        covers idle ones): 3 retries, about 3 s, instead of ~15 min.
#   DISTCKPT_PEER_TIMEOUT_S  distckpt's own bound on the time a rank waits for its peers
#                        in a collective after its own work is done (docs/guide/tiers.md "Several
#                        nodes"); the caller sets it, this script only passes it on.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
hosts=${1:?host:slots list, e.g. h1:2,h2:2}
shift
first=${hosts%%:*}
first=${first%%,*}
launch=${DCK_LAUNCH_HOST:-$first}  # where mpirun runs (default: the first host)
root_flags=()
[ "$(id -u)" -eq 0 ] && root_flags=(--allow-run-as-root)
exec "$here/netns.sh" exec "$launch" mpirun "${root_flags[@]}" --oversubscribe --bind-to none \
  --host "$hosts" \
  --mca plm_rsh_agent "$here/agent.sh" --mca plm_rsh_no_tree_spawn 1 \
  --mca btl tcp,vader,self --mca btl_tcp_if_include eth0 --mca oob_tcp_if_include eth0 \
  --mca oob_tcp_keepalive_time 3 --mca oob_tcp_keepalive_intvl 1 --mca oob_tcp_keepalive_probes 3 \
  ${DCK_MPIRUN_ARGS:-} "$@"
