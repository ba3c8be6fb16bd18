#!/usr/bin/env python3
"""Plots of the benchmark figures kept in docs/benchmarks/data/ (ckpt_bench --json): each
run's throughput against the limit measured in the same run, per tier (/dev/shm, disk), and
each format's against dd on the same files. Writes limits.svg and formats.svg into OUT_DIR
(docs/benchmarks/ for the committed copies; the docs build draws them again).

    python3 scripts/plot_benchmarks.py docs/benchmarks/data docs/benchmarks
"""
import glob
import json
import os
import sys

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

plt.rcParams["svg.hashsalt"] = "distckpt"  # the same figures, the same bytes


def tier(d):
    return "/dev/shm" if d["dir"].startswith("/dev/shm") else "disk (/var/tmp)"


def run_label(name, d):
    size = f"{d['size'] >> 30} GiB"
    shape = "1 rank" if d["ranks"] == 1 else name.split("-")[2].upper().replace("TP", " x TP")  # dp2tp2 -> DP2 x TP2
    extra = [x for x in ("async", "buffered") if x in name]
    return f"{tier(d)}, {shape}, {size}" + "".join(f", {x}" for x in extra)


def bars(ax, labels, series, ylabel, line_at=1.0):
    width = 0.8 / len(series)
    for i, (name, values) in enumerate(series):
        ax.barh([y + i * width for y in range(len(labels))], values, height=width, label=name)
    ax.set_yticks([y + width * (len(series) - 1) / 2 for y in range(len(labels))], labels)
    ax.invert_yaxis()
    ax.axvline(line_at, color="black", linewidth=0.8)
    ax.set_xlabel(ylabel)
    ax.legend(loc="lower right")


def figure(rows, xlabel, title, path):
    """rows: (label, save ratio, load ratio) each."""
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.5))
    bars(ax, [l for l, _, _ in rows], [("save", [s for _, s, _ in rows]), ("load", [r for _, _, r in rows])], xlabel)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None})


def main(data_dir, out_dir):
    limits = []
    for path in sorted(glob.glob(os.path.join(data_dir, "limit-*.json"))):
        d = json.load(open(path))
        limits.append((run_label(os.path.basename(path)[:-5], d), d["save_vs_limit"], d["load_vs_limit"]))
    figure(limits, "throughput / the storage's limit (fio, same run)", "Saves and loads against the storage's limit",
           os.path.join(out_dir, "limits.svg"))

    formats = []
    for path in sorted(glob.glob(os.path.join(data_dir, "dd-*.json"))):
        d = json.load(open(path))
        what = d["format"] + (" integrated" if d["format"] == "native" and d["integrated"] else "")
        if d["format"] == "native" and not d["integrated"]:
            what += f", {d['replica_reads']} replica reads"
        formats.append((f"{tier(d)}: {what}", d["save_vs_dd"], d["load_vs_dd"]))
    figure(formats, "throughput / dd (same files, same run)", "Formats against dd, DP2 x TP2, 1 GiB",
           os.path.join(out_dir, "formats.svg"))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
