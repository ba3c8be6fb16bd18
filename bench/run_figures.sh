#!/usr/bin/env bash
# Runs every benchmark whose figure docs/benchmarks.md quotes, and keeps each run's JSON line.
#
#   bash bench/run_figures.sh BUILD OUT [NAME...]
#
# BUILD: a Release build tree (ckpt_bench); OUT: a directory for NAME.json, one per run (the
# docs' data lives in docs/benchmarks/data/). With NAMEs, only those runs. Each run measures its
# own reference in the same process and directory (fio for --compare-limit, a dd-like write and
# read for --compare-dd, a memcpy for --async): quote ratios, not times, and only from one run.
# Memory directories are under /dev/shm, disk ones under /var/tmp (ext4 on the machine's disk).
set -euo pipefail
build=$(cd "$1" && pwd)
out=$2
shift 2
mkdir -p "$out"
out=$(cd "$out" && pwd)
mpirun=(mpirun --allow-run-as-root --oversubscribe)
shm=/dev/shm/distckpt-figures
disk=/var/tmp/distckpt-figures

# run NAME NP ARGS...: one ckpt_bench run under mpirun -np NP, its JSON line into OUT/NAME.json.
run() {
  local name=$1 np=$2
  shift 2
  if [ "${#selected[@]}" -gt 0 ] && [[ " ${selected[*]} " != *" $name "* ]]; then return 0; fi
  rm -rf "$shm" "$disk"
  echo "== $name: ckpt_bench $*" >&2
  # Into a temporary file first: a failed run leaves the previous figure, not an empty one.
  "${mpirun[@]}" -np "$np" "$build/ckpt_bench" "$@" --json | grep "^{" | tail -n 1 >"$out/$name.json.tmp"
  mv "$out/$name.json.tmp" "$out/$name.json"
  rm -rf "$shm" "$disk"
}
selected=("$@")

# pyrun NAME ARGS...: one bench/py_bench.py run (the Python layer against ckpt_bench, alternating),
# its JSON line into OUT/NAME.json.
pyrun() {
  local name=$1
  shift
  if [ "${#selected[@]}" -gt 0 ] && [[ " ${selected[*]} " != *" $name "* ]]; then return 0; fi
  rm -rf "$shm"
  echo "== $name: py_bench.py $*" >&2
  /usr/bin/python3 "$(dirname "$0")/py_bench.py" --build "$build" --dir "$shm" --json "$@" | grep "^{" | tail -n 1 \
    >"$out/$name.json.tmp"
  mv "$out/$name.json.tmp" "$out/$name.json"
  rm -rf "$shm"
}

# The storage's limit (fio in the same run, the other ranks asleep).
run limit-shm-dp2tp2 4 --size 1G --dp 2 --tp 2 --dir "$shm" --compare-limit --repeat 5
run limit-shm-dp2tp1 2 --size 1G --dp 2 --tp 1 --dir "$shm" --compare-limit --repeat 5
run limit-shm-1rank 1 --size 1G --dp 1 --tp 1 --dir "$shm" --compare-limit --repeat 5
run limit-shm-dp2tp2-4g 4 --size 4G --dp 2 --tp 2 --dir "$shm" --compare-limit --repeat 3
run limit-disk-dp2tp2 4 --size 1G --dp 2 --tp 2 --dir "$disk" --compare-limit --drop-cache --repeat 5
run limit-disk-dp2tp2-buffered 4 --size 1G --dp 2 --tp 2 --dir "$disk" --compare-limit --drop-cache --repeat 5 \
  --buffered-reads
run limit-disk-dp2tp2-async 4 --size 1G --dp 2 --tp 2 --dir "$disk" --compare-limit --drop-cache --repeat 5 --async
run limit-shm-dp2tp2-async 4 --size 1G --dp 2 --tp 2 --dir "$shm" --compare-limit --repeat 5 --async
run limit-disk-dp2tp2-4g 4 --size 4G --dp 2 --tp 2 --dir "$disk" --compare-limit --drop-cache --repeat 3

# Replica reads and formats beside a dd-like write and read of the same bytes.
for reads in each shared; do
  run dd-disk-$reads 4 --size 1G --dp 2 --tp 2 --dir "$disk" --compare-dd --repeat 3 --replica-reads $reads
  run dd-shm-$reads 4 --size 1G --dp 2 --tp 2 --dir "$shm" --compare-dd --repeat 3 --replica-reads $reads
done
for format in ckpt safetensors hdf5; do
  run dd-disk-$format 4 --size 1G --dp 2 --tp 2 --dir "$disk" --compare-dd --repeat 3 --format $format
done
run dd-disk-integrated 4 --size 1G --dp 2 --tp 2 --dir "$disk" --compare-dd --repeat 3 --integrated

# The node-local tier: a local save to memory, a drain to the disk, restores from both, beside
# the read limits of both directories (dd).
run tier-dp1tp2 2 --size 256M --dp 1 --tp 2 --dir "$disk" --local-dir "$shm/local" --drain --compare-dd --repeat 5
run tier-dp2tp2-async 4 --size 256M --dp 2 --tp 2 --dir "$disk" --local-dir "$shm/local" --drain --compare-dd \
  --repeat 5 --async

# The Python layers against C++ on the same bytes (DP2 x TP2, /dev/shm, 5 alternating runs).
pyrun py-torch-1g --torch --size 1G --runs 5
pyrun py-numpy-1g --size 1G --runs 5
# The same worker launched by torch.multiprocessing (Comm.from_torch, gloo) against mpirun.
pyrun py-launchers-numpy-1g --launchers --size 1G --runs 5
pyrun py-launchers-torch-1g --launchers --torch --size 1G --runs 5

# stridedrun NAME NP DIR: bench/strided_bench.cc (haloed blocks against packed ones, alternating).
stridedrun() {
  local name=$1 np=$2 dir=$3
  if [ "${#selected[@]}" -gt 0 ] && [[ " ${selected[*]} " != *" $name "* ]]; then return 0; fi
  rm -rf "$dir"
  echo "== $name: strided_bench -np $np --dir $dir" >&2
  "${mpirun[@]}" -np "$np" "$build/strided_bench" --dir "$dir" --runs 5 --json | grep "^{" | tail -n 1 \
    >"$out/$name.json.tmp"
  mv "$out/$name.json.tmp" "$out/$name.json"
  rm -rf "$dir"
}
# 64 blocks of 1024^2 float32 per rank, each with a halo of 2 cells (256 MiB per rank).
stridedrun strided-shm-2 2 "$shm"
stridedrun strided-shm-4 4 "$shm"
stridedrun strided-disk-2 2 "$disk"
