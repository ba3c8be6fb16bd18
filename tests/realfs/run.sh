#!/usr/bin/env bash
# Real file-system failures, not injected ones (root: mounts, users, quotas).
#
#   run.sh BUILD_DIR WORK_DIR enospc|erofs|eacces|edquot
#
# enospc: a small tmpfs holds a previous checkpoint and is filled up to a few MiB; then
#   each save path (sharded, integrated and async native; .ckpt, safetensors, HDF5), the
#   manager's save, convert and publish run out of space, on 1, 2 and 4 ranks. Each
#   must end within 60 s (under `timeout 120`), with the same clear error on every rank
#   naming the rank, the path and ENOSPC, leave nothing behind, and leave the previous
#   checkpoint verifying and loading. The disk also fills for real during the move of
#   `latest` and during retention: the checkpoint is then reported committed with a
#   warning and never removed. Local-tier saves (sync and async) into spares on a tmpfs
#   full but for 1 MiB work and restore their own bytes; a bigger one fails cleanly.
# erofs: the same saves on a file system remounted read-only.
# eacces: the same as an unprivileged user (nobody) in a directory it cannot write.
# edquot: the same as nobody on ext4 (a loop device) with a block quota.
#
# Prints PASS/FAIL/SKIP per case; exits 1 on any failure, 77 (skipped) when the case
# cannot be set up on this machine (not root, no tmpfs, no loop device...).
set -uo pipefail
build=$(cd "$1" && pwd)
work=$2
kind=$3
ops=$build/tests/realfs_ops
dc=$build/distckpt
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpirun=(mpirun --oversubscribe --bind-to none)
failures=0
passes=0
mnt=$work/mnt
log=$work/log
np_mode=mpi

skip() { echo "SKIP realfs.$kind: $*"; exit 77; }
fail() { echo "FAIL $case: $*"; sed 's/^/    | /' "$log" | head -20; failures=$((failures + 1)); }
pass() { echo "PASS $case"; passes=$((passes + 1)); }

[ "$(id -u)" -eq 0 ] || skip "needs root (mounts, other users)"
mkdir -p "$work"
rm -rf "$work"/prev-np*  # saved by this build, not an older one
cleanup_mount() { mountpoint -q "$mnt" && umount -l "$mnt"; [ -n "${loopdev:-}" ] && losetup -d "$loopdev" 2>/dev/null; loopdev=; }
trap cleanup_mount EXIT

# A fresh tmpfs of SIZE MiB at $mnt with a root directory, the previous checkpoint "prev"
# saved on NP ranks, and a filler leaving about FREE MiB.
fresh_tmpfs() {  # SIZE NP FREE
  cleanup_mount
  mkdir -p "$mnt"
  mount -t tmpfs -o "size=${1}m" tmpfs "$mnt" || skip "cannot mount a tmpfs"
  # prev is saved once per rank count and copied in: a checkpoint is relocatable, and a
  # save per case started mpirun 51 more times.
  local template=$work/prev-np$2
  if [ ! -d "$template" ]; then
    rm -rf "$template.tmp" && mkdir -p "$template.tmp"
    "${mpirun[@]}" -np "$2" "$ops" save native sharded "$template.tmp" prev 8 >"$log" 2>&1 || { fail "setup: prev"; return 1; }
    mv "$template.tmp" "$template"
  fi
  cp -a "$template" "$mnt/root" || { fail "setup: copy prev"; return 1; }
  fill_to "$3"
}
fill_to() {  # leave about FREE MiB
  local avail
  avail=$(df -m --output=avail "$mnt" | tail -1)
  [ "$avail" -gt "$1" ] && dd if=/dev/zero of="$mnt/filler" bs=1M count=$((avail - $1)) status=none 2>/dev/null
  return 0
}

