#!/usr/bin/env bash
# Saves train_mlp's state at DP2 x TP2, then resumes it at other shapes (DP1 x TP4,
# DP4 x TP1, one rank) and requires the restored fingerprint to equal the saved one.
# Usage: reshard_resume.sh BUILD_DIR WORK_DIR [FORMAT]   (native, ckpt, safetensors, hdf5)
set -euo pipefail
build=$1
work=$2
format=${3:-native}
mpirun=(mpirun --allow-run-as-root --oversubscribe --bind-to none)
rm -rf "$work"
saved=$("${mpirun[@]}" -np 4 "$build/train_mlp" --dp 2 --tp 2 --steps 20 --save-every 20 --dir "$work" --format "$format" |
        awk '/^saved step 20 fingerprint/ {print $5}')
[ -n "$saved" ] || { echo "no saved fingerprint"; exit 1; }
echo "saved at DP2 x TP2 ($format): $saved"
for shape in "4 1 4" "4 4 1" "1 1 1"; do
  set -- $shape
  restored=$("${mpirun[@]}" -np "$1" "$build/train_mlp" --dp "$2" --tp "$3" --steps 20 --save-every 0 \
             --dir "$work" --resume | awk '/^restored step 20 fingerprint/ {print $5}')
  echo "restored at DP$2 x TP$3: ${restored:-none}"
  [ "$restored" = "$saved" ] || { echo "MISMATCH"; exit 1; }
done
echo "reshard resume: fingerprints match"
