"""Runs the cases of scripts/bench and prints the table. Started by scripts/bench,
which builds the programs and the virtualenv this needs.

Every figure is a ratio against a baseline measured in the same invocation:
embedjob's chunks/s against the Python baseline's, embedjob's time against
the floor's, and throughput with latency against concurrency 1 times the
concurrency.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

from benchlib import Simulator, corpus, log, write_job

MODELS = {1024: "svc-embed-1", 3072: "svc-embed-1-l"}
HERE = os.path.dirname(os.path.abspath(__file__))


def throughput_job(work, name, corpus_path, dims, concurrency, batch):
    out = os.path.join(work, "out", name + ".parquet")
    return write_job(work, name, corpus_path, base_url="http://127.0.0.1:1",
                     model=MODELS[dims], concurrency=concurrency, batch=batch,
                     output=f'path = "{out}"\ninclude_text = false')


def timed(command, env=None, sim=None):
    """Runs command under GNU time; returns its stdout and peak RSS in MB."""
    result = subprocess.run(["/usr/bin/time", "-v", *command], capture_output=True, text=True,
                            env={**os.environ, **(env or {})})
    if sim:
        sim.check_alive()
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-3000:])
        raise SystemExit(f"bench: {' '.join(command[:3])} failed ({result.returncode})")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr)
    return result.stdout, int(rss.group(1)) / 1024


def embedjob_case(args, name, n, dims, concurrency=8, batch=128, latency_ms=0, encoding="float"):
    job = throughput_job(args.work, name, corpus(args.work, n), dims, concurrency, batch)
    sim = Simulator(args.embedjob, args.work, latency_ms)
    try:
        wall, cpu = time.perf_counter(), sim.cpu_seconds()
        out, rss = timed([args.embedjob, "run", job, "--set", f"backend.base_url={sim.url}",
                          "--set", f"backend.encoding_format={encoding}",
                          "--json", "--quiet"], {"EMBEDJOB_API_KEY": "bench"}, sim)
        wall, cpu = time.perf_counter() - wall, sim.cpu_seconds() - cpu
    finally:
        sim.stop()
    summary = json.loads(out)
    if summary["written"] != n:
        raise SystemExit(f"bench: {name} wrote {summary['written']} of {n} chunks")
    os.remove(os.path.join(args.work, "out", name + ".parquet"))
    return {"chunks": n, "seconds": summary["elapsed_seconds"], "rss": rss, "sim": cpu / wall}


def run_python(args, name, n, dims, concurrency=8, batch=128):
    sim = Simulator(args.embedjob, args.work, 0)
    out_path = os.path.join(args.work, "out", name + ".parquet")
    try:
        wall, cpu = time.perf_counter(), sim.cpu_seconds()
        out, rss = timed([args.python, args.baseline, corpus(args.work, n), out_path,
                          MODELS[dims], str(dims), str(concurrency), str(batch)],
                         {"EMBEDJOB_API_KEY": "bench", "EMBEDJOB_BASE_URL": sim.url}, sim)
        wall, cpu = time.perf_counter() - wall, sim.cpu_seconds() - cpu
    finally:
        sim.stop()
    result = json.loads(out)
    os.remove(out_path)
    return {"chunks": result["chunks"], "seconds": result["seconds"], "rss": rss, "sim": cpu / wall}


def run_floor(args, name, n, dims, batch=128, base64=False):
    job = throughput_job(args.work, name, corpus(args.work, n), dims, 1, batch)
    out, rss = timed([args.floor, job, *(["--base64"] if base64 else [])],
                     {"EMBEDJOB_API_KEY": "bench"})
    result = json.loads(out)
    os.remove(os.path.join(args.work, "out", name + ".parquet"))
    steps = ", ".join(f"{k[:-8]} {result[k]:.2f}s" for k in ("chunk_seconds", "decode_seconds", "write_seconds"))
    decode_rate = result["body_bytes"] / 1e6 / max(result["decode_seconds"], 1e-9)
    steps += (f"; {result['body_bytes'] / 1e6:,.0f} MB of bodies, "
              f"{result['chunks'] / max(result['decode_seconds'], 1e-9):,.0f} vectors/s "
              f"({decode_rate:,.0f} MB/s) decoded")
    return {"chunks": result["chunks"], "seconds": result["seconds"], "rss": rss, "sim": None,
            "note": steps, "decode": result["decode_seconds"]}


def section(args, script, *extra):
    """Runs a section of its own (bench_quota.py, bench_shards.py) on the same
    programs and work directory; its table follows this one on stdout."""
    sys.stdout.flush()
    done = subprocess.run([sys.executable, os.path.join(HERE, script),
                           "--embedjob", args.embedjob, "--work", args.work, *extra])
    if done.returncode != 0:
        raise SystemExit(done.returncode)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--embedjob", required=True)
    parser.add_argument("--floor", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--quick", action="store_true", help="the smaller set")
    parser.add_argument("--latency-ms", type=int, default=200)
    parser.add_argument("--quota", action="store_true", help="the quota section alone")
    parser.add_argument("--shards", action="store_true", help="the shards section alone")
    parser.add_argument("--capacity", action="store_true", help="the capacity section alone")
    parser.add_argument("--padding", action="store_true", help="the padding section alone")
    args = parser.parse_args()
    args.baseline = os.path.join(HERE, "bench_openai.py")
    os.makedirs(os.path.join(args.work, "out"), exist_ok=True)

    if args.quota or args.shards or args.capacity or args.padding:
        started = time.perf_counter()
        if args.quota:
            section(args, "bench_quota.py")
        if args.shards:
            section(args, "bench_shards.py")
        if args.capacity:
            section(args, "bench_capacity.py")
        if args.padding:
            section(args, "bench_padding.py", "--python", args.python)
        log(f"done in {time.perf_counter() - started:.0f}s")
        return

    n = 20_000 if args.quick else 100_000
    memory_sizes = (20_000, 100_000) if args.quick else (100_000, 1_000_000)
    rounds = 8 if args.quick else 20
    batch = 128
    rows = []

    def case(label, result, **extra):
        result.update(extra)
        rows.append((label, result))
        log(f"{label}: {result['chunks'] / result['seconds']:,.0f} chunks/s, "
            f"{result['seconds']:.2f}s, {result['rss']:.0f} MB")
        return result

    started = time.perf_counter()
    for dims in (1024, 3072):
        log(f"corpus of {n} chunks, {dims} dimensions")
        floor = case(f"floor {dims}", run_floor(args, f"floor-{dims}", n, dims))
        # The same work with the vectors in base64: its decode step against the one above.
        case(f"floor {dims} base64", run_floor(args, f"floor-b64-{dims}", n, dims, base64=True),
             floor=floor, decode_vs=floor)
        # The baseline takes minutes for what embedjob does in seconds: it runs
        # on the first chunks of the same corpus, and is compared by chunks/s.
        python = case(f"python openai {dims}", run_python(args, f"python-{dims}", min(n, 20_000), dims))
        floats = case(f"embedjob {dims}", embedjob_case(args, f"run-{dims}", n, dims),
                      python=python, floor=floor)
        case(f"embedjob {dims} base64", embedjob_case(args, f"run-b64-{dims}", n, dims, encoding="auto"),
             python=python, floor=floor, float=floats)
    # Scaling with latency, in requests of 32 chunks so that up to concurrency
    # 16 the series is bound by the latency and not by a small machine's CPU;
    # then the same at the batch size of the other cases, where it is.
    for size, series in ((32, (1, 4, 16, 64)), (batch, (1, 16))):
        base = None
        for concurrency in series:
            chunks = concurrency * size * rounds
            result = embedjob_case(args, f"latency-b{size}-c{concurrency}", chunks, 1024,
                                  concurrency=concurrency, batch=size, latency_ms=args.latency_ms)
            base = base or result
            case(f"embedjob 1024 +{args.latency_ms}ms batch {size} c={concurrency}", result,
                 scaling=(chunks / result["seconds"]) / (concurrency * base["chunks"] / base["seconds"]))
    for size in memory_sizes:
        case(f"embedjob 3072 memory {size:,}", embedjob_case(args, f"memory-{size}", size, 3072))
    print_table(rows)
    section(args, "bench_quota.py")
    section(args, "bench_shards.py")
    section(args, "bench_capacity.py")
    section(args, "bench_padding.py", "--python", args.python)
    log(f"done in {time.perf_counter() - started:.0f}s")


def print_table(rows):
    header = ("case", "chunks", "seconds", "chunks/s", "vs python", "vs floor", "vs float",
              "scaling", "peak RSS", "sim CPU")
    lines = []
    for label, r in rows:
        rate = r["chunks"] / r["seconds"]
        python = r.get("python")
        floor = r.get("floor")
        floats = r.get("float")
        decode_vs = r.get("decode_vs")
        if floats:
            vs_float = f"{rate / (floats['chunks'] / floats['seconds']):.2f}x"
        elif decode_vs:
            vs_float = f"{r['decode'] / decode_vs['decode']:.2f}x dec"
        else:
            vs_float = ""
        lines.append((
            label,
            f"{r['chunks']:,}",
            f"{r['seconds']:.2f}",
            f"{rate:,.0f}",
            f"{rate / (python['chunks'] / python['seconds']):.2f}x" if python else "",
            f"{r['seconds'] / floor['seconds']:.2f}x" if floor else "",
            vs_float,
            f"{r['scaling']:.0%}" if "scaling" in r else "",
            f"{r['rss']:.0f} MB",
            f"{r['sim']:.0%}" if r["sim"] is not None else "",
        ))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def fmt(cells):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    print(fmt(header))
    print(fmt(["-" * w for w in widths]))
    for line in lines:
        print(fmt(line))
    notes = [f"{label}: {r['note']}" for label, r in rows if r.get("note")]
    print()
    print("vs python: chunks/s over the Python baseline's; vs floor: seconds over the floor's")
    print("(with floats); vs float: chunks/s of `encoding_format = \"auto\"` (base64) over")
    print("floats', or for the floor, seconds decoding base64 over decoding floats (dec);")
    print("scaling: chunks/s over concurrency x chunks/s at concurrency 1; sim CPU: the")
    print("simulator's CPU time over the case's wall time (1 core = 100%).")
    for note in notes:
        print(note)


if __name__ == "__main__":
    main()
