#!/usr/bin/env bash
# Checkpoints in an object root (s3://bucket/prefix) on the fixture's Ceph RGW, through the
# library's own S3 client: a training run saves on 2 ranks with retention, resumes on 4
# (resharded, bit-exact), and ls, verify, inspect, rm and gc read the root. Then through
# our fault-injecting proxy (fault_proxy.py): 503 SlowDown is retried; a rank whose
# uploads keep failing (503s, or a stall) past the deadline fails the save on every rank,
# naming the rank and the object, and the previous checkpoint stays latest and good; an
# index PUT whose answer is lost is recognised as our own on its retry; two jobs saving
# one name commit it once. No secret appears in any output.
# Usage: object_root.sh BUILD_DIR DIR (the fixture's)
set -uo pipefail
build=$1 dir=$2 label="s3 object root"
here=$(cd "$(dirname "$0")" && pwd)
proxy_pid=
. "$here/lib.sh"
cleanup_extra() { [ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null; }
root=s3://$bucket/jobs/mlp
train() { timeout 300 "${mpi[@]}" -np "$1" "$build/train_mlp" "${@:2}" --dir "$root"; }

# 1. Save, retain, resume resharded.
train 2 --dp 1 --tp 2 --steps 6 --save-every 2 --keep-max 2 >"$work/save.out" 2>&1 || fail "the first run failed"
saved=$(grep "saved step 6 fingerprint" "$work/save.out" | awk '{print $5}')
[ -n "$saved" ] || fail "no step 6 save"
train 4 --dp 2 --tp 2 --steps 8 --save-every 2 --keep-max 2 --resume >"$work/resume.out" 2>&1 ||
  fail "the resume on 4 ranks failed"
grep -q "restored step 6 fingerprint $saved" "$work/resume.out" || fail "the resume did not restore step 6 bit-exactly"
check "saved on 2 ranks, resumed on 4 from $root/step-6 (fingerprint $saved)"
"$build/distckpt" ls "$root" >"$work/ls.out" 2>&1 || fail "ls"
grep -q "^step-6 .*committed$" "$work/ls.out" && grep -q "^step-8 .*committed (latest)" "$work/ls.out" ||
  fail "ls does not list step-6 and step-8 (latest)"
! grep -q "^step-[24] " "$work/ls.out" || fail "retention (--keep-max 2) left older checkpoints"
"$build/distckpt" verify "$root/step-8" >"$work/verify.out" 2>&1 || fail "verify"
"$build/distckpt" inspect "$root/step-8" | grep -q "s-[0-9a-f]\{16\}/data-00003.bin" ||
  fail "inspect does not show the save's own data prefix"
"$build/distckpt" rm "$root" step-6 >/dev/null && ! "$build/distckpt" ls "$root" | grep -q "^step-6 " ||
  fail "rm did not remove step-6"
"$build/distckpt" convert --to safetensors "$root/step-8" "$work/step8" >/dev/null &&
  "$build/distckpt" convert --to native "$work/step8.safetensors" "$root/from-file" >/dev/null &&
  "$build/distckpt" verify "$root/from-file" >/dev/null || fail "convert out of and into the object root"
"$build/distckpt" rm "$root" from-file >/dev/null || fail "rm from-file"
timeout 60 "${mpi[@]}" -np 2 "$build/train_mlp" --dp 1 --tp 2 --steps 2 --save-every 2 --format hdf5 \
  --dir "$root/h5" >"$work/h5.out" 2>&1 && fail "an HDF5 save into an object root was not refused"
grep -q "object root, which holds sharded native checkpoints only" "$work/h5.out" || fail "the HDF5 refusal is unclear"
check "ls, verify, inspect and rm read the object root; retention kept 2; convert out and in; HDF5 refused"

# A save killed after its uploads, before its index: listed in flight, never loaded, and
# collected by gc once its owner is gone (this host's process: provably).
DISTCKPT_PAUSE_AT=create_index_pb timeout 120 "${mpi[@]}" -np 2 "$build/train_mlp" --dp 1 --tp 2 --steps 10 \
  --save-every 10 --resume --dir "$root" >"$work/killed.out" 2>&1 &
killed=$!
for _ in $(seq 600); do grep -q "paused at kill point create_index_pb" "$work/killed.out" && break; sleep 0.1; done
grep -q "paused at kill point create_index_pb" "$work/killed.out" || fail "the save never reached its commit"
pkill -9 -f "train_mlp --dp 1 --tp 2 --steps 10 --save-every 10" ; wait "$killed" 2>/dev/null
"$build/distckpt" ls "$root" | grep -q "^step-10 .*in flight\|^step-10 .*in-flight\|^step-10 .*flight" ||
  { "$build/distckpt" ls "$root"; fail "the killed save is not listed as in flight"; }
"$build/distckpt" ls "$root" | grep -q "^step-8 .*(latest)" || fail "the killed save moved latest"
"$build/distckpt" gc "$root" >"$work/gc.out" 2>&1 || fail "gc"
grep -q "1 removed" "$work/gc.out" || { cat "$work/gc.out"; fail "gc did not collect the killed save"; }
! "$build/distckpt" ls "$root" | grep -q "^step-10 " || fail "the killed save is still listed after gc"
check "a save killed before its commit is listed in flight, leaves latest alone, and gc collects it"

# 2. Faults, through the proxy.
rules=$work/rules.json
echo '[]' >"$rules"
/usr/bin/python3 "$here/fault_proxy.py" --listen-port 0 --upstream "${store#http://}" --rules "$rules" \
  --port-file "$work/port" --stats "$work/stats.json" 2>"$work/proxy.log" &
proxy_pid=$!
for _ in $(seq 50); do [ -s "$work/port" ] && break; sleep 0.1; done
[ -s "$work/port" ] || fail "the proxy did not start"
export AWS_ENDPOINT_URL=http://127.0.0.1:$(cat "$work/port")
rule() { echo "$1" >"$rules"; sleep 0.05; }

rule '[{"method": "PUT", "key": "data-0000[01]\\.bin", "action": "slowdown", "times": 3}]'
train 2 --dp 1 --tp 2 --steps 10 --save-every 2 --resume >"$work/slowdown.out" 2>&1 ||
  fail "a save with 3 SlowDown answers failed"
grep -q '"slowdown": 3' "$work/stats.json" || fail "the proxy did not answer SlowDown 3 times"
check "3 answers of 503 SlowDown were retried; the save committed"

rule '[{"method": "PUT", "key": "step-12/s-[0-9a-f]+/data-00001\\.bin", "action": "slowdown"}]'
DISTCKPT_S3_DEADLINE_S=4 train 2 --dp 1 --tp 2 --steps 12 --save-every 2 --resume >"$work/giveup.out" 2>&1 &&
  fail "a save whose rank 1 kept failing succeeded"
grep -q "rank 1.*data-00001.bin.*gave up after" "$work/giveup.out" || fail "the failure does not name rank 1 and its object"
grep -qi 'save failed' "$work/giveup.out" || fail "the job did not report the failed save"
rule '[]'
"$build/distckpt" ls "$root" | grep -q "^step-10 .*committed (latest)" || fail "the previous checkpoint is not latest"
"$build/distckpt" ls "$root" | grep -q "^step-12 " && fail "the failed save is listed as a checkpoint"
"$build/distckpt" verify "$root/step-10" >/dev/null || fail "the previous checkpoint does not verify"
check "rank 1 giving up failed the save on every rank, naming it and its object; step-10 stays latest"

rule '[{"method": "PUT", "key": "step-14/s-[0-9a-f]+/data-00000\\.bin", "action": "stall", "seconds": 30}]'
start=$SECONDS
DISTCKPT_S3_DEADLINE_S=4 train 2 --dp 1 --tp 2 --steps 14 --save-every 2 --resume >"$work/stall.out" 2>&1 &&
  fail "a save whose rank 0 stalled succeeded"
grep -q "rank 0.*data-00000.bin" "$work/stall.out" || fail "the stall's failure does not name rank 0 and its object"
rule '[]'
check "a stalled rank failed the save within $((SECONDS - start)) s (deadline 4 s per request), not a hang"

rule '[{"method": "PUT", "key": "step-14/index\\.pb", "action": "drop_after_forward", "times": 1}]'
train 2 --dp 1 --tp 2 --steps 14 --save-every 2 --resume >"$work/lost.out" 2>&1 ||
  fail "a commit whose answer was lost failed"
grep -q '"drop_after_forward": 1' "$work/stats.json" || fail "the proxy did not drop the index PUT's answer"
grep -q "PUT .*step-14/index.pb pass 412" "$work/proxy.log" || fail "the index PUT was not resent (no 412 seen)"
"$build/distckpt" ls "$root" | grep -q "^step-14 .*committed (latest)" || fail "step-14 is not committed"
check "an index PUT whose answer was lost was recognised as ours on its retry (412, our ETag)"
rule '[]'

rule '[{"method": "PUT", "key": "rated/bench/s-[0-9a-f]+/data-00000\\.bin", "action": "drop", "times": 4},
       {"method": "PUT", "key": "rated/bench/s-[0-9a-f]+/data-0000[01]\\.bin", "action": "rate", "bytes_per_s": 8000000}]'
