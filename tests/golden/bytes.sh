#!/usr/bin/env bash
# Golden bytes: one checkpoint per format, written with a fixed clock and a seeded random
# source (base/test_seams.h), compared byte for byte with the files in bytes/:
#   sharded native, MindSpore .ckpt, safetensors, HDF5, and encrypted native and .ckpt
#   (AES-GCM and SM4-CBC: with the seeded source their salts and IVs repeat, so the
#   ciphertext, the framing and the tags are compared whole; each is also decrypted to
#   the plain copy's bytes).
# A refactoring must leave every byte as it is; a change of format updates bytes/ in a
# commit of its own (--update), where the diff says which files changed.
# Usage: bytes.sh BUILD_DIR WORK_DIR [--update]
set -euo pipefail
build=$(cd "$1" && pwd)
work=$2
here=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export DISTCKPT_TEST_CLOCK_MS=1767225600000 DISTCKPT_TEST_RANDOM_SEED=20260101
rm -rf "$work"
mkdir -p "$work/out"
cd "$work/out"
dc=$build/distckpt
printf '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n' >"$work/key.hex"
printf '00112233445566778899aabbccddeeff\n' >"$work/sm4.hex"
quiet() { "$@" >/dev/null 2>"$work/stderr" || { cat "$work/stderr"; exit 1; }; }
quiet mpirun -np 4 "$build/train_mlp" --dp 2 --tp 2 --steps 5 --save-every 5 --hidden 16 --in 8 --out 4 --dir plain
for f in ckpt safetensors hdf5; do quiet "$dc" convert plain/step-5 single/model --to "$f"; done
quiet mpirun -np 2 "$build/train_mlp" --dp 1 --tp 2 --steps 5 --save-every 5 --hidden 16 --in 8 --out 4 \
  --dir encrypted --enc-key-file "$work/key.hex"
quiet "$dc" convert plain/step-5 single/gcm --to ckpt --enc-key-file "$work/key.hex"
quiet "$dc" convert plain/step-5 single/sm4 --to ckpt --enc-mode SM4-CBC --enc-key-file "$work/sm4.hex"
# Round trips: each encrypted copy, decrypted, is the plain .ckpt's bytes.
# (The copy is named model: a .ckpt's metadata records its file's name.)
for c in gcm:key sm4:sm4; do
  quiet "$dc" convert "single/${c%:*}.ckpt" "$work/decrypted-${c%:*}/model" --to ckpt --key-file "$work/${c#*:}.hex" --decrypt
  cmp "$work/decrypted-${c%:*}/model.ckpt" single/model.ckpt ||
    { echo "golden bytes: ${c%:*}.ckpt does not decrypt to model.ckpt"; exit 1; }
done
# What is compared: every file of a checkpoint, not the roots' bookkeeping (stats.jsonl,
# owner records, series state: their contents are times and process ids).
find . -type f ! -name stats.jsonl ! -path '*/.distckpt/*' | sort >"$work/files.txt"

if [ "${3:-}" = "--update" ]; then
  rm -rf "$here/bytes"
  while read -r f; do mkdir -p "$here/bytes/$(dirname "$f")"; cp "$f" "$here/bytes/$f"; done <"$work/files.txt"
  echo "golden bytes: bytes/ updated ($(wc -l <"$work/files.txt") files)"
  exit 0
fi
(cd "$here/bytes" && find . -type f | sort) >"$work/expected_files.txt"
status=0
diff -u "$work/expected_files.txt" "$work/files.txt" || { echo "golden bytes: the set of files differs"; status=1; }
while read -r f; do
  [ -f "$here/bytes/$f" ] || continue
  cmp "$here/bytes/$f" "$f" || status=1
done <"$work/files.txt"
if [ $status -eq 0 ]; then
  echo "golden bytes: $(wc -l <"$work/files.txt") files match"
else
  echo "golden bytes: files differ from tests/golden/bytes/ (cmp names the first byte of each)"
fi
exit $status
