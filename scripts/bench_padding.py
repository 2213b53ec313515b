"""The padding section of scripts/bench: embedjob against the plain Python
client on a server that pads, as infinity, TEI and sentence-transformers on a
CPU compute a batch: every input at the length of the batch's longest.

`embedjob simulate --capacity 1 --padded`: one worker, 5 ms a request plus
PER_1K_MS per 1000 padded tokens (the ledger's `padded_tokens`: each
request's inputs times its longest input's tokens). The corpus mixes short
and long records (8 to 120 words, seeded), in requests of BATCH. embedjob
runs with its defaults (`auto` concurrency, requests packed by length within
its look-ahead); the baseline (bench_openai.py, AsyncOpenAI with the SDK's
defaults) sends every request at once, in input order. REPS pairs in
alternating order; embedjob/python is the median of the pairs' ratios of
seconds, with their range, and the padded tokens each made the server
compute. The simulator does not sort what is queued, as infinity does: the
real server's figures are in docs/benchmark.md.
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import time

from benchlib import KEY, WORDS, SimulatorProcess, log, run_embedjob, write_job

BATCH = 32
RECORDS = 1024
PER_1K_MS = 40
REPS = 3


def mixed_corpus(work):
    path = os.path.join(work, f"corpus-mixed-{RECORDS}.jsonl")
    if not os.path.exists(path):
        rng = random.Random(7)
        with open(path + ".tmp", "w") as f:
            for i in range(RECORDS):
                text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 120)))
                f.write('{"id": "m%d", "text": "%s record %d"}\n' % (i, text, i))
        os.rename(path + ".tmp", path)
    return path


class PaddingSimulator(SimulatorProcess):
    def __init__(self, embedjob, work):
        args = [embedjob, "simulate", "--port", "0", "--model", "small=16", "--capacity", "1",
                "--padded", "--service-ms", "5", "--service-ms-per-1k-tokens", str(PER_1K_MS)]
        super().__init__(args, os.path.join(work, "simulator-padding.log"))

    def padded_tokens(self):
        return self.ledger()["padded_tokens"]


def run_case(args, kind, corpus_path):
    """One run against a simulator of its own: its seconds and the padded tokens."""
    sim = PaddingSimulator(args.embedjob, args.work)
    out_dir = os.path.join(args.work, "out", f"padding-{kind}")
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    try:
        if kind == "embedjob":
            job = write_job(args.work, "padding", corpus_path, base_url=sim.url, model="small",
                            concurrency='"auto"', batch=BATCH,
                            output=f'path = "{out_dir}/embeddings.parquet"\ninclude_text = false')
            summary, = run_embedjob(args.embedjob, job)
            if summary is None or summary["written"] != RECORDS:
                raise SystemExit(f"bench: embedjob did not write its {RECORDS} chunks")
            seconds = summary["elapsed_seconds"]
        else:
            env = {**os.environ, "EMBEDJOB_API_KEY": KEY, "EMBEDJOB_BASE_URL": sim.url}
            requests = -(-RECORDS // BATCH)
            done = subprocess.run([args.python, args.baseline, corpus_path,
                                   os.path.join(out_dir, "embeddings.parquet"), "small", "16",
                                   str(requests), str(BATCH)],
                                  env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"bench: the Python baseline failed: {done.stderr[-500:]}")
            seconds = json.loads(done.stdout)["seconds"]
        padded = sim.padded_tokens()
    finally:
        sim.stop()
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"seconds": seconds, "padded": padded}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--embedjob", required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    args.baseline = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_openai.py")
    os.makedirs(os.path.join(args.work, "out"), exist_ok=True)
    started = time.perf_counter()
    corpus_path = mixed_corpus(args.work)
    pairs = []
    for rep in range(REPS):
        runs = {}
        for kind in (("embedjob", "python") if rep % 2 == 0 else ("python", "embedjob")):
            runs[kind] = run_case(args, kind, corpus_path)
        pairs.append((runs["embedjob"], runs["python"]))
        log(f"pair {rep + 1}: embedjob {runs['embedjob']['seconds']:.2f}s, "
            f"python {runs['python']['seconds']:.2f}s", prefix="bench padding")
    pairs.sort(key=lambda p: p[0]["seconds"] / p[1]["seconds"])
    ours, theirs = pairs[len(pairs) // 2]
    ratios = [a["seconds"] / b["seconds"] for a, b in pairs]
    print(f"padding: {RECORDS} records of 8 to 120 words in requests of {BATCH}, one worker, "
          f"5 ms + {PER_1K_MS} ms per 1000 padded tokens")
    print(f"  embedjob {ours['seconds']:.2f}s, {ours['padded']:,} padded tokens; "
          f"python {theirs['seconds']:.2f}s, {theirs['padded']:,} padded tokens; "
          f"embedjob/python {ratios[len(ratios) // 2]:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f}), "
          f"the median of {REPS} pairs")
    log(f"done in {time.perf_counter() - started:.0f}s", prefix="bench padding")


if __name__ == "__main__":
    main()
