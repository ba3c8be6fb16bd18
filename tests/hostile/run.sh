#!/usr/bin/env bash
# Damaged and hostile files against every reader: `distckpt verify`, `inspect`, `ls` and
# the library's load() (tests/hostile/hostile.cc makes them from the golden fixtures:
# truncations at every structural boundary of every format, empty files, wrong magics,
# huge counts, random flips, and hostile index fields under a valid CRC). Every call on a
# file has 10 s. Fails on any crash (a signal), any hang, and any acceptance of a
# case its class says must be refused (see hostile.cc).
# Usage: run.sh BUILD_DIR WORK_DIR [processes|in-process [CLI_EVERY]]
#   processes (default): each file through the `distckpt` binary and `hostile load`, one
#     process per tool and file;
#   in-process: the same three calls per file in one `hostile batch` process: a process
#     start costs 0.35 s under the sanitizers (the 942 of them took 9 minutes there), and
#     the plain build's run takes 21 s instead of 59. A crash or hang is reported for its
#     file and tool, and the batch goes on after it. With CLI_EVERY, every CLI_EVERY-th
#     file also goes through the binaries, as in `processes`.
set -uo pipefail
build=$(cd "$1" && pwd)
work=$2
mode=${3:-processes}
cli_every=${4:-0}
here=$(cd "$(dirname "$0")" && pwd)
fixtures=$here/../golden/fixtures
dc=$build/distckpt
hostile=$build/tests/hostile
rm -rf "$work"
mkdir -p "$work/good"
cp -r "$fixtures/root/step-12" "$work/good/native"
chmod -R u+w "$work/good"
# Single files as this build writes them (a .ckpt says in its metadata what it holds).
for to in ckpt safetensors hdf5; do
  "$dc" convert "$work/good/native" "$work/good/model" --to "$to" >/dev/null || { echo "hostile: FAIL: convert"; exit 1; }
done
cp -r "$fixtures/encrypted/step-5" "$work/good/encrypted"
cp "$fixtures/key.hex" "$work/good/key.hex"
chmod -R u+w "$work/good"
"$dc" convert "$work/good/native" "$work/good/model-gcm" --to ckpt --key-file "$work/good/key.hex" \
  --enc-mode AES-GCM >/dev/null || { echo "hostile: FAIL: encrypting convert"; exit 1; }
"$hostile" gen "$work/good" "$work/corpus" || { echo "hostile: FAIL: generator"; exit 1; }

files=0 crashes=0 hangs=0 accepted=0
check() {  # CASE TOOL MUST_REFUSE RC
  local name=$1 tool=$2 must_refuse=$3 rc=$4
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "FAIL hang: $tool $name"; hangs=$((hangs + 1))
  elif [ "$rc" -ge 128 ]; then
    echo "FAIL crash (exit $rc): $tool $name"; crashes=$((crashes + 1))
  elif [ "$must_refuse" = yes ] && [ "$rc" -eq 0 ]; then
    echo "FAIL accepted: $tool $name"; accepted=$((accepted + 1))
  fi
}
# What must refuse a case of CLASS: verify and load refuse any damage a check covers,
# inspect (which reads no data) only damage to the structure.
must_refuse() {  # CLASS TOOL
  case $2 in
    inspect) [ "$1" = structure ] && echo yes || echo no ;;
    *) [ "$1" = any ] && echo no || echo yes ;;
  esac
}
manifest=$work/corpus/manifest.tsv
# Every EVERY-th case (from the first) through the binaries, a process per tool and file.
through_binaries() {  # EVERY
  local every=$1 index=0
  while IFS=$'\t' read -r name class path key; do
    index=$((index + 1))
    [ $(((index - 1) % every)) -eq 0 ] || continue
    keyargs=()
    [ "$key" != - ] && keyargs=(--key-file "$key")
    loadkey=()
    [ "$key" != - ] && loadkey=("$key")
    timeout 10 "$dc" verify "${keyargs[@]}" "$path" </dev/null >/dev/null 2>&1
    rc=$?
    check "$name" verify "$(must_refuse "$class" verify)" "$rc"
    timeout 10 "$hostile" load "$path" "${loadkey[@]}" </dev/null >/dev/null 2>&1
    rc=$?
    check "$name" load "$(must_refuse "$class" load)" "$rc"
    timeout 10 "$dc" inspect "${keyargs[@]}" "$path" </dev/null >/dev/null 2>&1
    rc=$?
    check "$name" inspect "$(must_refuse "$class" inspect)" "$rc"
  done <"$manifest"
}
if [ "$mode" = processes ]; then
  files=$(wc -l <"$manifest")
  through_binaries 1
