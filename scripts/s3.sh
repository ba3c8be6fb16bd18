#!/usr/bin/env bash
# A single-node Ceph cluster with a RADOS Gateway (S3) on 127.0.0.1, every file under one
# work directory: one monitor, one manager, one memstore OSD, one radosgw, one S3 user.
# Debian 12's Ceph (16.2): ceph-mon ceph-osd ceph-mgr radosgw ceph-common.
#
#   scripts/s3.sh up   [DIR]   bring it up (about 40 s); prints the environment, as env does
#   scripts/s3.sh env  [DIR]   the environment a client needs (AWS_ENDPOINT_URL, keys, region)
#   scripts/s3.sh down [DIR]   stop every daemon and remove DIR
#
# DIR defaults to $DISTCKPT_S3_DIR, else /tmp/distckpt-s3. S3_PORT (default 7480) and
# S3_MEMSTORE_MIB (default 4096: the OSD's memory; Ceph's default 1 GiB fills up) are read
# by `up`. Authentication inside the cluster is off (one host, loopback only); the gateway
# checks S3 signatures (SigV4) as any S3 store does.
set -euo pipefail
cmd=${1:-}
dir=${2:-${DISTCKPT_S3_DIR:-/tmp/distckpt-s3}}
port=${S3_PORT:-7480}
memstore_mib=${S3_MEMSTORE_MIB:-4096}
conf=$dir/ceph.conf
access_key=distckpt-test-access
secret_key=distckpt-test-secret-key-not-a-secret

print_env() {
  local p
  p=$(cat "$dir/port" 2>/dev/null || echo "$port")
  echo "export AWS_ENDPOINT_URL=http://127.0.0.1:$p"
  echo "export AWS_REGION=us-east-1"
  echo "export AWS_ACCESS_KEY_ID=$access_key"
  echo "export AWS_SECRET_ACCESS_KEY=$secret_key"
}

