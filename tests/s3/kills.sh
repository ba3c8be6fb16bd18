#!/usr/bin/env bash
# Saves into an object root killed (kill -9, every rank) at each step of the protocol: between
# parts of a multipart upload (the 1st and the 2nd), between the last part and its Complete,
# between the data and the index's PUT, between the index's PUT and `latest`; then gc killed
# while it removes. After each: no checkpoint is half visible (every one listed as committed
# verifies, and so does `latest`'s target), a save killed before its index is not a
# checkpoint, one killed after it is whole, and gc leaves neither objects nor incomplete
# multipart uploads of the killed saves behind. The store is the s3 fixture's Ceph RGW.
# Usage: kills.sh BUILD_DIR DIR (the fixture's)
set -uo pipefail
build=$1 dir=$2 label="s3 kills"
. "$(cd "$(dirname "$0")" && pwd)/lib.sh"
cleanup_extra() { pkill -9 -f -- "--dir s3://$bucket/" 2>/dev/null; }
export DISTCKPT_S3_PART_MIB=5  # 12 MiB per rank: three parts each
root=s3://$bucket/k
save() {  # save NAME [env...]: a 24 MiB save on 2 ranks, kept
  local name=$1
  shift
  env "$@" timeout 120 "${mpi[@]}" -np 2 "$build/ckpt_bench" --size 24M --mode save --keep --name "$name" \
    --dir "$root" >"$work/$name.out" 2>&1
}
# (the query sorted and encoded, as SigV4 signs it)
incomplete_uploads() { s3curl "$AWS_ENDPOINT_URL/$bucket/?prefix=k%2F&uploads=" | grep -o "<Upload>" | wc -l; }
committed() { awk -v n="$1" '$1 == n && ($NF == "committed" || /committed \(latest\)$/) {f = 1} END {exit !f}' "$work/ls.txt"; }
in_flight() { grep -qi "in.flight\|abandoned" "$work/ls.txt"; }
# Every checkpoint listed as committed verifies, and so does `latest`'s target.
consistent() {
  "$build/distckpt" ls "$root" >"$work/ls.txt" 2>&1 || fail "ls after $1"
  local n
  for n in $(awk '$NF == "committed" || /committed \(latest\)/ {print $1}' "$work/ls.txt"); do
    "$build/distckpt" verify "$root/$n" >/dev/null 2>&1 || fail "after $1: '$n' is listed as committed but does not verify"
  done
  latest=$(sed -n 's/^latest: //p' "$work/ls.txt")
  [ "$latest" = "(none)" ] || "$build/distckpt" verify "$root/$latest" >/dev/null 2>&1 ||
    fail "after $1: latest '$latest' does not verify"
}

save base || fail "the first save failed"
points=(object-part@1 object-part@2 object-complete create_index_pb object-latest)
i=0
for point in "${points[@]}"; do
  i=$((i + 1))
  name=kill-$i
  save "$name" DISTCKPT_PAUSE_AT="$point" &
  runner=$!
  for _ in $(seq 600); do grep -q "paused at kill point" "$work/$name.out" 2>/dev/null && break; sleep 0.1; done
  grep -q "paused at kill point" "$work/$name.out" || fail "the save never reached $point"
  pkill -9 -f -- "--name $name --dir $root"
  wait "$runner" 2>/dev/null
  consistent "a kill at $point"
  if [ "$point" = object-latest ]; then
    committed "$name" || fail "a save killed after its index is not committed"
  else
    ! committed "$name" || fail "a save killed at $point is listed as committed"
  fi
  case $point in  # killed inside a multipart upload: its parts are there, unseen
    object-part* | object-complete)
      [ "$(incomplete_uploads)" -ge 1 ] || fail "a kill at $point left no incomplete upload to collect" ;;
  esac
  "$build/distckpt" gc "$root" >"$work/gc-$i.out" 2>&1 || fail "gc after a kill at $point"
  consistent "gc after a kill at $point"
  in_flight && fail "gc after a kill at $point left a save in flight"
  [ "$(incomplete_uploads)" = 0 ] || fail "gc after a kill at $point left incomplete multipart uploads"
  echo "s3 kills: killed at $point: nothing half visible; gc left no objects or uploads of it"
