#!/usr/bin/env bash
# Regenerates tests/golden/fixtures: fixed checkpoints whose `distckpt ls/inspect/verify`
# output check.sh compares byte for byte. Run only when the on-disk format changes on
# purpose (the fixtures then also stand for "files written by an older build").
# Usage: make_fixtures.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
out=$here/fixtures
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rm -rf "$out"
mkdir -p "$out"
cd "$out"
mpirun --oversubscribe -np 4 "$build/train_mlp" --dp 2 --tp 2 --steps 12 --save-every 5 --hidden 16 --in 8 --out 4 \
  --dir root >/dev/null
"$build/distckpt" convert root/step-12 single/model --to ckpt >/dev/null
"$build/distckpt" convert root/step-12 single/model --to safetensors >/dev/null
"$build/distckpt" convert root/step-12 single/model --to hdf5 >/dev/null
printf '000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n' >key.hex
mpirun --oversubscribe -np 2 "$build/train_mlp" --dp 1 --tp 2 --steps 5 --save-every 5 --hidden 16 --in 8 --out 4 \
  --dir encrypted --enc-key-file key.hex >/dev/null
# Damage of the kinds `ls` reports: a broken index, an abandoned save.
cp -r root/step-5 root/broken
printf 'garbage' >root/broken/index.pb
mkdir root/step-13.tmp-0123456789abcdef
printf 'partial' >root/step-13.tmp-0123456789abcdef/data-00000.bin  # git keeps no empty directory
rm -f root/stats.jsonl encrypted/stats.jsonl