else
  results=$work/batch.results
  : >"$results"
  files=$(wc -l <"$manifest")
  first=0
  while [ "$first" -lt "$files" ]; do
    # Each call has its own 10 s alarm; this bounds the batch if that fails.
    timeout $((30 * (files - first) + 60)) "$hostile" batch "$manifest" "$first" "$results" 2>>"$work/batch.stderr"
    rc=$?
    read -r word n tool _ < <(tail -n 1 "$results")
    if [ "${word:-}" = begin ]; then
      # The process ended inside this call: its exit status is the call's.
      echo "end $n $tool $rc" >>"$results"
      if [ "$rc" -lt 124 ]; then  # a reader that exits the process: a defect in itself
        echo "FAIL exit: $tool of case $((n + 1)) ended the process with exit $rc"
        crashes=$((crashes + 1))
      fi
      echo "hostile: the batch ended in $tool of case $((n + 1)) (exit $rc); its stderr ends with:"
      tail -n 30 "$work/batch.stderr"
    elif [ "$rc" -eq 124 ] && [ "${word:-}" = end ]; then
      :  # a call's alarm: its line says so
    elif [ "$rc" -ne 0 ]; then
      echo "FAIL crash (exit $rc): the batch process after its last case (a sanitizer's leak report?); its stderr ends with:"
      tail -n 60 "$work/batch.stderr"
      crashes=$((crashes + 1))
      break
    else
      break
    fi
    first=$((${n:-$files} + 1))
  done
  mapfile -t cases < <(cut -f1,2 "$manifest")
  while read -r word n tool rc; do
    [ "$word" = end ] || continue
    IFS=$'\t' read -r name class <<<"${cases[$n]}"
    check "$name" "$tool" "$(must_refuse "$class" "$tool")" "$rc"
  done <"$results"
  checked=$(grep -c '^end ' "$results")
  if [ "$checked" -lt $((3 * files)) ]; then
    echo "hostile: $checked of $((3 * files)) calls ran (a crash skips the rest of its case)"
  fi
  if [ "$cli_every" -gt 0 ]; then
    echo "hostile: every ${cli_every}th file through the binaries too"
    through_binaries "$cli_every"
  fi
fi
# Listing roots full of damage: no crash, no hang, and nothing damaged listed committed.
: >"$work/ls.stderr"
for dir in "$work/corpus"/*/; do
  # 30 s, and 1 s more per entry: an .h5 file's reader is a program started per file
  # (0.11 to 0.35 s under the sanitizers), and one such directory holds 91.
  entries=$(find "$dir" -mindepth 1 -maxdepth 1 | wc -l)
  timeout $((30 + entries)) "$dc" ls --json "$dir" >"$work/ls.json" 2>>"$work/ls.stderr"
  rc=$?
  check "$dir" ls no "$rc"
  [ "$rc" -eq 0 ] || { echo "FAIL ls $dir: exit $rc"; accepted=$((accepted + 1)); continue; }
  python3 - "$work/ls.json" "$work/corpus/manifest.tsv" "$dir" <<'PY' || accepted=$((accepted + 1))
import json, os, sys
ls = json.load(open(sys.argv[1]))
structure = set()
for line in open(sys.argv[2]):
    name, cls, path, key = line.rstrip("\n").split("\t")
    if cls == "structure" and os.path.dirname(path.rstrip("/")) == sys.argv[3].rstrip("/"):
        structure.add(os.path.basename(path))
bad = [e["name"] for e in ls["entries"] if e["state"] == "committed" and e["name"] in structure]
if bad:
    print("FAIL ls lists damaged files as committed:", bad)
    sys.exit(1)
PY
done
# Names from a file reach the terminal escaped: a safetensors header whose tensor name
# holds an OSC and a CSI (C0 ESC, C1 U+009B) and an unknown dtype. The tools' messages
# name them as \x1b and \u009b, never as raw control bytes.
python3 - "$work/escape.safetensors" <<'PY'
import json, struct, sys
name = "w\x1b]0;owned\x07\u009b31m"
header = json.dumps({name: {"dtype": "Q\x1b[2J", "shape": [1], "data_offsets": [0, 4]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(header)) + header + b"\0" * 4)
PY
[ $? -eq 0 ] || { echo "FAIL: could not write escape.safetensors"; accepted=$((accepted + 1)); }
for tool in verify inspect; do
  timeout 10 "$dc" "$tool" "$work/escape.safetensors" >/dev/null 2>"$work/escape.err"
  rc=$?
  cat "$work/escape.err" >>"$work/ls.stderr"  # scanned for sanitizer reports below
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then
    echo "FAIL $tool escape.safetensors: exit $rc (a refusal expected)"; accepted=$((accepted + 1))
  elif LC_ALL=C grep -q $'[\x1b\x07\x9b]' "$work/escape.err"; then
    echo "FAIL $tool escape.safetensors: raw control bytes in its message:"; cat -v "$work/escape.err"
    accepted=$((accepted + 1))
  elif ! grep -qF '\x1b' "$work/escape.err"; then
    echo "FAIL $tool escape.safetensors: the name is not in its message, escaped:"; cat -v "$work/escape.err"
    accepted=$((accepted + 1))
  fi
done
# A sanitizer's report from a program the tools started (the HDF5 reader's: its abort is
# only the file's kCorruption to the tool that asked) is a defect in distckpt's code too.
reports=$(cat "$work/batch.stderr" "$work/ls.stderr" 2>/dev/null |
          grep -cE "ERROR: (Address|Leak)Sanitizer|(ERROR|WARNING): ThreadSanitizer|runtime error:")
if [ "$reports" -gt 0 ]; then
  echo "FAIL: $reports sanitizer report(s) in the tools' stderr:"
  cat "$work/batch.stderr" "$work/ls.stderr" 2>/dev/null | grep -E -A30 "ERROR: (Address|Leak)Sanitizer|(ERROR|WARNING): ThreadSanitizer|runtime error:" | head -80
  crashes=$((crashes + reports))
fi
echo "hostile: $files files, $crashes crashes, $hangs hangs, $accepted accepted"
[ "$crashes" -eq 0 ] && [ "$hangs" -eq 0 ] && [ "$accepted" -eq 0 ]
