"""What every benchmark script shares: the log line, the seeded corpus, the
job file, the simulator in a process of its own, and running a job as one
process or as shards. The bench_*.py scripts import this module and no
other bench script."""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
import urllib.request

WORDS = ("vector index token batch embedding service parquet chunk document "
         "model request retry").split()
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# The quota and shards sections: their "minute" (quotas refill over this
# window), the key they send, and the records of their corpus (what the
# largest quota scenario sends).
WINDOW_MS = 2000
KEY = "bench-quota"
QUOTA_RECORDS = 6_400


def log(message, prefix="bench"):
    print(f"{prefix}: {message}", file=sys.stderr, flush=True)


def corpus(work, n):
    """The first n records of one seeded corpus: about 40 tokens a record, one chunk each."""
    path = os.path.join(work, f"corpus-{n}.jsonl")
    if not os.path.exists(path):
        rng = random.Random(42)
        with open(path + ".tmp", "w") as f:
            for i in range(n):
                text = " ".join(rng.choice(WORDS) for _ in range(36))
                f.write('{"id": "r%d", "text": "%s record %d"}\n' % (i, text, i))
        os.rename(path + ".tmp", path)
    return path


def write_job(work, name, corpus_path, *, base_url, model, concurrency, batch,
              output, backend_extra=""):
    """Writes job-<name>.toml in `work` and returns its path: the JSON Lines
    corpus, chunks of at most 256 tokens, an api backend. `output` is the
    [output] section's lines; `backend_extra`, more [backend] lines."""
    path = os.path.join(work, f"job-{name}.toml")
    with open(path, "w") as f:
        f.write(f"""name = "bench-{name}"
[source]
kind = "jsonl"
path = "{corpus_path}"
text_field = "text"
id_field = "id"
[chunking]
max_tokens = 256
overlap_tokens = 0
[backend]
kind = "api"
base_url = "{base_url}"
model = "{model}"
concurrency = {concurrency}
max_inputs_per_request = {batch}
{backend_extra}[output]
{output}
""")
    return path


class SimulatorProcess:
    """`embedjob simulate` with `args` in its own process, its stderr in
    `log`: the URL it serves, its ledger, and a stop."""

    def __init__(self, args, log):
        self.log = log
        with open(self.log, "w") as log_file:
            self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log_file, text=True)
        self.url = self.process.stdout.readline().strip()
        if not self.url.startswith("http"):
            raise SystemExit(f"bench: the simulator did not print its URL (see {self.log})")

    def ledger(self, texts=False):
        with urllib.request.urlopen(f"{self.url}/_ledger?texts={str(texts).lower()}") as reply:
            return json.load(reply)

    def stop(self):
        self.process.terminate()
        self.process.wait()


class Simulator(SimulatorProcess):
    """`embedjob simulate` in its own process, with its CPU time read from
    /proc. With `quota` = (requests, tokens, bill factor), it enforces quotas
    (none when both are None) over WINDOW_MS, as a refilling bucket or a
    sliding window (`window`), its reset telling when the oldest use leaves
    or when the window is whole again (`reset`), starting used up or whole
    (`start_empty`)."""

    def __init__(self, embedjob, work, latency_ms, quota=None, *, window="bucket", reset="oldest",
                 start_empty=True):
        # BENCH_SIMULATOR: another build's simulator, to compare builds of the client on one.
        simulator = os.environ.get("BENCH_SIMULATOR", embedjob)
        args = [simulator, "simulate", "--port", "0", "--latency-ms", str(latency_ms)]
        name = "simulator.log"
        if quota:
            requests, tokens, factor = quota
            args += ["--quota-window-ms", str(WINDOW_MS), "--quota-window", window,
                     "--bill-factor", str(factor)]
            if reset != "oldest":
                args += ["--quota-reset", reset]
            if start_empty:
                args.append("--quota-start-empty")
            if requests:
                args += ["--requests-per-minute", str(requests)]
            if tokens:
                args += ["--tokens-per-minute", str(tokens)]
            name = "simulator-quota.log"
        super().__init__(args, os.path.join(work, name))

    def check_alive(self):
        if self.process.poll() is not None:
            raise SystemExit(f"bench: the simulator stopped with status {self.process.returncode} "
                             f"(see {self.log})")

    def cpu_seconds(self):
        with open(f"/proc/{self.process.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # utime and stime are fields 14 and 15; fields[0] here is field 3.
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def run_embedjob(embedjob, job, shards=None):
    """Runs the job as one process, or as `shards` processes started at once
    (`--shard i/N`); returns each run's summary, None for a run that failed."""
    return run_commands([[embedjob, "run", job, "--json", "--quiet"]
                         + (["--shard", f"{i}/{shards}"] if shards else [])
                         for i in range(shards or 1)])


def run_jobs(embedjob, jobs, stagger=0.0):
    """Runs independent jobs (separate job files) on the one key, each
    started `stagger` seconds after the one before (at once by default);
    returns each run's summary, None for a run that failed."""
    return run_commands([[embedjob, "run", job, "--json", "--quiet"] for job in jobs], stagger)


def run_commands(commands, stagger=0.0):
    env = {**os.environ, "EMBEDJOB_API_KEY": KEY}
    processes = []
    for i, command in enumerate(commands):
        if i and stagger > 0:
            time.sleep(stagger)
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    summaries = []
    for process in processes:
        out, err = process.communicate()
        if process.returncode != 0:
            log(f"an embedjob run exited {process.returncode}: {err.strip()[-500:]}")
        summaries.append(json.loads(out) if process.returncode == 0 else None)
    return summaries


def quota_use(ledger, requests, tokens, seconds):
    """Utilisation (the work admitted at the quota's rate over the time taken)
    and the share of requests refused."""
    window = WINDOW_MS / 1000
    ideal = 0.0
    if requests:
        ideal = max(ideal, ledger["billed_requests"] / (requests / window))
    if tokens:
        ideal = max(ideal, ledger["prompt_tokens"] / (tokens / window))
    received = ledger["embedding_requests"]
    refused = sum(ledger.get("refused", {}).values())
    return ideal / seconds, refused / received if received else 0.0


def section_main(section):
    """The command line of a section script: `--embedjob BIN --work DIR`;
    runs `section(embedjob, work, corpus_path)` on the quota corpus."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--embedjob", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    os.makedirs(os.path.join(args.work, "out"), exist_ok=True)
    section(args.embedjob, args.work, corpus(args.work, QUOTA_RECORDS))


def job_file(work, name, corpus_path, url, limits, *, concurrency, batch, sharded=False):
    """Writes a job on the corpus with `limits` as [backend] lines, its output
    alone in out/<name>/ (emptied): a file, or for `--shard` runs a directory.
    Returns the job's and the output's paths."""
    out_dir = os.path.join(work, "out", name)
    shutil.rmtree(out_dir, ignore_errors=True)
    out = os.path.join(out_dir, "shards" if sharded else "embeddings.parquet")
    extra = "".join(f"{key} = {value}\n" for key, value in limits.items())
    path = write_job(work, name, corpus_path, base_url=url, model="svc-embed-1",
                     concurrency=concurrency, batch=batch, backend_extra=extra,
                     output=f'path = "{out}"\ninclude_text = false')
    return path, out
