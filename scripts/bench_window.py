"""Chunks against a server that counts as all-MiniLM-L6-v2 does and reads
only the first 256 of its tokens of each input, silently, and lists no
window (`embedjob simulate --window 256:truncate:wordpiece --bare-listing
--no-model-route`): for each corpus and each build, a job with the default
chunking (counted in `cl100k_base`), whose probe finds the window. Prints
the window it learned (`tokens`, and `wordpieces` where the build cuts to
them), the chunks stored, how many of them hold more than 256 tokens as the
model's own `tokenizer.json` counts them (special tokens included: those
the server read only in part), the longest, the requests and the seconds
the run took.

A corpus is NAME=DIR: the files under DIR, read as files; with NAME ending
in `-stdin`, the same files as JSON Lines records piped into the run (the
probe then has none of the input to measure on). A build is NAME=PATH of an
embedjob binary; each corpus runs against each build in turn, on a
simulator of that build.

It needs pyarrow and tokenizers: the Python `scripts/setup-python` makes
(`.cache/venv`) has both.

    .cache/venv/bin/python scripts/bench_window.py \\
        --build before=/tmp/embedjob-before --build after=target/debug/embedjob \\
        --corpus readmes=/tmp/readmes --corpus readmes-stdin=/tmp/readmes \\
        --tokenizer .cache/models/all-MiniLM-L6-v2/tokenizer.json
"""

import argparse
import json
import os
import socket
import subprocess
import tempfile
import time

import pyarrow.parquet as pq
from tokenizers import Tokenizer


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job_file(out_dir, port, corpus_dir, piped):
    if piped:
        source = 'kind = "jsonl"\npath = "-"\ntext_field = "text"\nid_field = "id"'
    else:
        source = f'kind = "files"\npaths = ["{corpus_dir}"]'
    return f"""name = "window"
[source]
{source}
[backend]
kind = "api"
base_url = "http://127.0.0.1:{port}"
api_path = "/v1"
model = "svc-embed-1"
[output]
path = "{out_dir}/out.parquet"
"""


def records(corpus_dir):
    lines = []
    for root, _, files in sorted(os.walk(corpus_dir)):
        for name in sorted(files):
            path = os.path.join(root, name)
            with open(path, errors="replace") as f:
                record = {"id": os.path.relpath(path, corpus_dir), "text": f.read()}
            lines.append(json.dumps(record) + "\n")
    return "".join(lines)


def run(build, corpus, corpus_dir, tokenizer):
    piped = corpus.endswith("-stdin")
    port = free_port()
    sim = subprocess.Popen(
        [build, "simulate", "--port", str(port), "--window", "256:truncate:wordpiece",
         "--bare-listing", "--no-model-route"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        sim.stdout.readline()  # the base URL, once it listens
        with tempfile.TemporaryDirectory() as out_dir:
            job = os.path.join(out_dir, "job.toml")
            with open(job, "w") as f:
                f.write(job_file(out_dir, port, corpus_dir, piped))
            started = time.monotonic()
            done = subprocess.run(
                [build, "run", job, "--json"], capture_output=True, text=True,
                input=records(corpus_dir) if piped else None,
                env=dict(os.environ, EMBEDJOB_API_KEY="unused-local-key"))
            seconds = time.monotonic() - started
            if done.returncode != 0:
                return f"failed (exit {done.returncode}): {done.stderr[-400:]}"
            summary = json.loads(done.stdout)
            texts = pq.read_table(os.path.join(out_dir, "out.parquet"),
                                  columns=["text"]).column("text").to_pylist()
    finally:
        sim.kill()
        sim.wait()
    counts = [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=True)]
    window = summary["learned_limits"].get("context_window") or {}
    return (f"window {window.get('tokens')}, word pieces {window.get('wordpieces')}: "
            f"{len(texts)} chunks, {sum(c > 256 for c in counts)} over 256 "
            f"(longest {max(counts)}), {summary['requests']} requests, {seconds:.1f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", action="append", required=True, help="NAME=PATH")
    parser.add_argument("--corpus", action="append", required=True, help="NAME=DIR")
    parser.add_argument("--tokenizer", required=True, help="the model's tokenizer.json")
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(args.tokenizer)
    tokenizer.no_truncation()
    tokenizer.no_padding()
    builds = [b.split("=", 1) for b in args.build]
    for corpus, corpus_dir in (c.split("=", 1) for c in args.corpus):
        for name, build in builds:
            print(f"{corpus:14} {name:8} {run(build, corpus, corpus_dir, tokenizer)}", flush=True)


if __name__ == "__main__":
    main()
