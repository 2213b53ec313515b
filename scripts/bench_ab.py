"""Two builds of embedjob, A (old) and B (new), on the same work, interleaved.

For each repetition, in an order that alternates between repetitions, both
builds run the floor (examples/floor.rs) and a whole `embedjob run` against
`embedjob simulate` (A's, for both builds), with floats and with base64, at
1024 dimensions. Prints, for each case, the median seconds of each build and
the ratio B/A: the median of the repetitions' ratios and their range. On a
shared machine only ratios taken side by side mean much.

    python3 scripts/bench_ab.py --old OLD_RELEASE_DIR --new NEW_RELEASE_DIR \\
        [--chunks 20000] [--reps 7] [--work .cache/bench-ab]

A release directory holds `embedjob` and `examples/floor` (cargo build
--release --bin embedjob --example floor).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import benchlib
from benchlib import corpus

MODEL = "svc-embed-1"  # 1024 dimensions


def log(message):
    benchlib.log(message, prefix="bench_ab")


def job(work, name, corpus_path, concurrency):
    return benchlib.write_job(
        work, name, corpus_path, base_url="http://127.0.0.1:1", model=MODEL,
        concurrency=concurrency, batch=128,
        output=f'path = "{os.path.join(work, name + ".parquet")}"\ninclude_text = false')


def run(command, env=None):
    result = subprocess.run(command, capture_output=True, text=True,
                            env={**os.environ, "EMBEDJOB_API_KEY": "bench", **(env or {})})
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-3000:])
        raise SystemExit(f"bench_ab: {' '.join(command[:3])} failed ({result.returncode})")
    return json.loads(result.stdout)


def floor(build, job_path, base64):
    out = run([build["floor"], job_path, *(["--base64"] if base64 else [])])
    return {"seconds": out["seconds"], "decode": out["decode_seconds"], "chunks": out["chunks"]}


def whole_run(build, simulator, job_path, encoding, n):
    sim = subprocess.Popen([simulator, "simulate", "--port", "0"], stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True)
    try:
        url = sim.stdout.readline().strip()
        out = run([build["embedjob"], "run", job_path, "--set", f"backend.base_url={url}",
                   "--set", f"backend.encoding_format={encoding}", "--json", "--quiet", "--fresh"])
    finally:
        sim.terminate()
        sim.wait()
    if out["written"] != n:
        raise SystemExit(f"bench_ab: wrote {out['written']} of {n} chunks")
    return {"seconds": out["elapsed_seconds"]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--old", required=True, help="release directory of build A")
    parser.add_argument("--new", required=True, help="release directory of build B")
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--work", default=".cache/bench-ab")
    args = parser.parse_args()
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)

    # Copies, so that a build during the run cannot swap the programs under it.
    builds = {}
    for label, directory in (("old", args.old), ("new", args.new)):
        os.makedirs(os.path.join(work, label), exist_ok=True)
        builds[label] = {}
        for name, relative in (("embedjob", "embedjob"), ("floor", "examples/floor")):
            copy = os.path.join(work, label, name)
            shutil.copy2(os.path.join(directory, relative), copy)
            builds[label][name] = copy
    simulator = builds["old"]["embedjob"]

    n = args.chunks
    corpus_path = corpus(work, n)
    cases = {
        "floor 1024 floats": lambda b, j: floor(b, j["floor"], False),
        "floor 1024 base64": lambda b, j: floor(b, j["floor"], True),
        "run 1024 floats": lambda b, j: whole_run(b, simulator, j["run"], "float", n),
        "run 1024 base64": lambda b, j: whole_run(b, simulator, j["run"], "base64", n),
    }
    results = {(case, label): [] for case in cases for label in builds}
    started = time.perf_counter()
    for rep in range(args.reps):
        order = ("old", "new") if rep % 2 == 0 else ("new", "old")
        for case, measure in cases.items():
            for label in order:
                jobs = {"floor": job(work, f"floor-{label}", corpus_path, 1),
                        "run": job(work, f"run-{label}", corpus_path, 8)}
                results[(case, label)].append(measure(builds[label], jobs))
        log(f"repetition {rep + 1} of {args.reps} done ({time.perf_counter() - started:.0f}s)")

    print(f"{n:,} chunks at 1024 dimensions, {args.reps} repetitions, builds interleaved")
    header = ("case", "measure", "old s", "new s", "new/old", "range")
    lines = []
    for case in cases:
        measures = ["seconds", "decode"] if case.startswith("floor") else ["seconds"]
        for measure in measures:
            old = [r[measure] for r in results[(case, "old")]]
            new = [r[measure] for r in results[(case, "new")]]
            ratios = [b / a for a, b in zip(old, new)]
            lines.append((case, measure, f"{statistics.median(old):.3f}",
                          f"{statistics.median(new):.3f}", f"{statistics.median(ratios):.3f}",
                          f"{min(ratios):.3f}-{max(ratios):.3f}"))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    for row in (header, ["-" * w for w in widths], *lines):
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    print("old s, new s: medians; new/old: the median of each repetition's ratio; range: "
          "its lowest and highest")


if __name__ == "__main__":
    main()