# Checks an operation's output in $log: exit code, time, one identical error line per rank
# naming the rank, the root's path and the errno text. Lines are matched with here-strings,
# never `echo | grep -q`: under pipefail, grep -q leaving early kills echo with SIGPIPE and
# the pipeline fails although it matched (CI saw "no line from rank 0" beside rank 0's line).
check_failed() {  # RC SECONDS NP ERRNO_TEXT
  local rc=$1 secs=$2 np=$3 text=$4
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && { fail "killed by timeout 120"; return 1; }
  [ "$rc" -ne 0 ] || { fail "exit 0: the operation did not fail"; return 1; }
  [ "$secs" -le 60 ] || { fail "took ${secs} s (> 60 s)"; return 1; }
  local lines
  lines=$(grep -E '^rank [0-9]+: ' "$log" | sort)
  [ "$(grep -c . <<<"$lines")" -eq "$np" ] || { fail "expected $np rank lines"; return 1; }
  for r in $(seq 0 $((np - 1))); do grep -q "^rank $r: " <<<"$lines" || { fail "no line from rank $r"; return 1; }; done
  [ "$(sed -E 's/^rank [0-9]+: //' <<<"$lines" | sort -u | wc -l)" -eq 1 ] || { fail "ranks report different errors"; return 1; }
  local msg
  msg=$(head -1 <<<"$lines")
  grep -q "$text" <<<"$msg" || { fail "the error does not say '$text'"; return 1; }
  # A collective operation names the failing rank; a local tool (np 0) has none.
  [ "$np_mode" = local ] || grep -Eq "rank [0-9]+" <<<"${msg#rank * }" ||
    { fail "the error names no rank"; return 1; }
  grep -q "$mnt" <<<"$msg" || { fail "the error names no path"; return 1; }
  return 0
}
# Nothing left behind under the root, and the previous checkpoint verifies and loads.
check_intact() {  # NP [ROOT]
  local root=${2:-$mnt/root}
  local left
  left=$(find "$root" -name '*.tmp-*' 2>/dev/null)
  [ -z "$left" ] || { fail "left behind: $left"; return 1; }
  "$dc" verify "$root/prev" >>"$log" 2>&1 || { fail "prev does not verify"; return 1; }
  "${mpirun[@]}" -np "$1" "$ops" load "$root" prev 8 >>"$log" 2>&1 || { fail "prev does not load"; return 1; }
  return 0
}
# Runs an operation under timeout 120 into $log; sets rc and secs.
run_op() {  # NP OP... (NP 0: a local tool, one process without mpirun)
  local np=$1
  shift
  np_mode=$([ "$np" -eq 0 ] && echo local || echo mpi)
  local start=$SECONDS
  if [ "$np" -eq 0 ]; then
    timeout 120 "$ops" "$@" >"$log" 2>&1
  else
    timeout 120 "${mpirun[@]}" -np "$np" "$ops" "$@" >"$log" 2>&1
  fi
  rc=$?
  secs=$((SECONDS - start))
}

save_cases=("native sharded" "native integrated" "native async" "ckpt sharded" "safetensors sharded" "hdf5 sharded")

case $kind in
enospc)
  for np in 1 2 4; do
    for spec in "${save_cases[@]}"; do
      set -- $spec
      case="enospc np$np save $1 $2"
      fresh_tmpfs 40 "$np" 3 || continue
      run_op "$np" save "$1" "$2" "$mnt/root" new 24
      check_failed "$rc" "$secs" "$np" "No space left on device" && check_intact "$np" && pass
    done
    case="enospc np$np manager save"
    fresh_tmpfs 40 "$np" 3 || continue
    run_op "$np" manager "$mnt/root" 1 24
    check_failed "$rc" "$secs" "$np" "No space left on device" && check_intact "$np" && pass

    # The local tier on a full tmpfs: saves into spares (written through mappings) work
    # with 1 MiB free, restore their own bytes; a bigger save fails cleanly on every rank.
    for mode in sync async; do
      case="enospc np$np local tier $mode"
      fresh_tmpfs 40 "$np" 30 || continue
      run_op "$np" local-full "$mnt/filler" "$mnt/root" "$mnt/local" 8 "$mode"
      if check_failed "$rc" "$secs" "$np" "save big: .*No space left on device" && check_intact "$np"; then
        left=$(find "$mnt/local" -name '*.tmp-*' 2>/dev/null)
        [ -z "$left" ] && pass || fail "left behind: $left"
      fi
    done

    # The disk fills for real just before `latest` moves: committed, with a warning.
    case="enospc np$np latest"
    fresh_tmpfs 40 "$np" 20 || continue
    run_op "$np" fill-at create:latest.tmp- "$mnt/filler2" "$mnt/root" new 8
    if [ "$rc" -ne 0 ]; then fail "exit $rc"
    elif [ "$(grep -c 'ok (warning: .*latest pointer was not moved.*No space left on device' "$log")" -ne "$np" ]; then
      fail "not reported committed with a warning on every rank"
    elif [ "$(cat "$mnt/root/latest")" != "prev" ]; then fail "latest moved"
    else
      rm -f "$mnt/filler" "$mnt/filler2"
      "$dc" verify "$mnt/root/new" >>"$log" 2>&1 && check_intact "$np" && pass || fail "new or prev damaged"
    fi

    # The disk fills for real just before retention renames m-1 away: it still goes.
    case="enospc np$np retention"
    fresh_tmpfs 60 "$np" 30 || continue
    run_op "$np" retain "$mnt/filler2" "$mnt/root" 8
    if [ "$rc" -ne 0 ]; then fail "exit $rc"
    elif [ "$(grep -c 'ok (warning: committed .*m-2; retention removed m-1)' "$log")" -ne "$np" ]; then
      fail "m-2 not committed or m-1 not removed on every rank"
    elif [ -e "$mnt/root/m-1" ] || ! "$dc" verify "$mnt/root/m-2" >>"$log" 2>&1; then fail "retention result"
    else check_intact "$np" && pass
    fi
  done
  # The local tools, one process.
  for to in native ckpt safetensors hdf5; do
    case="enospc convert to $to"
    fresh_tmpfs 40 1 3 || continue
    run_op 0 convert "$mnt/root/prev" "$mnt/root/conv" "$to"
    # Convert makes a large enough copy? prev is 8 MiB, 3 MiB are free.
    check_failed "$rc" "$secs" 1 "No space left on device" && check_intact 1 && pass
  done
  # Full but for 16 KiB: libhdf5's own metadata flush is where the space ends. A failed
  # flush left libhdf5 1.10 a file it could never close, and the process crashed at exit
  # or in MPI_Finalize (SIGSEGV) after reporting the error: now the error, and no crash.
  for np in 0 2; do
    case="enospc hdf5 metadata, np$np"
    ranks=$np
    [ "$np" -eq 0 ] && ranks=1  # np0: the CLI's convert, one process
    fresh_tmpfs 40 "$ranks" 1 || continue
    avail_kib=$(df -k --output=avail "$mnt" | tail -1)
    dd if=/dev/zero of="$mnt/filler2" bs=4k count=$((avail_kib / 4 - 4)) status=none 2>/dev/null
    if [ "$np" -eq 0 ]; then run_op 0 convert "$mnt/root/prev" "$mnt/root/conv" hdf5
    else run_op "$np" save hdf5 sharded "$mnt/root" m 1
    fi
    if [ "$rc" -ge 128 ] || grep -Eq "exited on signal|Segmentation fault" "$log"; then
      fail "a process ended by a signal (exit $rc)"; continue
    fi
    check_failed "$rc" "$secs" "$ranks" "No space left on device" && check_intact "$ranks" && pass
  done
  case="enospc publish"
  fresh_tmpfs 40 1 3 || true
  run_op 0 publish "$mnt/root/prev"
  check_failed "$rc" "$secs" 1 "No space left on device" && check_intact 1 && pass
  ;;