done

# The connection cut by our proxy at each request of the protocol, before the request
# reaches the store (drop) and after it did, its answer lost (drop_after_forward): the
# client resends, and the save either commits whole or fails cleanly.
rules=$work/rules.json
echo '[]' >"$rules"
/usr/bin/python3 "$(cd "$(dirname "$0")" && pwd)/fault_proxy.py" --listen-port 0 --upstream "${store#http://}" \
  --rules "$rules" --port-file "$work/port" --stats "$work/stats.json" 2>"$work/proxy.log" &
proxy_pid=$!
cleanup_extra() { kill "$proxy_pid" 2>/dev/null; pkill -9 -f -- "--dir s3://$bucket/" 2>/dev/null; }
for _ in $(seq 50); do [ -s "$work/port" ] && break; sleep 0.1; done
[ -s "$work/port" ] || fail "the proxy did not start"
steps=('PUT partNumber=1&' 'PUT partNumber=2&' 'POST uploadId=' 'PUT index.pb' 'PUT /latest' 'PUT /.distckpt/seq')
cut_count() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["by_action"].get(sys.argv[2], 0))' "$work/stats.json" "$1" 2>/dev/null || echo 0; }
cuts=0
for action in drop drop_after_forward; do
  for step in "${steps[@]}"; do
    i=$((i + 1))
    name=cut-$i
    method=${step%% *} key=${step#* }
    case $key in
      /latest | /.distckpt/seq) pattern="k$key" ;;  # the root's own objects
      *) pattern="k/$name/.*$key" ;;
    esac
    printf '[{"method": "%s", "key": "%s", "action": "%s", "times": 2}]\n' "$method" "$pattern" "$action" >"$rules"
    before=$(cut_count "$action")
    AWS_ENDPOINT_URL=http://127.0.0.1:$(cat "$work/port") save "$name" || true
    [ "$(cut_count "$action")" -gt "$before" ] || fail "the proxy never cut '$step' ($action)"
    consistent "a cut at $action $step"
    cuts=$((cuts + 1))
  done
done
echo '[]' >"$rules"
grep -q '"drop": ' "$work/stats.json" && grep -q '"drop_after_forward": ' "$work/stats.json" ||
  fail "the proxy cut no connection"
"$build/distckpt" gc "$root" >/dev/null 2>&1
consistent "gc after the cuts"
check "$cuts requests cut by the proxy (before and after reaching the store): nothing half visible"

# gc killed while it removes an abandoned save's objects, then run again.
save abandoned DISTCKPT_PAUSE_AT=object-complete &
runner=$!
for _ in $(seq 600); do grep -q "paused at kill point" "$work/abandoned.out" 2>/dev/null && break; sleep 0.1; done
pkill -9 -f -- "--name abandoned --dir $root"
wait "$runner" 2>/dev/null
DISTCKPT_PAUSE_AT=gc-removing timeout 60 "$build/distckpt" gc "$root" >"$work/gc-killed.out" 2>&1 &
gc_pid=$!
for _ in $(seq 300); do grep -q "paused at kill point" "$work/gc-killed.out" 2>/dev/null && break; sleep 0.1; done
grep -q "paused at kill point" "$work/gc-killed.out" || fail "gc never reached its removal"
kill -9 "$gc_pid"
wait "$gc_pid" 2>/dev/null
consistent "gc killed mid-removal"
"$build/distckpt" gc "$root" >"$work/gc-again.out" 2>&1 || fail "the second gc"
consistent "the second gc"
in_flight && fail "the second gc left a save in flight"
[ "$(incomplete_uploads)" = 0 ] || fail "the second gc left incomplete multipart uploads"
echo "s3 kills: gc killed mid-removal: consistent; the next gc finished it"
timeout 120 "${mpi[@]}" -np 2 "$build/ckpt_bench" --size 24M --mode load --name kill-5 --dir "$root" \
  >"$work/load.out" 2>&1 || fail "loading the checkpoint committed before its kill"
grep -q "verified (0 mismatches)" "$work/load.out" || fail "the checkpoint committed before its kill loads wrong"
echo "s3 kills: ok"
