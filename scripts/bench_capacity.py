"""The capacity section of scripts/bench: `backend.concurrency = "auto"`
against a self-hosted server's capacity (`embedjob simulate --capacity K`:
K workers, a service time per request and per token, a queue beyond K, and
requests computed even after their client hung up), against a sweep of
fixed concurrencies on the same server, in the same run.

For each K in (1, 4, 32) and two service times: a sweep of fixed
concurrency 1, 2, 4, 8, 16, 32 and 64, which finds the best; then `auto`
and that best fixed concurrency again, REPS times in alternating order.
auto/best = the median over those pairs of auto's chunks/s over the best's,
with their range. The pairs, not the sweep, give the ratio: the best of
seven noisy runs of about the same rate is the luckiest of them (on a
shared machine runs differ by 10%), which a single run of auto would be
measured against. The sweep runs about 60 requests per worker, the pairs
twice as many, about 6 s of the server's work: a batch job runs minutes,
and `auto`'s slow start (log2 K round trips) costs the same few hundred
milliseconds whatever the job's length. A fixed concurrency below K can
reach at most c/K of the server's rate, so it runs on c/K of the corpus (the
same time, about); the others and auto run on the whole corpus. The output
is written to a RAM disk (/dev/shm) when there is one: the writer commits
whenever no answer is at hand, so how many fsyncs a run makes follows how
evenly its answers arrive (a fixed 64 on 32 workers of constant service
time gets them in lockstep bursts), and finishing on a shared disk took
0.5 to 1 s of a 4 s run; none of that is the concurrency's. Then a server whose capacity
halves mid-run (another client arrives): auto's timeouts, the concurrency
it settled on, and how long after the halving requests stopped waiting
longer than their own service time (the server's `queue_settled_ms`).

timeouts and texts twice (texts the server computed more than once, the
same text billed twice) are counted in every run; `auto` must have none.
"""

import os
import shutil
import time

from benchlib import SimulatorProcess, corpus, log, run_embedjob, section_main, write_job

BATCH = 8
FIXED = (1, 2, 4, 8, 16, 32, 64)
# Pairs of auto and the sweep's best, run in alternating order.
REPS = 3
# name: (ms a request, ms per 1000 tokens); a request holds about 340 tokens.
SERVICES = {"50 ms": (50, 0), "5 ms + 100 ms/1k tokens": (5, 100)}
WORKERS = (1, 4, 32)


class CapacitySimulator(SimulatorProcess):
    """`embedjob simulate --capacity` in its own process, short vectors."""

    def __init__(self, embedjob, work, workers, service, change=None):
        base_ms, per_1k = service
        args = [embedjob, "simulate", "--port", "0", "--model", "small=16",
                "--capacity", str(workers), "--service-ms", str(base_ms),
                "--service-ms-per-1k-tokens", str(per_1k)]
        if change:
            after, then = change
            args += ["--capacity-change-after", str(after), "--capacity-then", str(then)]
        super().__init__(args, os.path.join(work, "simulator-capacity.log"))


def run_case(embedjob, work, name, records, workers, service, concurrency, change=None):
    """One run: its summary and the server's ledger, reduced."""
    sim = CapacitySimulator(embedjob, work, workers, service, change)
    out_root = "/dev/shm" if os.path.isdir("/dev/shm") else work
    out_dir = os.path.join(out_root, f"embedjob-bench-{os.getpid()}-{name}")
    shutil.rmtree(out_dir, ignore_errors=True)
    try:
        job = write_job(work, name, corpus(work, records), base_url=sim.url, model="small",
                        concurrency=concurrency, batch=BATCH,
                        output=f'path = "{out_dir}/embeddings.parquet"\ninclude_text = false')
        summary, = run_embedjob(embedjob, job)
        ledger = sim.ledger(texts=True)
    finally:
        sim.stop()
    shutil.rmtree(out_dir, ignore_errors=True)
    if summary is None or summary["written"] != records:
        raise SystemExit(f"bench: {name} did not write its {records} chunks")
    return {
        "rate": records / summary["elapsed_seconds"],
        "timeouts": summary["timeouts"],
        "twice": sum(1 for n in ledger["texts"].values() if n > 1),
        "hangups": ledger.get("computed_after_hangup", 0),
        "concurrency": summary.get("concurrency"),
        "capacity": ledger.get("capacity") or {},
    }


