#!/usr/bin/env python3
"""Checks the storage limit that `ckpt_bench --compare-limit` reports against fio run alone.

    python3 bench/check_limits.py --build build --dir /dev/shm/limits --dir /var/tmp/limits \
        [--size 1G --dp 2 --tp 2] [--tolerance 0.15]

For each directory: one `ckpt_bench --compare-limit --repeat 1` run (a warm-up, and the source
of the fio job files it runs), then fio alone (outside the MPI job, nothing else running) on the
very same job files 3 times, then `ckpt_bench --compare-limit --repeat 3`, then fio alone 3
times more. ckpt_bench's limit of a repeat is the median of three fio rounds
(bench/storage_limits.h); the medians compared are over its repeats and over the six rounds
alone. It prints the medians of each limit (the write, the cold read of the unique bytes,
and on a memory file system with replicas the read of every rank's state) as ckpt_bench measured
it and as fio alone did, and exits 1 when any pair differs by more than --tolerance (relative to
fio alone). A limit that flatters the library is worse than none: this is how we know that
ckpt_bench's ranks leave fio the machine while it runs.

At the test's 256 MiB a limit is 50-100 ms, where one stall of the host moves a median by a third.
A directory where a limit differs is therefore checked once more from the start, and the check
fails only when the same limit differs both times: a bias of ckpt_bench's own (ranks spinning
beside fio) shows in every attempt, a stall of the host in one.

Each check runs in a new directory under a --dir, removed afterwards. Exit status: 0 every limit
agrees; 1 one does not (or a run failed); 77 fio or mpirun is missing, or a --dir has less free
space than 4x --size, and CI is not set (under CI=true that is a failure).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

# The limits compared: (JSON key of ckpt_bench's per-repeat times, the job run alone whose time
# is that limit).
LIMITS = [("limit_write_runs_s", "write"), ("limit_read_runs_s", "read"),
          ("limit_read_needed_runs_s", "needed_read")]


def fio_runtime(job_path):
    """Runs fio on one job file; the slowest job's runtime in seconds, as ckpt_bench takes it."""
    out = subprocess.run(["fio", "--output-format=json", job_path], capture_output=True, text=True)
    text = out.stdout[out.stdout.find("{"):] if "{" in out.stdout else ""
    if out.returncode != 0 or not text:
        raise SystemExit(f"check_limits: fio {job_path} failed: {(out.stdout + out.stderr)[:400]}")
    return max(job["job_runtime"] for job in json.loads(text)["jobs"]) / 1e3


def work_dir(job_text):
    return next(line.split("=", 1)[1] for line in job_text.splitlines() if line.startswith("directory="))


def run_alone(jobs, job_dir):
    """One round of fio alone over ckpt_bench's job files, as ckpt_bench runs them: each write
    job, then its read job; the files removed and the removal committed before the next."""
    times = {}
    for key in [k for k in ("write", "read", "needed_write", "needed_read") if k in jobs]:
        work = work_dir(jobs[key])
        os.makedirs(work, exist_ok=True)
        times[key] = fio_runtime(os.path.join(job_dir, key + ".fio"))
        if key in ("read", "needed_read"):
            shutil.rmtree(work)
            subprocess.run(["sync", "-f", os.path.dirname(work)], check=True)
    return times


