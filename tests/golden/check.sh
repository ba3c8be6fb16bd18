#!/usr/bin/env bash
# Golden outputs: what users and scripts read from the tools, byte for byte.
#  - `distckpt ls/inspect/verify [--json]` on the fixed checkpoints in fixtures/;
#  - train_mlp's fingerprints at several layouts (saved, restored, final);
#  - `ckpt_bench --simulate-ranks 1024 --json`'s plan figures (timings masked).
# A refactoring must leave all of it unchanged; a change of behaviour changes
# expected.txt in the same commit, where the diff shows what users will see.
# Usage: check.sh BUILD_DIR WORK_DIR [--update]
set -euo pipefail
build=$(cd "$1" && pwd)
work=$2
here=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
rm -rf "$work"
mkdir -p "$work"
cp -r "$here/fixtures" "$work/fixtures"
chmod -R u+w "$work/fixtures"
actual=$work/actual.txt
cd "$work/fixtures"
run() {  # prints the command, its output and its exit status
  echo "\$ $*"
  set +e
  "$@" 2>&1
  echo "[exit $?]"
  set -e
}
dc=$build/distckpt
{
  run "$dc" ls root
  run "$dc" ls --json root
  run "$dc" ls single
  run "$dc" ls --json encrypted
  for c in root/step-12 root/broken single/model.ckpt single/model.safetensors single/model.h5 encrypted/step-5; do
    run "$dc" inspect "$c"
    run "$dc" inspect --json "$c"
    run "$dc" verify "$c"
    run "$dc" verify --json "$c"
  done
  run "$dc" inspect --key-file key.hex encrypted/step-5
  run "$dc" verify --json --key-file key.hex encrypted/step-5
  run "$dc" verify root
  # Misuse: a checkpoint given as a root, a path that is not there (JSON all the same),
  # a checkpoint directory without its index, a copy into a checkpoint's directory, an
  # encrypted source without its key.
  run "$dc" ls root/step-12
  run "$dc" verify --json missing
  mkdir -p noindex
  cp root/step-12/data-* noindex/
  run "$dc" inspect noindex
  run "$dc" convert root/step-12 root/step-12/inner --to safetensors
  run "$dc" convert encrypted/step-5 plain --to native
  # train_mlp: the same global state at every split.
  for shape in "2 2 4" "1 4 4" "4 1 4" "1 1 1"; do
    set -- $shape
    rm -rf "$work/train"
    echo "\$ train_mlp --dp $1 --tp $2 --steps 12 --save-every 6"
    mpirun -np "$3" "$build/train_mlp" --dp "$1" --tp "$2" --steps 12 --save-every 6 --dir "$work/train" 2>&1 |
      grep -E 'fingerprint'
    echo "\$ train_mlp --dp $2 --tp $1 --resume --steps 14"
    mpirun -np "$3" "$build/train_mlp" --dp "$2" --tp "$1" --steps 14 --save-every 6 --dir "$work/train" --resume 2>&1 |
      grep -E 'fingerprint'
  done
  echo "\$ ckpt_bench --simulate-ranks 1024 --json (timings masked)"
  "$build/ckpt_bench" --simulate-ranks 1024 --json | sed -E 's/("[a-z_]*_s"):[0-9.e+-]+/\1:T/g'
} | sed "s#$build/##g" >"$actual"

if [ "${3:-}" = "--update" ]; then
  cp "$actual" "$here/expected.txt"
  echo "golden: expected.txt updated"
  exit 0
fi
if diff -u "$here/expected.txt" "$actual"; then
  echo "golden: all outputs match"
else
  echo "golden: outputs differ from tests/golden/expected.txt (see the diff above)"
  exit 1
fi
