"""Runs the cases of scripts/bench-pgvector and prints the table. Needs only
the standard library, a release embedjob and a server from scripts/setup-postgres
(EMBEDJOB_TEST_PG_URL, EMBEDJOB_TEST_PG_PASSWORD in the environment)."""

import argparse
import json
import os
import statistics
import subprocess
import time

from benchlib import corpus, log, write_job


def job(work, name, corpus_path, base_url, output):
    return write_job(work, name, corpus_path, base_url=base_url, model="svc-embed-1",
                     concurrency=8, batch=128, output=output)


def pg_output(name, work, index):
    return (f'kind = "pgvector"\nurl = "{os.environ["EMBEDJOB_TEST_PG_URL"]}"\n'
            f'password_env = "EMBEDJOB_TEST_PG_PASSWORD"\ntable = "{name}"\n'
            f'index = "{index}"\nstate_dir = "{os.path.join(work, "state")}"')


def run(embedjob, job_path):
    started = time.monotonic()
    done = subprocess.run([embedjob, "run", job_path, "--fresh", "--json", "--quiet"],
                          capture_output=True, text=True, env=ENV)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"bench-pgvector: {job_path} failed: {done.stderr}")
    summary = json.loads(done.stdout)
    return summary, wall


def query_times(embedjob, job_path, queries):
    times = []
    for i in range(queries):
        text = f"vector index token batch record {i * 7919 % 100000}"
        started = time.monotonic()
        done = subprocess.run([embedjob, "query", job_path, text, "-k", "10", "--json"],
                              capture_output=True, text=True, env=ENV)
        times.append(time.monotonic() - started)
        if done.returncode != 0:
            raise SystemExit(f"bench-pgvector: query on {job_path} failed: {done.stderr}")
        results = json.loads(done.stdout)["results"]
        if len(results) != 10:
            raise SystemExit(f"bench-pgvector: {len(results)} results, not 10")
    return statistics.median(times), min(times), max(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--embedjob", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=7)
    parser.add_argument("--hnsw", action="store_true")
    args = parser.parse_args()

    global ENV
    ENV = dict(os.environ, EMBEDJOB_API_KEY="bench-key")
    sim = subprocess.Popen([args.embedjob, "simulate", "--port", "0"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        base_url = sim.stdout.readline().strip()
        data = corpus(args.work, args.rows)
        tiny = corpus(args.work, 20)
        parquet_out = os.path.join(args.work, "out", "bench.parquet")
        cases = [
            ("parquet", f'path = "{parquet_out}"\ninclude_text = true'),
            ("pgvector", pg_output("bench_exact", args.work, "none")),
        ]
        if args.hnsw:
            cases.append(("pgvector hnsw", pg_output("bench_hnsw", args.work, "hnsw")))
        rows = []
        for name, output in cases:
            path = job(args.work, name.replace(" ", "-"), data, base_url, output)
            log(f"run: {name}, {args.rows} rows", "bench-pgvector")
            summary, wall = run(args.embedjob, path)
            rate = summary["written"] / summary["elapsed_seconds"]
            log(f"query: {name}, {args.queries} queries", "bench-pgvector")
            median, fastest, slowest = query_times(args.embedjob, path, args.queries)
            rows.append((name, summary["written"], summary["elapsed_seconds"], rate, median,
                         fastest, slowest))
        base = job(args.work, "baseline", tiny, base_url,
                   f'path = "{os.path.join(args.work, "out", "tiny.parquet")}"')
        run(args.embedjob, base)
        baseline, _, _ = query_times(args.embedjob, base, args.queries)
    finally:
        sim.terminate()
        sim.wait()

    parquet_rate = rows[0][3]
    print(f"{'output':<15} {'rows':>8} {'run s':>7} {'rows/s':>8} {'vs parquet':>10} "
          f"{'query median':>12} {'min':>7} {'max':>7} {'search adds':>11}")
    for name, written, seconds, rate, median, fastest, slowest in rows:
        print(f"{name:<15} {written:>8} {seconds:>7.1f} {rate:>8.0f} {rate / parquet_rate:>9.0%} "
              f"{median * 1000:>10.0f}ms {fastest * 1000:>5.0f}ms {slowest * 1000:>5.0f}ms "
              f"{(median - baseline) * 1000:>9.0f}ms")
    print(f"query baseline (20-row output): {baseline * 1000:.0f} ms median")


if __name__ == "__main__":
    main()
