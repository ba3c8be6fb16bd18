#!/usr/bin/env bash
# Launch helper: run any distckpt program under mpirun on this machine, as root or not.
#   bash cluster/run_local.sh 4 build/train_mlp --dp 2 --tp 2 --dir /tmp/ckpt
set -euo pipefail
np=$1
shift
exec mpirun --oversubscribe --bind-to none ${EUID:+$([ "$EUID" -eq 0 ] && echo --allow-run-as-root)} -np "$np" "$@"
