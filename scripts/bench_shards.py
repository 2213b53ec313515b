"""The shards section of scripts/bench: one job on one corpus, run as one
process and as four processes started at once (`embedjob run --shard i/4`, as
`xargs -P 4` starts them), against a simulator with latency and no quota, and
against one with a quota in a "minute" of a few seconds.

Figures: wall time from the first start to the last exit, as a ratio to the
one-process run's in the same scenario; with a quota, utilisation and refused
as the quota section counts them. After each run the output must hold every
row of the one-process run (`embedjob inspect --json`, for shards the
directory as one dataset) and the service must have billed each text once and
the same tokens; the section fails otherwise.
"""

import json
import subprocess
import sys
import time

from benchlib import WINDOW_MS, Simulator, job_file, log, quota_use, run_embedjob, section_main

LATENCY_MS = 200
CONCURRENCY = 4
BATCH = 32
SHARDS = 4
# Requests and tokens per window: below what one process at CONCURRENCY and
# LATENCY_MS sends (CONCURRENCY / LATENCY_MS = 40 requests a window).
QUOTA = (20, 32_000)

# name: (shards, concurrency of each process, limits configured)
CASES = {
    "1 process": (None, CONCURRENCY, False),
    f"{SHARDS} shards": (SHARDS, CONCURRENCY, False),
    f"1 process, {SHARDS}x concurrency": (None, SHARDS * CONCURRENCY, False),
    f"{SHARDS} shards, limits configured": (SHARDS, CONCURRENCY, True),
}


def inspect(embedjob, path):
    """`embedjob inspect PATH --json`; the section fails unless the output is ok."""
    result = subprocess.run([embedjob, "inspect", path, "--json"], capture_output=True, text=True)
    report = json.loads(result.stdout) if result.stdout.strip() else None
    if result.returncode != 0 or not report or not report["ok"]:
        problems = report["problems"] if report else result.stderr.strip()
        raise SystemExit(f"bench: {path} is not one sound dataset: {problems}")
    return report["totals"]


def run_case(embedjob, work, corpus_path, scenario, case):
    shards, concurrency, limited = CASES[case]
    requests, tokens = QUOTA if scenario == "quota" else (None, None)
    limits = {"requests_per_minute": requests * 60_000 // WINDOW_MS,
              "tokens_per_minute": tokens * 60_000 // WINDOW_MS} if limited else {}
    sim = Simulator(embedjob, work, LATENCY_MS, (requests, tokens, 1.0))
    try:
        job, out = job_file(work, f"shards-{scenario}", corpus_path, sim.url, limits,
                            concurrency=concurrency, batch=BATCH, sharded=bool(shards))
        started = time.perf_counter()
        summaries = run_embedjob(embedjob, job, shards)
        seconds = time.perf_counter() - started
        ledger = sim.ledger(texts=True)
    finally:
        sim.stop()
    if None in summaries:
        raise SystemExit(f"bench: shards {scenario} / {case}: {summaries.count(None)} of "
                         f"{len(summaries)} runs failed")
    totals = inspect(embedjob, out)
    row = {"scenario": scenario, "case": case, "processes": len(summaries),
           "concurrency": concurrency, "seconds": seconds, "rows": totals["rows"],
           "shard_seconds": [s["elapsed_seconds"] for s in summaries],
           "requests": ledger["embedding_requests"], "billed": ledger["billed_requests"],
           "tokens": ledger["prompt_tokens"], "texts": ledger["texts"]}
    if requests:
        row["utilisation"], row["refused"] = quota_use(ledger, requests, tokens, seconds)
    log(f"shards {scenario} / {case}: {seconds:.1f}s, {row['rows']} rows, "
        f"{row['requests']} requests, {row['billed']} billed")
    return row


def check(row, base):
    """The same rows and tokens as the one-process run, each text billed once."""
    name = f"shards {row['scenario']} / {row['case']}"
    if row["rows"] != base["rows"]:
        raise SystemExit(f"bench: {name}: {row['rows']} rows, the single run {base['rows']}")
    twice = sum(1 for n in row["texts"].values() if n != 1)
    if twice or len(row["texts"]) != row["rows"]:
        raise SystemExit(f"bench: {name}: {len(row['texts'])} texts billed for {row['rows']} "
                         f"rows, {twice} of them more than once")
    if row["tokens"] != base["tokens"]:
        raise SystemExit(f"bench: {name}: {row['tokens']} tokens billed, the single run "
                         f"{base['tokens']}")
    # Each process may end on one request of fewer than BATCH chunks.
    if row["billed"] > base["billed"] + row["processes"] - 1:
        raise SystemExit(f"bench: {name}: {row['billed']} requests billed, the single run "
                         f"{base['billed']}")


def shards_section(embedjob, work, corpus_path):
    """Runs every case in both scenarios and prints one table."""
    rows = []
    for scenario in ("latency", "quota"):
        base = None
        for case in CASES:
            if CASES[case][2] and scenario != "quota":
                continue
            row = run_case(embedjob, work, corpus_path, scenario, case)
            base = base or row
            check(row, base)
            row["ratio"] = row["seconds"] / base["seconds"]
            rows.append(row)
    print_shards_table(rows)
    return rows


def print_shards_table(rows):
    header = ("scenario", "case", "processes x concurrency", "seconds", "vs 1 process",
              "each process", "utilisation", "refused", "requests", "billed", "rows")
    lines = [(r["scenario"], r["case"], f"{r['processes']} x {r['concurrency']}",
              f"{r['seconds']:.1f}", f"{r['ratio']:.2f}x",
              f"{min(r['shard_seconds']):.1f}-{max(r['shard_seconds']):.1f}"
              if r["processes"] > 1 else f"{r['shard_seconds'][0]:.1f}",
              f"{r['utilisation']:.1%}" if "utilisation" in r else "",
              f"{r['refused']:.1%}" if "refused" in r else "",
              str(r["requests"]), str(r["billed"]), f"{r['rows']:,}") for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def fmt(cells):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    print()
    print(f"Shards: one job, {rows[0]['rows']:,} chunks in requests of {BATCH}, {LATENCY_MS} ms "
          f"latency; quota: {QUOTA[0]} requests and")
    print(f"{QUOTA[1]:,} tokens per {WINDOW_MS} ms window standing for the minute, "
          "starting empty, one key for all processes.")
    print(fmt(header))
    print(fmt(["-" * w for w in widths]))
    for line in lines:
        print(fmt(line))
    print(f"Every process has backend.concurrency {CONCURRENCY}: {SHARDS} shards keep {SHARDS}x the "
          "requests in flight, as")
    print(f"does 1 process at {SHARDS}x concurrency. limits configured: the job's "
          "requests_per_minute and")
    print("tokens_per_minute set to the quota, each shard taking a quarter. seconds: first "
          "start to last")
    print("exit; vs 1 process: over the scenario's first row; each process: the runs' own "
          "elapsed seconds;")
    print("utilisation and refused as in the quota section; billed: requests billed (each "
          "shard may end on")
    print("a short one).")
    sys.stdout.flush()


if __name__ == "__main__":
    section_main(shards_section)
