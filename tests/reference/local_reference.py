#!/usr/bin/env python3
"""Reference embeddings for the local backend, computed without any Rust code.

all-MiniLM-L6-v2 (int8 ONNX) run with Python onnxruntime and tokenizers, the way
sentence-transformers runs that model:

  * tokenizer.json from the model folder, truncated to 256 tokens (the file itself
    says 128; sentence-transformers' max_seq_length for this model is 256) and
    padded to the longest sequence of each batch;
  * inputs input_ids, attention_mask, and token_type_ids when the model has it;
  * mean pooling of last_hidden_state over the attention mask, then L2
    normalisation.

Modes:
  --sentences FILE --out OUT.json
      Embeds each line of FILE (in batches of --batch-size, in order) and writes
      {"model", "dimensions", "vectors", ...} to OUT.json.
  --bench FILE --batch-size 32 --threads N
      Times tokenisation + inference + pooling over the lines of FILE in input
      order, after one untimed warm-up batch, with intra_op_num_threads = N and
      inter_op_num_threads = 1. Prints one JSON object on stdout.

The model folder is --model-dir, else $EMBEDJOB_MODEL_DIR, else
<cache>/models/all-MiniLM-L6-v2 where <cache> is $EMBEDJOB_CACHE_DIR or .cache/
at the repository root (filled by scripts/setup-local). Run it with the venv
from scripts/setup-python.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tokenizers
from tokenizers import Tokenizer

MODEL_ID = "all-MiniLM-L6-v2"
MAX_LENGTH = 256
REPO_ROOT = Path(__file__).resolve().parents[2]


def default_model_dir() -> Path:
    if os.environ.get("EMBEDJOB_MODEL_DIR"):
        return Path(os.environ["EMBEDJOB_MODEL_DIR"])
    cache = Path(os.environ.get("EMBEDJOB_CACHE_DIR") or REPO_ROOT / ".cache")
    return cache / "models" / MODEL_ID


class Embedder:
    def __init__(self, model_dir: Path, threads: int) -> None:
        for name in ("model.onnx", "tokenizer.json", "config.json", "special_tokens_map.json"):
            if not (model_dir / name).is_file():
                sys.exit(f"local_reference: {model_dir / name} is missing; run scripts/setup-local")

        config = json.loads((model_dir / "config.json").read_text())
        special = json.loads((model_dir / "special_tokens_map.json").read_text())
        pad_token = special.get("pad_token", "[PAD]")
        if isinstance(pad_token, dict):
            pad_token = pad_token["content"]

        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        pad_id = self.tokenizer.token_to_id(pad_token)
        if pad_id is None or pad_id != config.get("pad_token_id", pad_id):
            sys.exit(f"local_reference: pad token {pad_token!r} does not match config.json")
        self.tokenizer.enable_truncation(max_length=MAX_LENGTH)
        # length=None: pad to the longest sequence of the batch.
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token, pad_type_id=0)

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(
            str(model_dir / "model.onnx"), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self.input_names = {i.name for i in self.session.get_inputs()}
        missing = {"input_ids", "attention_mask"} - self.input_names
        if missing:
            sys.exit(f"local_reference: model lacks inputs {sorted(missing)}")
        outputs = [o.name for o in self.session.get_outputs()]
        self.output_name = "last_hidden_state" if "last_hidden_state" in outputs else outputs[0]
        self.dimensions = int(config["hidden_size"])

    def embed(self, texts: list[str]) -> np.ndarray:
        """float32 array of shape (len(texts), dimensions), rows of unit length."""
        encodings = self.tokenizer.encode_batch(texts)
        input_ids = np.array([e.ids for e in encodings], dtype=np.int64)
        attention_mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feed = {"input_ids": input_ids, "attention_mask": attention_mask}
        if "token_type_ids" in self.input_names:
            feed["token_type_ids"] = np.array([e.type_ids for e in encodings], dtype=np.int64)
        (hidden,) = self.session.run([self.output_name], feed)
        if hidden.ndim != 3 or hidden.shape[2] != self.dimensions:
            sys.exit(f"local_reference: unexpected output shape {hidden.shape}")
        # Mean over real tokens (accumulated in float64), then L2 normalisation.
        mask = attention_mask.astype(np.float64)[:, :, None]
        summed = (hidden.astype(np.float64) * mask).sum(axis=1)
        pooled = summed / np.clip(mask.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)


def read_lines(path: str) -> list[str]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    if not lines:
        sys.exit(f"local_reference: {path} has no lines")
    return lines


def batches(items: list[str], size: int):
    for start in range(0, len(items), size):
        yield items[start : start + size]


def run_sentences(args: argparse.Namespace) -> None:
    model_dir = Path(args.model_dir) if args.model_dir else default_model_dir()
    embedder = Embedder(model_dir, args.threads)
    sentences = read_lines(args.sentences)
    vectors = np.concatenate([embedder.embed(b) for b in batches(sentences, args.batch_size)])
    if not np.isfinite(vectors).all():
        sys.exit("local_reference: non-finite value in the embeddings")
    # Shortest decimal that round-trips each float32 value.
    rows = ",\n    ".join(
        "[" + ",".join(str(np.float32(v)) for v in row) + "]" for row in vectors
    )
    header = {
        "model": MODEL_ID,
        "model_file": "model.onnx (int8 weights)",
        "dimensions": int(vectors.shape[1]),
        "max_length": MAX_LENGTH,
        "pooling": "mean",
        "normalized": True,
        "batch_size": args.batch_size,
        "onnxruntime": ort.__version__,
        "tokenizers": tokenizers.__version__,
        "sentences": sentences,
    }
    body = json.dumps(header, indent=2, ensure_ascii=False)[:-2]  # drop the closing "\n}"
    text = f'{body},\n  "vectors": [\n    {rows}\n  ]\n}}\n'
    json.loads(text)  # the hand-written part must be valid JSON
    Path(args.out).write_text(text, encoding="utf-8")
    print(f"local_reference: wrote {len(sentences)} vectors of {vectors.shape[1]} to {args.out}",
          file=sys.stderr)


def run_bench(args: argparse.Namespace) -> None:
    model_dir = Path(args.model_dir) if args.model_dir else default_model_dir()
    embedder = Embedder(model_dir, args.threads)
    sentences = read_lines(args.bench)
    embedder.embed(sentences[: args.batch_size])  # warm-up, not timed
    count = 0
    start = time.perf_counter()
    for batch in batches(sentences, args.batch_size):
        count += len(embedder.embed(batch))
    seconds = time.perf_counter() - start
    print(json.dumps({
        "sentences": count,
        "seconds": round(seconds, 6),
        "sentences_per_second": round(count / seconds, 3) if seconds > 0 else None,
        "batch_size": args.batch_size,
        "threads": args.threads,
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--sentences", metavar="FILE", help="embed each line of FILE")
    mode.add_argument("--bench", metavar="FILE", help="time embedding the lines of FILE")
    parser.add_argument("--out", metavar="FILE.json", help="output of --sentences")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="intra_op_num_threads")
    parser.add_argument("--model-dir", help="folder with model.onnx and tokenizer.json")
    args = parser.parse_args()
    if args.batch_size < 1 or args.threads < 1:
        parser.error("--batch-size and --threads must be at least 1")
    if args.sentences and not args.out:
        parser.error("--sentences needs --out")
    if args.sentences:
        run_sentences(args)
    else:
        run_bench(args)


if __name__ == "__main__":
    main()
