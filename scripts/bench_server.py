"""A job against a real server you run, through a logging proxy that counts
what the server computed: embedjob with `concurrency = "auto"` (the
default), the same with the window its probe found known (read from that
run's summary, as a later run does, so it does not probe), embedjob with a
fixed concurrency (8 by default, the old default), and the plain client
(`scripts/bench_openai.py`: `AsyncOpenAI` with its defaults, 8 in flight,
128 texts a request) on the distinct texts of embedjob's first output, in
turns, several rounds. It needs pyarrow and
openai: the benchmark's virtualenv (`.cache/bench-venv`, made by
`scripts/bench`) has both.

The proxy listens on 127.0.0.1 and forwards each request to the server, and
the server's headers back (a gateway's `x-ratelimit-*` pace embedjob). It
waits for the server's answer even when the client has hung up (a request a
client gives up on at its timeout is still computed, and on a paid gateway
billed), and logs every answer: its inputs, the tokens the server reported,
and whether the client was still there to take it. "not taken" is what the
server computed for nobody: texts a client must send again, and pays for
twice. Between cases the script waits until the server has answered every
request the proxy forwarded. Each case's row also gives where its time went
besides the server's computing, in seconds: from its start to its first
embeddings request ("to first": the model lookup, the chunking the first
request waits for, a Python client's start), from then to its last answer
while the server had none of its requests ("idle": the wait between the
window probe and the first request of the job, gaps between answers and
requests), from the last answer to its end ("after last": the output's
commit, a Python client's writing), and their sum ("client"): what the
client added to the server's time, which does not vary with the server's
speed as the wall time does.

    .cache/bench-venv/bin/python scripts/bench_server.py --embedjob target/release/embedjob \\
        --server http://127.0.0.1:8765 --model all-MiniLM-L6-v2 \\
        --corpus 'docs/*.md' --work .cache/bench-server

The key sent is EMBEDJOB_API_KEY's, or a dummy one where it is unset (a
server on 127.0.0.1 takes any); each case's summary and stderr are kept
under --work.
"""

import argparse
import glob
import http.client
import http.server
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
KEY = "bench-server-key"


class Ledger:
    """What the proxy saw: one record an answer, and the requests still at the server."""

    def __init__(self):
        self.lock = threading.Lock()
        self.records = []
        self.open = 0

    def take(self):
        with self.lock:
            records, self.records = self.records, []
        return records

    def settled(self):
        with self.lock:
            return self.open == 0


def proxy(upstream, ledger):
    """Starts the logging proxy on a free port of 127.0.0.1; returns its URL."""
    target = urllib.parse.urlsplit(upstream)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def forward(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            inputs = None
            try:
                sent = json.loads(body) if body else None
                if isinstance(sent, dict) and "input" in sent:
                    inputs = len(sent["input"]) if isinstance(sent["input"], list) else 1
            except ValueError:
                pass
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in ("host", "connection", "content-length")}
            with ledger.lock:
                ledger.open += 1
            sent = time.monotonic()
            try:
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=3600)
                conn.request(self.command, target.path.rstrip("/") + self.path, body, headers)
                answer = conn.getresponse()
                status, reply = answer.status, answer.read()
                # Every header but the connection's own: a gateway's
                # x-ratelimit-* and Retry-After pace the client.
                passed = [(k, v) for k, v in answer.getheaders()
                          if k.lower() not in ("connection", "content-length", "server", "date",
                                               "transfer-encoding", "keep-alive")]
                conn.close()
                answered = time.monotonic()
            finally:
                with ledger.lock:
                    ledger.open -= 1
            taken = not self.client_left()
            tokens = None
            try:
                tokens = (json.loads(reply).get("usage") or {}).get("prompt_tokens")
            except (ValueError, AttributeError):
                pass
            with ledger.lock:
                ledger.records.append({"path": self.path, "inputs": inputs, "tokens": tokens,
                                       "status": status, "taken": taken,
                                       "sent": sent, "answered": answered})
            try:
                self.send_response(status)
                for name, value in passed:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)
            except OSError:
                pass

        def client_left(self):
            """Whether the client closed its connection while the server computed."""
            sock = self.connection
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return False
            try:
                return sock.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                return True

        do_GET = do_POST = do_DELETE = forward

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def timeline(records, started, ended):
    """Where a case's time went besides the server's computing, in seconds:
    from its start to its first embeddings request, from then to its last
    answer while the server had none of its requests, and from that answer
    to the case's end."""
    embeddings = [r for r in records if r["path"].endswith("/embeddings")]
    if not embeddings:
        return None
    first = min(r["sent"] for r in embeddings)
    idle, reached = 0.0, first
    for r in sorted(embeddings, key=lambda r: r["sent"]):
        idle += max(0.0, r["sent"] - reached)
        reached = max(reached, r["answered"])
    return {"to first": first - started, "idle": idle, "after last": ended - reached}


def job(work, name, corpus, url, model, concurrency):
    path = os.path.join(work, f"{name}.toml")
    with open(path, "w") as f:
        f.write(f"""name = "{name}"
[source]
kind = "files"
paths = {json.dumps([os.path.abspath(p) for p in corpus])}
[backend]
kind = "api"
base_url = "{url}"
model = "{model}"
concurrency = {concurrency}
[output]
path = "out/{name}.parquet"
include_text = true
""")
    return path