def settled(result):
    c = result["concurrency"]
    return f"{c['settled']} ({c['lowest']}-{c['highest']})" if c else ""


def section(embedjob, work, _corpus_path):
    started = time.perf_counter()
    rows = []
    for workers in WORKERS:
        # About 60 requests per worker to find the best fixed concurrency,
        # twice as many for the pairs (see the module's docs).
        records = BATCH * 60 * (workers + 1)
        for service_name, service in SERVICES.items():
            fixed = {}
            for c in FIXED:
                n = records if c >= workers else max(BATCH, records * c // workers)
                fixed[c] = run_case(embedjob, work, f"cap-k{workers}-c{c}", n, workers, service, c)
            best = max(fixed, key=lambda c: fixed[c]["rate"])
            pairs = []
            for rep in range(REPS):
                runs = {}
                for kind in (("auto", "best") if rep % 2 == 0 else ("best", "auto")):
                    concurrency = '"auto"' if kind == "auto" else best
                    runs[kind] = run_case(embedjob, work, f"cap-k{workers}-{kind}", 2 * records,
                                          workers, service, concurrency)
                pairs.append((runs["auto"], runs["best"]))
            pairs.sort(key=lambda p: p[0]["rate"] / p[1]["rate"])
            row = (workers, service_name, fixed, best, pairs)
            rows.append(row)
            auto = pairs[len(pairs) // 2][0]
            ratios = ", ".join(f"{a['rate'] / b['rate']:.0%}" for a, b in pairs)
            log(f"K={workers}, {service_name}: best fixed c={best}; auto/best {ratios}; "
                f"settled {settled(auto)}", prefix="bench capacity")

    # Another client arrives: 16 workers become 8 after a third of the requests.
    workers, then = 16, 8
    records = BATCH * 60 * (workers + 1)
    after = records // BATCH // 3
    halving = run_case(embedjob, work, "cap-halving", records, workers, SERVICES["50 ms"],
                       '"auto"', change=(after, then))
    print_table(rows, halving, (workers, then, after))
    log(f"done in {time.perf_counter() - started:.0f}s", prefix="bench capacity")


def print_table(rows, halving, change):
    header = ["K", "service"] + [f"c={c}" for c in FIXED] + [
        "best", "auto", "auto/best", "range", "auto settled", "timeouts auto/fixed",
        "texts twice auto/fixed"]
    lines = []
    for workers, service, fixed, best, pairs in rows:
        auto, again = pairs[len(pairs) // 2]
        autos = [a for a, _ in pairs]
        fixeds = list(fixed.values()) + [b for _, b in pairs]
        ratios = [a["rate"] / b["rate"] for a, b in pairs]
        lines.append([
            str(workers), service,
            *(f"{fixed[c]['rate']:,.0f}" + ("*" if c == best else "") for c in FIXED),
            f"{again['rate']:,.0f}",
            f"{auto['rate']:,.0f}",
            f"{ratios[len(ratios) // 2]:.0%}",
            f"{ratios[0]:.0%}-{ratios[-1]:.0%}",
            settled(auto),
            f"{sum(a['timeouts'] for a in autos)}/{sum(r['timeouts'] for r in fixeds)}",
            f"{sum(a['twice'] for a in autos)}/{sum(r['twice'] for r in fixeds)}",
        ])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def fmt(cells):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    print()
    print("capacity: chunks/s of fixed concurrencies and of auto against K workers")
    print(fmt(header))
    print(fmt(["-" * w for w in widths]))
    for line in lines:
        print(fmt(line))
    workers, then, after = change
    cap = halving["capacity"]
    print()
    print(f"halving: {workers} workers, {then} after request {after} (50 ms a request): auto "
          f"{halving['rate']:,.0f} chunks/s, settled {settled(halving)}, "
          f"{halving['timeouts']} timeouts, {halving['twice']} texts twice, "
          f"{halving['hangups']} requests computed after a hang-up; requests stopped waiting "
          f"longer than their service time {cap.get('queue_settled_ms')} ms after the halving")
    print(f"* the sweep's best fixed concurrency; best, auto: the median pair of {REPS} runs of")
    print("each, in alternating order; auto/best: the median of the pairs' ratios, and their range;")
    print("timeouts and texts twice: all auto runs', and all fixed runs' together; a fixed c below")
    print("K runs on c/K of the corpus.")


if __name__ == "__main__":
    section_main(section)
