#!/usr/bin/env bash
# Open MPI's rsh agent for the namespace cluster (netns.sh): "agent.sh HOST COMMAND..."
# runs COMMAND, as a remote shell would (one string for sh), inside HOST's namespaces.
# The environment is inherited, as mpirun's own.
here=$(cd "$(dirname "$0")" && pwd)
host=$1
shift
exec "$here/netns.sh" exec "$host" sh -c "$*"