timeout 120 "${mpi[@]}" -np 2 "$build/ckpt_bench" --size 16M --mode both --dir "$root/rated" >"$work/rated.out" 2>&1 ||
  fail "a save through dropped connections and a rate limit failed"
grep -q "verified (0 mismatches)" "$work/rated.out" || fail "the rate-limited checkpoint did not load back exactly"
grep -q '"drop": 4' "$work/stats.json" && grep -q '"rate": ' "$work/stats.json" ||
  fail "the proxy did not drop 4 connections and pace the rest"
rule '[]'
check "4 connections reset and uploads paced to 8 MB/s: the save committed and loaded back exactly"

# 3. Two jobs saving one name: one commits it.
racers=()
for j in 1 2; do
  timeout 120 "${mpi[@]}" -np 1 "$build/ckpt_bench" --size 8M --mode save --keep --name same --dir "$root/race" \
    >"$work/race$j.out" 2>&1 &
  racers+=($!)
done
wait "${racers[@]}"
won=$(grep -l "^save:" "$work"/race?.out | wc -l)
[ "$won" = 1 ] || fail "$won of 2 jobs saving one name committed it"
check "two jobs saving one name: one committed, the other was refused"

# An asynchronous save (AsyncCheckpointer: staged, then uploaded in the background) loads back.
timeout 120 "${mpi[@]}" -np 2 "$build/ckpt_bench" --size 16M --mode both --async --dir "$root/async" \
  >"$work/async.out" 2>&1 || fail "an asynchronous save into the object root failed"
