#!/usr/bin/env bash
# Encrypted checkpoints end to end, as users drive them: train_mlp saves encrypted
# .ckpt and native checkpoints and resumes from them at another layout; `distckpt`
# inspects, verifies and converts them with --key-file / --key-env and refuses without
# the key or with a wrong one; ckpt_bench saves and loads with --enc-key-file; no
# command prints the key.
# Usage: encryption_cli.sh BUILD_DIR WORK_DIR
set -euo pipefail
build=$1
work=$2
cli=$build/distckpt
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
rm -rf "$work"
mkdir -p "$work"
key=$work/key
openssl rand 32 > "$key"
openssl rand -hex 32 > "$work/wrong"
openssl rand -hex 16 > "$work/sm4"
chmod 600 "$key" "$work/wrong" "$work/sm4"
export DISTCKPT_KEY_HEX=$(od -An -tx1 "$key" | tr -d ' \n')
log=$work/all.log
: > "$log"
fail() { echo "FAIL: $*"; exit 1; }
# Runs a command, keeping its output in the log; prints it.
run() { "$@" 2>&1 | tee -a "$log"; return "${PIPESTATUS[0]}"; }
# `cmd | contains PATTERN`: grep -q that reads all its input first. Under pipefail a plain
# `| grep -q` fails when it matches early and the writer then dies of SIGPIPE.
contains() { local all; all=$(cat); grep -q "$@" <<<"$all"; }
expect_fail() {  # expect_fail PATTERN CMD...: the command fails and says PATTERN
  local pattern=$1
  shift
  local out
  if out=$("$@" 2>&1); then fail "succeeded: $*"; fi
  echo "$out" >> "$log"
  grep -q -- "$pattern" <<< "$out" || fail "'$*' did not say '$pattern': $out"
  echo "refused as expected: $pattern"
}

for format in native ckpt; do
  dir=$work/$format
  saved=$(run "${mpirun[@]}" -np 4 "$build/train_mlp" --dp 2 --tp 2 --steps 6 --save-every 3 --dir "$dir" \
            --format "$format" --enc-key-file "$key" --enc-mode AES-GCM | awk '/^saved step 6 fingerprint/ {print $5}')
  [ -n "$saved" ] || fail "$format: no saved fingerprint"
  # Resume at DP1 x TP2 with the key from the environment.
  restored=$(run "${mpirun[@]}" -np 2 "$build/train_mlp" --dp 1 --tp 2 --steps 6 --save-every 0 --dir "$dir" \
               --format "$format" --enc-key-env DISTCKPT_KEY_HEX --resume | awk '/^restored step 6 fingerprint/ {print $5}')
  [ "$restored" = "$saved" ] || fail "$format: restored ${restored:-none} != saved $saved"
  echo "$format: resumed at another layout with the same state ($saved)"
  expect_fail "its key is needed" "${mpirun[@]}" -np 2 "$build/train_mlp" --dp 1 --tp 2 --steps 6 --save-every 0 \
    --dir "$dir" --format "$format" --resume
  expect_fail "authentication failed" "${mpirun[@]}" -np 2 "$build/train_mlp" --dp 1 --tp 2 --steps 6 \
    --save-every 0 --dir "$dir" --format "$format" --enc-key-file "$work/wrong" --resume

  # native: every chunk under its own nonce; ckpt: whole, in MindSpore's framing (GCM blocks).
  authenticated=$([ "$format" = native ] && echo "every chunk authenticated" || echo "every block authenticated")
  run "$cli" verify "$dir" --key-file "$key" | contains "$authenticated" || fail "$format: verify with the key"
  expect_fail "its key is needed" "$cli" verify "$dir"
  expect_fail "authentication failed" "$cli" verify "$dir" --key-file "$work/wrong"
  run "$cli" inspect "$dir" --key-env DISTCKPT_KEY_HEX | contains "encryption AES-256-GCM" || fail "$format: inspect"