erofs)
  for np in 1 2 4; do
    for spec in "${save_cases[@]}" "manager"; do
      set -- $spec
      case="erofs np$np ${spec}"
      fresh_tmpfs 40 "$np" 30 || continue
      mount -o remount,ro "$mnt" || skip "cannot remount read-only"
      if [ "$1" = manager ]; then run_op "$np" manager "$mnt/root" 1 8
      else run_op "$np" save "$1" "$2" "$mnt/root" new 8; fi
      check_failed "$rc" "$secs" "$np" "Read-only file system" && check_intact "$np" && pass
    done
  done
  ;;

eacces | edquot)
  command -v setpriv >/dev/null || skip "setpriv (util-linux) is missing"
  user=nobody
  as_user=(setpriv --reuid="$user" --regid="$(id -g "$user")" --clear-groups --inh-caps=-all)
  # The build must be reachable by that user (CI builds as root under /root or /work).
  "${as_user[@]}" test -x "$ops" || skip "$user cannot run $ops (the build is not readable by others)"
  if [ "$kind" = edquot ]; then
    for tool in losetup mkfs.ext4 setquota quotaon; do command -v "$tool" >/dev/null || skip "$tool is missing (Debian: quota, e2fsprogs)"; done
  fi
  for np in 1 2 4; do
    for spec in "${save_cases[@]}" "manager"; do
      set -- $spec
      case="$kind np$np ${spec}"
      cleanup_mount
      mkdir -p "$mnt"
      if [ "$kind" = eacces ]; then
        mount -t tmpfs -o size=40m tmpfs "$mnt" || skip "cannot mount a tmpfs"
        mkdir "$mnt/root"  # root's, 0755: nobody cannot write in it
        text="Permission denied"
      else
        rm -f "$work/quota.img"
        truncate -s 64M "$work/quota.img"
        mkfs.ext4 -q -O quota -E quotatype=usrquota "$work/quota.img" >/dev/null 2>&1 || skip "mkfs.ext4 with quota failed"
        loopdev=$(losetup -f --show "$work/quota.img" 2>/dev/null) || skip "no loop device"
        mount -o usrquota "$loopdev" "$mnt" 2>/dev/null ||
          skip "cannot mount ext4 with quotas (a kernel without CONFIG_QFMT_V2 refuses them; dmesg says so)"
        quotaon "$mnt" >/dev/null 2>&1 || true  # the quota feature turns accounting on already
        mkdir "$mnt/root" && chown "$user" "$mnt/root"
        setquota -u "$user" 4096 4096 0 0 "$mnt" || skip "setquota failed"
        text="Disk quota exceeded"
      fi
      export HOME=$work TMPDIR=/tmp
      if [ "$1" = manager ]; then
        start=$SECONDS
        timeout 120 "${as_user[@]}" "${mpirun[@]}" -np "$np" "$ops" manager "$mnt/root" 1 8 >"$log" 2>&1
      else
        start=$SECONDS
        timeout 120 "${as_user[@]}" "${mpirun[@]}" -np "$np" "$ops" save "$1" "$2" "$mnt/root" new 8 >"$log" 2>&1
      fi
      rc=$?
      secs=$((SECONDS - start))
      if check_failed "$rc" "$secs" "$np" "$text"; then
        left=$(find "$mnt/root" -name '*.tmp-*' 2>/dev/null)
        [ -z "$left" ] && pass || fail "left behind: $left"
      fi
    done
  done
  ;;
*)
  echo "usage: run.sh BUILD_DIR WORK_DIR enospc|erofs|eacces|edquot" >&2
  exit 2
  ;;
esac

echo "realfs $kind: $passes passed, $failures failed"
[ "$failures" -eq 0 ]
