"""The quota section of scripts/bench: runs against a service that enforces
quotas as OpenAI documents them (`embedjob simulate --requests-per-minute /
--tokens-per-minute`, refused requests counting against the request quota,
x-ratelimit-* headers on every response), as a refilling bucket and as a
sliding window, in a "minute" of a few seconds so that the section takes
minutes.

Scenarios: a token quota (the service counting 1.25 tokens for each of the
client's), a request quota, and both; on a sliding window also the token and
the request quota ten times larger ("fine": a request is 0.8% or 0.5% of
the window, not 8% or 5%, as on a quota of OpenAI's sizes), and a window
whose reset tells when it is whole again rather than when its oldest use
leaves ("sliding whole", OpenAI's wording of the reset). Cases: embedjob alone with no limits
configured; with `requests_per_minute` / `tokens_per_minute` set to the
quota; the OpenAI cookbook's parallel processor (api_request_parallel_
processor.py) reimplemented here as the baseline, at the quota and at the 75%
of it its documentation recommends; the job run as four processes on one key
(`--shard i/4`); four independent jobs (four job files on four quarters of
the corpus, four outputs) started at once on one key; on a sliding window
the same four jobs told the window's length (`backend.quota_window_seconds`,
60 for a quota per minute: here the window the minute stands for).

The service's quota starts whole, as a real one does, and so do the
cookbook's buckets. utilisation is measured from the end of the service's
first window (a window after the first request reached it), in the steady
state: the useful work done from then to the end of the run over the
quota's rate times that time. Useful work is the texts
stored (each counted once, however often it was billed), in the quota's
units: the service's tokens of those texts, or the texts / the texts a
request holds. The first window is left out because the two kinds of quota
differ there (a whole bucket gives a window's allowance on top of the rate;
a sliding window, that allowance once per window), while from then on the
quota's rate is what either sustains. refused = 429s / requests received;
billed twice = texts the service billed more than once.
"""

import asyncio
import concurrent.futures
import hashlib
import http.client
import json
import os
import threading
import time
import urllib.parse

from benchlib import (KEY, QUOTA_RECORDS, WINDOW_MS, Simulator, corpus, job_file, log,
                      run_embedjob, run_jobs, section_main)

# The simulator's latency; BENCH_QUOTA_LATENCY_MS=100 answers as slowly as a
# hosted service's embeddings often do.
LATENCY_MS = int(os.environ.get("BENCH_QUOTA_LATENCY_MS", "20"))
# The build whose `embedjob simulate` enforces the quotas: the one measured,
# unless BENCH_QUOTA_SIMULATOR names another (two builds of the client
# measured against one simulator).
SIMULATOR = os.environ.get("BENCH_QUOTA_SIMULATOR")
# Four jobs start this many milliseconds apart (BENCH_QUOTA_STAGGER_MS; at
# once by default), as cron jobs and notebooks on one key do.
STAGGER_MS = int(os.environ.get("BENCH_QUOTA_STAGGER_MS", "0"))
# embedjob's concurrency: its default, "auto" (BENCH_QUOTA_CONCURRENCY=16 runs a fixed window).
CONCURRENCY = os.environ.get("BENCH_QUOTA_CONCURRENCY", '"auto"')
QUOTE = '"'
BATCH = 32
# The cookbook's pause after a 429, 15 s of a minute, scaled to the window.
COOKBOOK_PAUSE = 15.0 * WINDOW_MS / 60_000
COOKBOOK_ATTEMPTS = 5

# The cookbook's documentation: "leave headroom by setting this to 50% or 75% of your limit".
COOKBOOK_HEADROOM = 0.75

# name: (requests per window, tokens per window, bill factor, records)
SCENARIOS = {
    "tokens": (None, 20_000, 1.25, 4_000),
    "requests": (20, None, 1.0, 6_400),
    "both": (20, 32_000, 1.25, 6_400),
    "tokens fine": (None, 200_000, 1.25, 40_000),
    "requests fine": (200, None, 1.0, 64_000),
}

