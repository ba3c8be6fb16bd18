#!/usr/bin/env bash
# Shared replica reads across hosts: ckpt_bench saves and loads 64 MiB at DP2 x TP2 on
# h1 and h2 (replicas of every slice on both hosts). With the default (kAuto: shared
# on several nodes) each unique byte is read once from the shared directory and the
# replicas get theirs over the network; ckpt_bench's figures are checked against
# what the shared directory and the wire saw:
#   - bytes_read_shared = bytes_unique (each byte read once); with --replica-reads each,
#     every rank reads all it holds: bytes_read_shared = the sum of what the ranks hold;
#   - bytes_between_hosts = the bytes the switch ports received (ip -s link counters on
#     the bridge's veth ends), within the TCP/IP and MPI overhead (5% + 2 MiB); with
#     --replica-reads each nothing of the data crosses (under 2 MiB).
#   replica_reads.sh BUILD_DIR
source "$(dirname "$0")/lib.sh" "$1" replica_reads
skip_unless_possible
[ -x "$build/ckpt_bench" ] || { echo "replica_reads: SKIPPED: ckpt_bench not built (DISTCKPT_BUILD_BENCH=OFF)"; exit 77; }
fresh_hosts h1 h2
rm -rf "$shared/replica_reads"

# Bytes the switch received from every host: what crossed the network between hosts.
switch_rx() {
  local total=0 h n
  for h in h1 h2; do
    n=$(ip -n dck-switch -s -j link show "dck-$h" | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["bytes"])')
    total=$((total + n))
  done
  echo "$total"
}

bench() {  # MODE: runs ckpt_bench, prints "bytes_unique bytes_read_shared bytes_between_hosts wire nodes"
  local before after
  before=$(switch_rx)
  run_job "bench_$1" h1:2,h2:2 4 env DISTCKPT_PEER_TIMEOUT_S=60 "$build/ckpt_bench" --dp 2 --tp 2 --size 64M \
    --replica-reads "$1" --dir /dck/shared/replica_reads --name "$1" --json || { show_log "bench_$1"; fail "ckpt_bench $1"; }
  after=$(switch_rx)
  grep '^{' "$log_dir/bench_$1.log" | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
assert j["verified"], "the loaded data differs from the saved"
print(j["bytes_unique"], j["bytes_read_shared"], j["bytes_between_hosts"], '"$((after - before))"', j["nodes"],
      j["bytes_needed"])'
}

read -r unique shared_bytes between wire nodes _ < <(bench auto) || fail "no figures from ckpt_bench"
say "auto: nodes $nodes, bytes_unique $unique, bytes_read_shared $shared_bytes, bytes_between_hosts $between, switch received $wire"
[ "$nodes" = 2 ] || fail "ckpt_bench saw $nodes nodes"
[ "$shared_bytes" = "$unique" ] || fail "bytes_read_shared $shared_bytes != bytes_unique $unique (each byte read once)"
[ "$between" -ge "$unique" ] || fail "bytes_between_hosts $between: every replica pair spans the hosts, expected >= $unique"
[ "$wire" -ge "$between" ] || fail "the switch received $wire bytes, fewer than bytes_between_hosts $between"
[ "$wire" -le $((between + between / 20 + 2097152)) ] ||
  fail "the switch received $wire bytes, more than bytes_between_hosts $between allows (5% + 2 MiB)"

read -r unique2 shared2 between2 wire2 _ needed2 < <(bench each) || fail "no figures from ckpt_bench (each)"
say "each: bytes_read_shared $shared2, bytes_between_hosts $between2, switch received $wire2"
[ "$shared2" = "$needed2" ] && [ "$shared2" -gt "$unique2" ] ||
  fail "each: bytes_read_shared $shared2, expected what the ranks hold ($needed2, more than $unique2)"
[ "$between2" = 0 ] || fail "each: bytes_between_hosts $between2 != 0"
[ "$wire2" -le 2097152 ] || fail "each: $wire2 bytes crossed the network, expected under 2 MiB"
say "ok: shared reads read $(awk -v a="$shared2" -v b="$shared_bytes" 'BEGIN { printf "%.1f", a / b }')x less from the shared directory, for $between bytes on the network"