def run_bench(a, directory, repeat):
    cmd = (a.mpiexec + ["-np", str(a.dp * a.tp), os.path.join(a.build, "ckpt_bench"), "--size", a.size, "--dp",
                        str(a.dp), "--tp", str(a.tp), "--dir", directory, "--compare-limit", "--repeat",
                        str(repeat), "--json"])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"check_limits: {' '.join(cmd)} failed ({out.returncode}): {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_dir(a, parent):
    """The check in a new directory under `parent`, removed afterwards (never `parent` itself)."""
    os.makedirs(parent, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="check-limits-", dir=parent)
    try:
        return check_in(a, directory, parent)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def check_in(a, directory, parent):
    bench_dir = os.path.join(directory, "bench")
    job_dir = os.path.join(directory, "jobs")
    os.makedirs(job_dir, exist_ok=True)
    first = run_bench(a, bench_dir, 1)
    jobs = first["limit_jobs"]
    for key, text in jobs.items():
        with open(os.path.join(job_dir, key + ".fio"), "w") as f:
            f.write(text)
    alone = [run_alone(jobs, job_dir) for _ in range(a.rounds)]
    measured = run_bench(a, bench_dir, a.rounds)
    if measured["limit_jobs"] != jobs:
        raise SystemExit(f"check_limits: {directory}: ckpt_bench ran other job files than in its first run")
    alone += [run_alone(jobs, job_dir) for _ in range(a.rounds)]
    rows, ok = [], True
    for runs_key, job in LIMITS:
        if runs_key not in measured:
            continue
        inside = statistics.median(measured[runs_key])
        outside = statistics.median(r[job] for r in alone)
        ratio = inside / outside
        good = abs(ratio - 1) <= a.tolerance
        ok &= good
        rows.append({"dir": parent, "limit": job, "ckpt_bench_s": inside, "fio_alone_s": outside,
                     "ratio": ratio, "ckpt_bench_runs_s": measured[runs_key],
                     "fio_alone_runs_s": [r[job] for r in alone], "agrees": good})
        print(f"{parent}: {job:12s} ckpt_bench {inside:.3f} s  fio alone {outside:.3f} s  ratio {ratio:.3f}  "
              f"{'ok' if good else 'DIFFERS by more than %.0f%%' % (100 * a.tolerance)}", flush=True)
    return rows, ok, measured


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default="build")
    p.add_argument("--dir", action="append", required=True, help="a directory to measure in (repeatable)")
    p.add_argument("--size", default="1G")
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3, help="fio alone runs before and after; ckpt_bench's --repeat")
    p.add_argument("--tolerance", type=float, default=0.15)
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--mpiexec", default="mpirun --allow-run-as-root --oversubscribe",
                   help="the MPI launcher and its flags (one string)")
    a = p.parse_args()
    a.mpiexec = a.mpiexec.split()
    a.build = os.path.abspath(a.build)
    missing = [t for t in ("fio", a.mpiexec[0]) if shutil.which(t) is None]
    if missing:
        print(f"check_limits: cannot run: {', '.join(missing)} not found (scripts/setup.sh installs them)")
        return 1 if os.environ.get("CI") == "true" else 77
    need = 4 * parse_size(a.size)  # the checkpoint, fio's files and every rank's state's
    for directory in a.dir:
        os.makedirs(directory, exist_ok=True)
        free = shutil.disk_usage(directory).free
        if free < need:
            print(f"check_limits: cannot run: {directory} has {free >> 20} MiB free, the check needs "
                  f"{need >> 20} MiB")
            return 1 if os.environ.get("CI") == "true" else 77
    rows, ok = [], True
    for directory in a.dir:
        r, good, measured = check_dir(a, directory)
        if not good:
            print(f"{directory}: a limit differs; checking this directory once more", flush=True)
            again, _, measured = check_dir(a, directory)
            differed = {row["limit"] for row in r if not row["agrees"]}
            good = all(row["agrees"] for row in again if row["limit"] in differed)
            for row in again:
                row["attempt"] = 2
            r += again
        rows += r
        ok &= good
        print(f"{directory}: save_vs_limit {measured.get('save_vs_limit', 0):.2f}  "
              f"load_vs_limit {measured.get('load_vs_limit', 0):.2f}"
              + (f"  load_vs_needed_read {measured['load_vs_needed_read']:.2f}" if "load_vs_needed_read" in measured
                 else "") + f"  (fio on {measured.get('limit_cpus')} CPUs)", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"check_limits: {sum(r['agrees'] for r in rows)} of {len(rows)} measured limits agree with fio "
          f"alone within {100 * a.tolerance:.0f}%; " + ("every limit agreed in at least one of two attempts"
          if ok else "a limit differed in both attempts"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