def plain_corpus(work, output):
    """The distinct texts of an embedjob output, as the plain client's JSON Lines."""
    path = os.path.join(work, "plain.jsonl")
    seen = set()
    with open(path, "w") as f:
        for row in pq.read_table(output, columns=["text"]).to_pylist():
            if row["text"] not in seen:
                seen.add(row["text"])
                f.write(json.dumps({"id": str(len(seen)), "text": row["text"]}) + "\n")
    return path, len(seen)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--embedjob", required=True)
    parser.add_argument("--server", required=True, help="the server's base URL (without /v1)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--python", default=sys.executable,
                        help="the plain client's Python, with openai and pyarrow (default: this one)")
    parser.add_argument("--corpus", required=True, help="a glob of text files")
    parser.add_argument("--work", required=True)
    parser.add_argument("--fixed", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    # The cases run in --work: the programs' paths must not depend on it.
    args.embedjob, args.python = os.path.abspath(args.embedjob), os.path.abspath(args.python)

    corpus = sorted(glob.glob(args.corpus))
    if not corpus:
        sys.exit(f"bench_server: no file matches {args.corpus}")
    work = os.path.abspath(args.work)
    os.makedirs(work, exist_ok=True)
    ledger = Ledger()
    url = proxy(args.server, ledger)
    jobs = {"auto": job(work, "auto", corpus, url, args.model, '"auto"'),
            "auto, window known": job(work, "known", corpus, url, args.model, '"auto"'),
            f"fixed {args.fixed}": job(work, "fixed", corpus, url, args.model, args.fixed)}
    # The summary of the round's run with auto, which records the window its
    # probe found: the run with the window known reads it from there, as a
    # run after one that kept nothing does, and does not probe.
    known = os.path.join(work, "auto.summary.json")
    key = os.environ.get("EMBEDJOB_API_KEY") or KEY
    env = {**os.environ, "EMBEDJOB_API_KEY": key, "EMBEDJOB_BASE_URL": url}
    plain = None
    rows = []
    for round_ in range(1, args.rounds + 1):
        for case in [*jobs, "plain client"]:
            shutil.rmtree(os.path.join(work, "out"), ignore_errors=True)
            os.makedirs(os.path.join(work, "out"))
            stem = os.path.join(work, f"{case.replace(' ', '-')}-{round_}")
            if case == "auto, window known":
                if not os.path.exists(known):
                    sys.exit(f"bench_server: embedjob's run with auto left no summary ({known})")
                shutil.copy(known, os.path.join(work, "out", "known.parquet.summary.json"))
            if case == "plain client":
                if plain is None:
                    sys.exit(f"bench_server: embedjob's run with auto failed (see {work}/auto-*.err): "
                             "the plain client has no texts to send")
                command = [args.python, os.path.join(HERE, "bench_openai.py"), plain[0],
                           os.path.join(work, "out", "plain.parquet"), args.model,
                           str(plain[2]), "8", "128"]
            else:
                command = [args.embedjob, "run", jobs[case], "--json"]
            started = time.monotonic()
            with open(stem + ".json", "w") as out, open(stem + ".err", "w") as err:
                code = subprocess.run(command, stdout=out, stderr=err, env=env, cwd=work).returncode
            ended = time.monotonic()
            wall = ended - started
            while not ledger.settled():
                time.sleep(0.5)
            records = ledger.take()
            answers = [r for r in records if r["path"].endswith("/embeddings")]
            spent = timeline(records, started, ended) or {}
            summary = {}
            if case != "plain client":
                try:
                    with open(stem + ".json") as f:
                        summary = json.loads(f.read() or "{}")
                except ValueError:
                    summary = {}
                if case == "auto" and code == 0:
                    shutil.copy(os.path.join(work, "out", "auto.parquet.summary.json"), known)
                    if plain is None:
                        plain = (*plain_corpus(work, os.path.join(work, "out", "auto.parquet")),
                                 summary["dimensions"])
            left = [r for r in answers if not r["taken"]]
            rows.append({
                "round": round_, "case": case, "exit": code, "wall": wall,
                "requests": len(answers),
                "inputs": sum(r["inputs"] or 0 for r in answers),
                "tokens": sum(r["tokens"] or 0 for r in answers),
                "not taken": f"{len(left)} ({sum(r['inputs'] or 0 for r in left)} texts, "
                             f"{sum(r['tokens'] or 0 for r in left):,} tokens)",
                **{k: f"{spent[k]:.2f}" if spent else "-" for k in ["to first", "idle", "after last"]},
                "client": f"{sum(spent.values()):.2f}" if spent else "-",
                "timeouts": summary.get("timeouts", "-"),
                "settled": (summary.get("concurrency") or {}).get("settled", "-"),
            })
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"{len(corpus)} files; the plain client sends the {plain[1] if plain else '?'} "
          f"distinct texts of embedjob's output")
    head = ["round", "case", "exit", "wall", "to first", "idle", "after last", "client", "requests",
            "inputs", "tokens", "not taken", "timeouts", "settled"]
    print(" | ".join(head))
    for r in rows:
        print(" | ".join(f"{r[h]:.1f}" if h == "wall" else str(r[h]) for h in head))


if __name__ == "__main__":
    main()