down() {
  for pidfile in "$dir"/run/*.pid; do
    [ -f "$pidfile" ] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  # Daemons that wrote no pid file yet: every process started with this configuration.
  pkill -f -- "-c $conf" 2>/dev/null || true
  for _ in $(seq 50); do
    pgrep -f -- "-c $conf" >/dev/null 2>&1 || break
    sleep 0.2
  done
  pkill -9 -f -- "-c $conf" 2>/dev/null || true
  rm -rf "$dir"
}

fail() {
  echo "s3.sh: $*" >&2
  [ "${last_attempt:-1}" = 1 ] || exit 1  # retried: the logs of the last attempt only
  for log in "$dir"/log/*.log; do
    [ -f "$log" ] && { echo "--- $log (end)" >&2; tail -n 20 "$log" >&2; }
  done
  exit 1
}

up_once() {
  for tool in ceph-mon ceph-mgr ceph-osd radosgw radosgw-admin monmaptool ceph curl; do
    command -v "$tool" >/dev/null || fail "$tool is not installed (bash scripts/setup.sh installs Ceph)"
  done
  [ -e "$dir" ] && down
  mkdir -p "$dir"/{run,log,mon,osd,mgr,rgw}
  echo "$port" >"$dir/port"
  local fsid
  fsid=$(cat /proc/sys/kernel/random/uuid)
  cat >"$conf" <<EOF
[global]
fsid = $fsid
mon host = 127.0.0.1:6789
public network = 127.0.0.0/8
auth cluster required = none
auth service required = none
auth client required = none
osd pool default size = 1
osd pool default min size = 1
mon allow pool size one = true
osd pool default pg num = 8
osd pool default pgp num = 8
mon max pg per osd = 1000
osd crush chooseleaf type = 0
osd objectstore = memstore
# The OSD is placed in the CRUSH map by this script, not by its own commands at boot: those
# can reach the monitor before the OSD knows the cluster's fsid, and are then refused
# ("wrong fsid"), failing the OSD's start.
osd crush update on start = false
osd class update on start = false
memstore device bytes = $((memstore_mib << 20))
# Full ratios: the OSD is marked full at 95% (the failsafe just above), and RADOS then
# pauses writes; the gateway's operations time out (rados osd op timeout, below), so that a
# PUT into a full store fails (408 RequestTimeout after about 20 s) instead of hanging.
mon osd full ratio = 0.95
mon osd backfillfull ratio = 0.95
mon osd nearfull ratio = 0.9
osd failsafe full ratio = 0.97
run dir = $dir/run
pid file = $dir/run/\$name.pid
admin socket = $dir/run/\$name.asok
log file = $dir/log/\$name.log
mon data = $dir/mon/\$cluster-\$id
osd data = $dir/osd/\$cluster-\$id
mgr data = $dir/mgr/\$cluster-\$id
mon cluster log file = $dir/log/cluster.log
[client.rgw.a]
rados osd op timeout = 10
# Deleted objects' space is freed within seconds (RGW's default waits two hours): the store
# is memory, and repeated benchmark runs would fill it.
rgw gc obj min wait = 2
rgw gc processor period = 5
rgw gc processor max time = 5
rgw frontends = beast endpoint=127.0.0.1:$port
rgw data = $dir/rgw
EOF
  # The daemons' own output (they keep the descriptors they were started with) goes to a
  # file, never to the caller's terminal or pipe.
  local out=$dir/log/daemons.out
  monmaptool --create --add a 127.0.0.1:6789 --fsid "$fsid" "$dir/monmap" >/dev/null
  ceph-mon -c "$conf" --mkfs -i a --monmap "$dir/monmap" >>"$out" 2>&1 || fail "ceph-mon --mkfs failed"
  ceph-mon -c "$conf" -i a >>"$out" 2>&1 || fail "ceph-mon did not start"
  ceph-mgr -c "$conf" -i a >>"$out" 2>&1 || fail "ceph-mgr did not start"
  # The OSD's uuid is given to both the monitor and the OSD (one identity from the start).
  local id osd_uuid
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  id=$(timeout 60 ceph -c "$conf" osd create "$osd_uuid") || fail "the monitor does not answer (ceph osd create)"
  mkdir -p "$dir/osd/ceph-$id"
  ceph-osd -c "$conf" -i "$id" --mkfs --osd-uuid "$osd_uuid" >>"$out" 2>&1 || fail "ceph-osd --mkfs failed"
  timeout 60 ceph -c "$conf" osd crush add "osd.$id" 1.0 root=default host=localhost >>"$out" 2>&1 ||
    fail "ceph osd crush add failed"
  ceph-osd -c "$conf" -i "$id" >>"$out" 2>&1 || fail "ceph-osd did not start"
  for _ in $(seq 120); do
    timeout 10 ceph -c "$conf" osd stat 2>/dev/null | grep -q "1 up" && break
    sleep 0.5
  done
  timeout 10 ceph -c "$conf" osd stat 2>/dev/null | grep -q "1 up" || fail "the OSD did not come up"
  radosgw -c "$conf" -n client.rgw.a >>"$out" 2>&1 || fail "radosgw did not start"
  timeout 120 radosgw-admin -c "$conf" user create --uid=distckpt --display-name=distckpt \
    --access-key="$access_key" --secret-key="$secret_key" >/dev/null || fail "radosgw-admin user create failed"
  for _ in $(seq 240); do
    curl -s -o /dev/null "http://127.0.0.1:$port/" && break
    sleep 0.5
  done
  curl -s -o /dev/null "http://127.0.0.1:$port/" || fail "radosgw does not answer on 127.0.0.1:$port"
  print_env
}

# A bring-up that fails (a daemon that does not come up in time on a loaded machine) is made
# again from nothing, up to three times; only the last attempt's logs are shown.
up() {
  local attempt env
  for attempt in 1 2 3; do
    [ "$attempt" = 3 ] && last_attempt=1 || last_attempt=0
    if env=$(up_once); then
      echo "$env"
      return 0
    fi
    [ "$attempt" = 3 ] || echo "s3.sh: bring-up attempt $attempt failed; again" >&2
  done
  down
  exit 1
}

case "$cmd" in
  up) up ;;
  down) down ;;
  env) print_env ;;
  *) echo "usage: scripts/s3.sh up|down|env [DIR]" >&2; exit 2 ;;
esac