# (window, scenario, case) in the order run; BENCH_QUOTA_ONLY=word,word runs
# only the rows whose name contains every word.
CASES = [(window, scenario, case)
         for window, scenarios, cases in (
             ("bucket", ("tokens", "requests"),
              ("alone", "cookbook", "cookbook 75%", "four shards",
               "four jobs")),
             ("sliding", ("tokens", "requests"),
              ("alone", "cookbook", "cookbook 75%", "four jobs", "four jobs told")),
             ("sliding", ("tokens fine", "requests fine"),
              ("alone", "cookbook", "four jobs", "four jobs told")),
             ("sliding whole", ("tokens", "requests", "tokens fine", "requests fine"),
              ("alone", "four jobs", "four jobs told")))
         for scenario in scenarios for case in cases]


def token_counts(embedjob, work, corpus_path, records, factor):
    """Each record's tokens as the service bills them (cl100k times its bill
    factor), cached: the cookbook counts as the service does. Asked of a
    simulator without a quota."""
    cache = os.path.join(work, f"quota-tokens-{records}-{factor}.json")
    if os.path.exists(cache):
        with open(cache) as f:
            return json.load(f)
    sim = Simulator(embedjob, work, 0, (None, None, factor))
    try:
        host = urllib.parse.urlparse(sim.url)
        conn = http.client.HTTPConnection(host.hostname, host.port)
        counts = []
        with open(corpus_path) as f:
            for _, line in zip(range(records), f):
                body = json.dumps({"model": "svc-embed-1", "input": json.loads(line)["text"],
                                   "encoding_format": "base64"})
                conn.request("POST", "/v1/embeddings", body,
                             {"Authorization": "Bearer count", "Content-Type": "application/json"})
                counts.append(json.loads(conn.getresponse().read())["usage"]["prompt_tokens"])
    finally:
        sim.stop()
    with open(cache, "w") as f:
        json.dump(counts, f)
    return counts


class Cookbook:
    """The algorithm of the OpenAI cookbook's api_request_parallel_processor.py:
    request and token buckets that refill at the quota's rate,
    a request sent when both cover it (tokens by tiktoken's count), a pause of
    15 s (scaled) after the last rate-limit error, and at most 5 attempts."""

    def __init__(self, url, requests_per_window, tokens_per_window, headroom=1.0):
        parsed = urllib.parse.urlparse(url)
        self.host, self.port = parsed.hostname, parsed.port
        window = WINDOW_MS / 1000
        # The cookbook needs both limits; an unset one is far above the work.
        self.max_requests = requests_per_window * headroom if requests_per_window else 1e9
        self.max_tokens = tokens_per_window * headroom if tokens_per_window else 1e12
        self.request_rate = self.max_requests / window
        self.token_rate = self.max_tokens / window
        self.local = threading.local()
        self.last_rate_limit_error = 0.0
        self.failed = 0

    def post(self, texts):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection(self.host, self.port)
        body = json.dumps({"model": "svc-embed-1", "input": texts, "encoding_format": "base64"})
        conn.request("POST", "/v1/embeddings", body,
                     {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        reply = conn.getresponse()
        data = reply.read()
        return reply.status, data

    async def call(self, request, retry_queue):
        status, data = await asyncio.get_running_loop().run_in_executor(None, self.post, request["texts"])
        if status == 200:
            return
        if b"Rate limit" in data or status == 429:
            self.last_rate_limit_error = time.monotonic()
        request["attempts_left"] -= 1
        if request["attempts_left"] > 0:
            retry_queue.put_nowait(request)
        else:
            self.failed += 1

    async def run(self, requests):
        loop = asyncio.get_running_loop()
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=256))
        retry_queue = asyncio.Queue()
        pending = iter(requests)
        tasks = set()
        # The cookbook starts with full buckets, as the service's quota does.
        available_requests, available_tokens = self.max_requests, self.max_tokens
        last_update = time.monotonic()
        next_request = None
        exhausted = False
        while True:
            if next_request is None:
                if not retry_queue.empty():
                    next_request = retry_queue.get_nowait()
                elif not exhausted:
                    next_request = next(pending, None)
                    exhausted = next_request is None
            now = time.monotonic()
            elapsed = now - last_update
            available_requests = min(available_requests + self.request_rate * elapsed, self.max_requests)
            available_tokens = min(available_tokens + self.token_rate * elapsed, self.max_tokens)
            last_update = now
            if next_request is not None and available_requests >= 1 \
                    and available_tokens >= next_request["tokens"]:
                available_requests -= 1
                available_tokens -= next_request["tokens"]
                task = asyncio.create_task(self.call(next_request, retry_queue))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                next_request = None
            if exhausted and next_request is None and not tasks and retry_queue.empty():
                break
            await asyncio.sleep(0.001)
            since_error = time.monotonic() - self.last_rate_limit_error
            if since_error < COOKBOOK_PAUSE:
                await asyncio.sleep(COOKBOOK_PAUSE - since_error)


