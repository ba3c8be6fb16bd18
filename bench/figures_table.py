#!/usr/bin/env python3
"""Prints the Markdown tables of docs/benchmarks.md from the JSON lines bench/run_figures.sh kept.

    python3 bench/figures_table.py docs/benchmarks/data

Every figure in a row comes from one ckpt_bench run: ours and its reference, measured in the same
process and directory. Runs missing from the directory are left out.
"""
import json
import os
import sys

LIMIT_ROWS = [
    ("limit-shm-dp2tp2", "`/dev/shm`, DP2 x TP2, 1 GiB"),
    ("limit-shm-dp2tp2-async", "`/dev/shm`, DP2 x TP2, 1 GiB, `--async`"),
    ("limit-shm-dp2tp1", "`/dev/shm`, DP2 x TP1, 1 GiB"),
    ("limit-shm-1rank", "`/dev/shm`, 1 rank, 1 GiB"),
    ("limit-shm-dp2tp2-4g", "`/dev/shm`, DP2 x TP2, 4 GiB"),
    ("limit-disk-dp2tp2", "`/var/tmp`, DP2 x TP2, 1 GiB"),
    ("limit-disk-dp2tp2-async", "`/var/tmp`, DP2 x TP2, 1 GiB, `--async`"),
    ("limit-disk-dp2tp2-buffered", "`/var/tmp`, DP2 x TP2, 1 GiB, `--buffered-reads`"),
    ("limit-disk-dp2tp2-4g", "`/var/tmp`, DP2 x TP2, 4 GiB"),
]
DD_ROWS = [
    ("dd-disk-each", "`/var/tmp`, native, each replica reads"),
    ("dd-disk-shared", "`/var/tmp`, native, shared replica reads"),
    ("dd-disk-integrated", "`/var/tmp`, native `--integrated`"),
    ("dd-disk-ckpt", "`/var/tmp`, `.ckpt`"),
    ("dd-disk-safetensors", "`/var/tmp`, safetensors"),
    ("dd-disk-hdf5", "`/var/tmp`, HDF5 (parallel)"),
    ("dd-shm-each", "`/dev/shm`, native, each replica reads"),
    ("dd-shm-shared", "`/dev/shm`, native, shared replica reads"),
]
TIER_ROWS = [
    ("tier-dp1tp2", "DP1 x TP2, 2 ranks, synchronous"),
    ("tier-dp2tp2-async", "DP2 x TP2, 4 ranks, `--async`"),
]


def load(directory, name):
    path = os.path.join(directory, name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        text = f.read().strip()
    return json.loads(text) if text else None


def s(x):
    return "" if x is None else f"{x:.3f} s"


def r(x):
    return "" if x is None else f"{x:.2f}"


def limit_table(directory):
    print("| run | save | fio write | `save_vs_limit` (paired) | load | fio cold read of the unique bytes "
          "| `load_vs_limit` (paired) | fio read of every rank's state | `load_vs_needed_read` |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, label in LIMIT_ROWS:
        j = load(directory, name)
        if j is None:
            continue
        print(f"| {label} | {s(j['save_s'])} | {s(j['limit_write_s'])} | **{r(j['save_vs_limit'])}** "
              f"({r(j['save_vs_limit_paired'])}) | {s(j['load_s'])} | {s(j['limit_read_s'])} | "
              f"**{r(j['load_vs_limit'])}** ({r(j['load_vs_limit_paired'])}) | {s(j.get('limit_read_needed_s'))} | "
              f"{r(j.get('load_vs_needed_read'))} |")


def async_lines(directory):
    for name, label in LIMIT_ROWS:
        j = load(directory, name)
        if j is not None and "blocking_s" in j:
            print(f"- {label}: the caller was blocked {s(j['blocking_s'])}, {r(j['blocking_vs_memcpy'])} x a memcpy "
                  f"of its bytes by every rank at once ({s(j['memcpy_s'])}); committed after {s(j['save_s'])}.")


def dd_table(directory):
    print("| run | save | dd write + fsync | `save_vs_dd` | load | dd read | `load_vs_dd` | bytes read | "
          "peak extra per rank |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, label in DD_ROWS:
        j = load(directory, name)
        if j is None:
            continue
        print(f"| {label} | {s(j['save_s'])} | {s(j['dd_write_s'])} | {r(j['save_vs_dd'])} | {s(j['load_s'])} | "
              f"{s(j['dd_read_s'])} | {r(j['load_vs_dd'])} | {j['bytes_read'] / 1e9:.2f} GB | "
              f"{j['peak_extra_bytes'] / 2**20:.1f} MiB |")


def tier_table(directory):
    print("| run | local save (/ memcpy) | caller blocked (/ memcpy) | drain to disk | restore, local tier | "
          "restore, disk (evicted) | recovery ratio | dd read: memory, disk (ratio) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, label in TIER_ROWS:
        j = load(directory, name)
        if j is None:
            continue
        blocked = f"{s(j['blocking_s'])} ({r(j['blocking_vs_memcpy'])})" if j.get("blocking_s") is not None else ""
        print(f"| {label} | {s(j['local_save_s'])} ({r(j['local_vs_memcpy'])}) | {blocked} | {s(j['drain_s'])} | "
              f"{s(j['restore_local_s'])} | {s(j['restore_global_s'])} | {r(j['recovery_ratio'])} | "
              f"{s(j['dd_read_local_s'])}, {s(j['dd_read_global_s'])} ({r(j['read_limit_ratio'])}) |")


def check_table(directory):
    path = os.path.join(directory, "check-limits.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        rows = json.load(f)
    print("| directory | limit | ckpt_bench (median of 3 repeats) | fio alone (median of 6) | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        where = "`/dev/shm`" if row["dir"].startswith("/dev/shm") else "`/var/tmp`"
        print(f"| {where} | {row['limit']} | {s(row['ckpt_bench_s'])} | {s(row['fio_alone_s'])} | {r(row['ratio'])} |")


def main():
    directory = sys.argv[1] if len(sys.argv) > 1 else "docs/benchmarks/data"
    for title, table in [("The limits against fio alone", check_table), ("Against the storage's limit", limit_table), ("Async saves", async_lines),
                         ("Formats and replica reads beside dd", dd_table), ("The node-local tier", tier_table)]:
        print(f"<!-- {title} -->")
        table(directory)
        print()


if __name__ == "__main__":
    main()
