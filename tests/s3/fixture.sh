#!/usr/bin/env bash
# The s3 label's store: a single-node Ceph RGW (scripts/s3.sh) brought up before the label's
# tests and taken down after them (CTest fixture s3). Without Ceph installed it reports
# itself skipped (exit 77), except under CI=true, where that is a failure.
# Usage: fixture.sh up|down DIR
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
action=$1 dir=$2
if ! command -v radosgw >/dev/null || ! command -v ceph-mon >/dev/null; then
  if [ "${CI:-}" = true ]; then
    echo "s3 fixture $action: cannot run: Ceph is not installed (bash scripts/setup.sh), and CI=true forbids skipping"
    exit 1
  fi
  echo "s3 fixture $action: SKIPPED: Ceph is not installed (bash scripts/setup.sh installs it)"
  exit 77
fi
if [ "$action" = up ]; then
  start=$SECONDS
  bash "$here/../../scripts/s3.sh" up "$dir" >"$dir.env" 2>"$dir.log" || { cat "$dir.log"; exit 1; }
  echo "s3 fixture up: RGW at $(grep ENDPOINT "$dir.env" | cut -d= -f2) in $((SECONDS - start)) s"
else
  bash "$here/../../scripts/s3.sh" down "$dir"
  if pgrep -f -- "-c $dir/ceph.conf" >/dev/null; then
    echo "s3 fixture down: daemons of $dir are still running"
    exit 1
  fi
  rm -f "$dir.env" "$dir.log"
  echo "s3 fixture down: stopped and removed"
fi