def cookbook_requests(corpus_path, records, counts):
    with open(corpus_path) as f:
        texts = [json.loads(line)["text"] for _, line in zip(range(records), f)]
    return [{"texts": texts[i:i + BATCH], "tokens": sum(counts[i:i + BATCH]),
             "attempts_left": COOKBOOK_ATTEMPTS} for i in range(0, records, BATCH)]


def run_case(embedjob, work, window, scenario, case, corpus_path):
    requests, tokens, factor, records = SCENARIOS[scenario]
    if records > QUOTA_RECORDS:
        # The same seeded corpus, longer: its first records are the same.
        corpus_path = corpus(work, records)
    counts = token_counts(embedjob, work, corpus_path, records, factor)
    kind, _, reset = window.partition(" ")
    sim = Simulator(SIMULATOR or embedjob, work, LATENCY_MS, (requests, tokens, factor),
                    window=kind, reset="whole" if reset == "whole" else "oldest",
                    start_empty=False)
    name = f"quota-{window}-{scenario}".replace(" ", "-")
    try:
        started = time.perf_counter()
        first_window = FirstWindow(sim)
        if case.startswith("cookbook"):
            headroom = COOKBOOK_HEADROOM if case.endswith("%") else 1.0
            cookbook = Cookbook(sim.url, requests, tokens, headroom)
            asyncio.run(cookbook.run(cookbook_requests(corpus_path, records, counts)))
            failed, processes = (1 if cookbook.failed else 0), 1
        else:
            limits = {}
            if case == "limits configured":
                per_minute = 60_000 / WINDOW_MS
                if requests:
                    limits["requests_per_minute"] = int(requests * per_minute)
                if tokens:
                    limits["tokens_per_minute"] = int(tokens * per_minute)
            if case == "four jobs told":
                # Each job says how long a use stays in the window (what a
                # quota per minute says of itself): the window here.
                limits["quota_window_seconds"] = WINDOW_MS / 1000
            records_path = head(work, corpus_path, records)
            if case.startswith("four jobs"):
                jobs = [job_file(work, f"{name}-{i}", part, sim.url, limits,
                                 concurrency=CONCURRENCY, batch=BATCH)[0]
                        for i, part in enumerate(quarters(work, records_path))]
                summaries = run_jobs(embedjob, jobs, STAGGER_MS / 1000)
            else:
                shards = 4 if case == "four shards" else None
                job, _ = job_file(work, name, records_path, sim.url, limits, concurrency=CONCURRENCY,
                                  batch=BATCH, sharded=bool(shards))
                summaries = run_embedjob(embedjob, job, shards)
            failed, processes = summaries.count(None), len(summaries)
        ended = time.perf_counter()
        actual = ended - started
        ledger = sim.ledger(texts=True)
        at_first_window, first_window_ended = first_window.result()
    finally:
        sim.stop()
    use = useful_work(ledger, corpus_path, records, counts)
    before = useful_work(at_first_window, corpus_path, records, counts)
    utilisation = quota_utilisation(use, before, requests, tokens, ended - first_window_ended)
    received = ledger["embedding_requests"]
    refused = sum(ledger.get("refused", {}).values()) / received if received else 0.0
    row = {
        "window": window, "scenario": scenario, "case": case, "utilisation": utilisation,
        "refused": refused, "requests": received, "longest": ledger.get("longest_refusal_run", 0),
        "stored": use["texts"], "twice": use["twice"], "failed": failed, "processes": processes,
        "seconds": actual,
    }
    log(f"quota {window} {scenario} / {case}: {utilisation:.1%} of the quota, {refused:.1%} of "
        f"{received} refused, {use['texts']} texts stored, {use['twice']} billed twice, "
        f"{failed} failed, {actual:.1f}s")
    return row


def useful_work(ledger, corpus_path, records, counts):
    """The texts the service billed, each once, and their billed tokens; and
    the texts it billed more than once."""
    billed = ledger["texts"]
    texts, useful_tokens = 0, 0
    with open(corpus_path) as f:
        for (_, line), count in zip(zip(range(records), f), counts):
            digest = hashlib.sha256(json.loads(line)["text"].encode()).hexdigest()
            if digest in billed:
                texts += 1
                useful_tokens += count
    twice = sum(1 for n in billed.values() if n > 1)
    return {"texts": texts, "tokens": useful_tokens, "twice": twice}