done
"$cli" inspect "$work/native" | tee -a "$log" | contains "tensors: sealed" || fail "inspect without the key lists tensors"
"$cli" ls "$work/native" | tee -a "$log" | contains "committed" || fail "ls without the key"
# A .ckpt encrypted whole hides its names and step too: ls and inspect show only the file.
"$cli" ls "$work/ckpt" | tee -a "$log" | contains "encrypted whole (AES-GCM)" || fail "ls of encrypted .ckpt files"
"$cli" inspect "$work/ckpt" | tee -a "$log" | contains "encrypted with the rest" || fail "inspect of an encrypted .ckpt without the key"

# Conversions: decrypt to safetensors; re-encrypt to native with another mode.
newest=$(ls -d "$work"/native/step-* | sort -V | tail -1)
expect_fail "pass --decrypt" "$cli" convert "$newest" "$work/p.safetensors" --to safetensors --key-file "$key"
run "$cli" convert "$newest" "$work/plain.safetensors" --to safetensors --key-file "$key" --decrypt > /dev/null
run "$cli" verify "$work/plain.safetensors" | contains "^OK" || fail "decrypted copy"
# A key given for a plain checkpoint: refused (a plain one in an encrypted one's place).
expect_fail "not encrypted, but a key was given" "$cli" verify "$work/plain.safetensors" --key-file "$key"
# A plain source: --key-file with --enc-mode encrypts the copy; --key-file alone is refused.
run "$cli" convert "$work/plain.safetensors" "$work/enc-from-plain" --to native --key-file "$key" \
  --enc-mode AES-CBC > /dev/null
run "$cli" inspect "$work/enc-from-plain" | contains "AES-256-CBC" || fail "encrypting a plain source"
expect_fail "the source is not encrypted" "$cli" convert "$work/plain.safetensors" "$work/x" --to native \
  --key-file "$key"
# Converting an encrypted source keeps it encrypted by default (its mode and key).
run "$cli" convert "$newest" "$work/copy" --to ckpt --key-file "$key" > /dev/null
expect_fail "its key is needed" "$cli" verify "$work/copy.ckpt"
run "$cli" verify "$work/copy.ckpt" --key-file "$key" | contains "every block authenticated" || fail "re-encrypted .ckpt"
# An existing destination: refused, or with --force replaced (a committed checkpoint only).
expect_fail "(--force replaces it)" "$cli" convert "$newest" "$work/copy" --to ckpt --key-file "$key"
run "$cli" convert "$newest" "$work/copy" --to ckpt --key-file "$key" --force | contains converted || fail "--force"
echo "not a checkpoint" > "$work/stray.ckpt"
expect_fail "not a committed checkpoint" "$cli" convert "$newest" "$work/stray" --to ckpt --key-file "$key" --force
run "$cli" convert "$newest" "$work/cbc" --to native --key-file "$key" --enc-mode SM4-CBC \
  --enc-key-file "$work/sm4" 2>&1 | contains converted || fail "re-encrypting convert"
expect_fail "16-byte key" "$cli" convert "$newest" "$work/sm4ck" --to native --key-file "$key" --enc-mode SM4-CBC
run "$cli" verify "$work/cbc" --key-file "$work/sm4" | contains "every chunk authenticated" || fail "re-encrypted copy"
expect_fail "authentication failed" "$cli" verify "$work/cbc" --key-file "$key"
expect_fail "cannot carry encryption" "$cli" convert "$newest" "$work/x.h5" --to hdf5 --key-file "$key" --enc-mode AES-GCM

# ckpt_bench with a key: save and load, every element checked.
run "${mpirun[@]}" -np 2 "$build/ckpt_bench" --size 8M --tp 2 --dir "$work/bench" --enc-key-file "$key" \
  --enc-mode AES-CBC | contains "AES-CBC" || fail "ckpt_bench with a key"

# The key never appears in what the tools printed.
if grep -q -i -- "$DISTCKPT_KEY_HEX" "$log"; then fail "the key was printed"; fi
echo "encryption cli: all checks passed"