grep -q "verified (0 mismatches)" "$work/async.out" && grep -q "^async: caller blocked" "$work/async.out" ||
  fail "the asynchronous save did not load back exactly"
check "an asynchronous save committed in the background and loaded back exactly"

# 4. HTTPS: the store's certificate is trusted through AWS_CA_BUNDLE, and refused without it.
openssl req -x509 -newkey rsa:2048 -nodes -keyout "$work/key.pem" -out "$work/cert.pem" -days 1 \
  -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 >/dev/null 2>&1 || fail "openssl could not make a certificate"
echo '[]' >"$rules"
/usr/bin/python3 "$here/fault_proxy.py" --listen-port 0 --upstream "${store#http://}" --rules "$rules" \
  --port-file "$work/tls_port" --tls-cert "$work/cert.pem" --tls-key "$work/key.pem" 2>"$work/tls_proxy.log" &
tls_pid=$!
for _ in $(seq 50); do [ -s "$work/tls_port" ] && break; sleep 0.1; done
https=https://127.0.0.1:$(cat "$work/tls_port")
AWS_ENDPOINT_URL=$https AWS_CA_BUNDLE=$work/cert.pem "$build/distckpt" ls "$root" >"$work/tls.out" 2>&1 ||
  fail "ls over HTTPS with AWS_CA_BUNDLE failed"
grep -q "^step-14 " "$work/tls.out" || fail "ls over HTTPS did not list the root"
AWS_ENDPOINT_URL=$https timeout 60 "$build/distckpt" ls "$root" >"$work/untrusted.out" 2>&1 &&
  fail "ls over HTTPS trusted a certificate no CA vouches for"
grep -qi "certificate" "$work/untrusted.out" || fail "the refusal does not say the certificate was not trusted"
kill "$tls_pid"
check "HTTPS: trusted through AWS_CA_BUNDLE, refused without it ($(head -c 120 "$work/untrusted.out"))"

# 5. The Python API takes the same roots.
export AWS_ENDPOINT_URL=$store
PYTHONPATH=$build/python timeout 120 "${mpi[@]}" -np 2 /usr/bin/python3 "$here/python_roundtrip.py" "s3://$bucket/py" \
  >"$work/python.out" 2>&1 || fail "the Python round trip failed"
grep -q "python s3 round trip: ok" "$work/python.out" || fail "the Python round trip did not finish"
check "distckpt.torch.save and load, and list_checkpoints, with an s3:// root"

# 6. No secret anywhere.
rm -f "$work/curl.cfg"  # (not an output)
if grep -rqF -f <(printf '%s\n' "$AWS_SECRET_ACCESS_KEY") "$work"; then fail "the secret key appears in an output"; fi
check "the secret key appears in no output or log"
echo "s3 object root: ok"