class FirstWindow:
    """The service's ledger as its first window ends, a window after the
    first request reached it (not after the clients started: they take a
    while to read the corpus), read while the run goes on; and when that was."""

    def __init__(self, sim):
        self.ledger = None
        self.ended = None
        self.thread = threading.Thread(target=self.read, args=(sim,), daemon=True)
        self.thread.start()

    def read(self, sim):
        deadline = time.perf_counter() + 120
        while sim.ledger()["embedding_requests"] == 0 and time.perf_counter() < deadline:
            time.sleep(0.005)
        self.ended = time.perf_counter() + WINDOW_MS / 1000
        time.sleep(WINDOW_MS / 1000)
        self.ledger = sim.ledger(texts=True)

    def result(self):
        self.thread.join()
        return self.ledger, self.ended


def quota_utilisation(use, before, requests, tokens, seconds):
    """The useful work done after the first window over the quota's rate
    times the time it took, for the quota that binds (the larger figure)."""
    window = WINDOW_MS / 1000
    figures = []
    if requests:
        figures.append((use["texts"] - before["texts"]) / BATCH / (requests / window * seconds))
    if tokens:
        figures.append((use["tokens"] - before["tokens"]) / (tokens / window * seconds))
    return max(figures)


def quarters(work, corpus):
    """The corpus in four files of a quarter each, for four independent jobs."""
    with open(corpus) as f:
        lines = f.readlines()
    size = -(-len(lines) // 4)
    paths = []
    for i in range(4):
        path = f"{corpus}.part{i}"
        with open(path, "w") as f:
            f.writelines(lines[i * size:(i + 1) * size])
        paths.append(path)
    return paths


def head(work, corpus_path, records):
    """The first `records` records of the corpus, in a file of their own."""
    path = os.path.join(work, f"quota-{records}.jsonl")
    with open(corpus_path) as f:
        lines = [next(f) for _ in range(records)]
    with open(path, "w") as f:
        f.writelines(lines)
    return path


def quota_section(embedjob, work, corpus_path):
    """Runs every case of every scenario and prints one table."""
    only = [w for w in os.environ.get("BENCH_QUOTA_ONLY", "").split(",") if w]
    rows = []
    for window, scenario, case in CASES:
        label = f"{window} {scenario} {case}"
        if all(word in label for word in only):
            rows.append(run_case(embedjob, work, window, scenario, case, corpus_path))
    print_quota_table(rows)
    twice = [r for r in rows if r["twice"]]
    if twice:
        raise SystemExit(f"bench: texts billed twice in {len(twice)} case(s)")
    return rows


def print_quota_table(rows):
    header = ("window", "scenario", "case", "utilisation", "refused", "requests",
              "longest refusal run", "texts stored", "billed twice", "runs failed", "seconds")
    lines = [(r["window"], r["scenario"], r["case"], f"{r['utilisation']:.1%}",
              f"{r['refused']:.1%}", str(r["requests"]), str(r["longest"]), f"{r['stored']:,}",
              str(r["twice"]), f"{r['failed']} of {r['processes']}", f"{r['seconds']:.1f}")
             for r in rows]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def fmt(cells):
        return "  ".join(c.ljust(w) if i < 3 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))

    print()
    print(f"Quotas: a window of {WINDOW_MS} ms standing for the minute, {LATENCY_MS} ms latency,")
    if STAGGER_MS:
        print(f"four jobs started {STAGGER_MS} ms apart,")
    print(f"concurrency {CONCURRENCY.strip(QUOTE)}, {BATCH} chunks a request; the token scenarios bill 1.25x the")
    print("client's count. Quotas per window: " + "; ".join(
        f"{name}: " + ", ".join(p for p in (f"{r} requests" if r else "", f"{t:,} tokens" if t else "") if p)
        for name, (r, t, _, _) in SCENARIOS.items()))
    print(fmt(header))
    print(fmt(["-" * w for w in widths]))
    for line in lines:
        print(fmt(line))
    print("utilisation: texts stored after the first window, in the quota's units, / (the quota's")
    print("rate x the seconds after it); the quota starts whole. refused: 429s / requests received.")


if __name__ == "__main__":
    section_main(quota_section)
