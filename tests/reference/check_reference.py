#!/usr/bin/env python3
"""Sanity checks of tests/reference/sentences.ref.json.

  * one finite, unit-length vector of 384 values per line of sentences.txt;
  * each paraphrase pair (lines 1-2, 3-4, 5-6, 7-8, 9-10 of sentences.txt) scores
    a higher cosine than either of its sentences scores with any sentence
    outside its pair;
  * with --recompute, local_reference.py gives the same vectors again
    (within --tolerance).

Exit status 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
# 0-based line numbers of sentences.txt that are paraphrases of each other.
PARAPHRASE_PAIRS = [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", default=str(HERE / "sentences.txt"))
    parser.add_argument("--ref", default=str(HERE / "sentences.ref.json"))
    parser.add_argument("--recompute", action="store_true")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    args = parser.parse_args()

    sentences = Path(args.sentences).read_text(encoding="utf-8").splitlines()
    ref = json.loads(Path(args.ref).read_text(encoding="utf-8"))
    vectors = np.array(ref["vectors"], dtype=np.float64)
    failures: list[str] = []

    if ref.get("sentences") != sentences:
        failures.append("the sentences in the reference differ from sentences.txt")
    if vectors.shape != (len(sentences), ref["dimensions"]) or ref["dimensions"] != 384:
        failures.append(f"shape {vectors.shape}, dimensions {ref['dimensions']}")
    if not np.isfinite(vectors).all():
        failures.append("non-finite values")
    norm_error = float(np.abs(np.linalg.norm(vectors, axis=1) - 1.0).max())
    if norm_error > 1e-5:
        failures.append(f"vectors are not unit length (max error {norm_error:.3g})")

    cos = vectors @ vectors.T
    for a, b in PARAPHRASE_PAIRS:
        others = [j for j in range(len(sentences)) if j not in (a, b)]
        nearest_other = max(max(cos[a, j], cos[b, j]) for j in others)
        verdict = "ok" if cos[a, b] > nearest_other else "FAIL"
        print(f"pair {a + 1}-{b + 1}: cosine {cos[a, b]:.4f}, "
              f"best unrelated {nearest_other:.4f}  {verdict}", file=sys.stderr)
        if verdict != "ok":
            failures.append(f"paraphrase pair {a + 1}-{b + 1} does not beat unrelated sentences")

    if args.recompute:
        sys.path.insert(0, str(HERE))
        import local_reference

        embedder = local_reference.Embedder(local_reference.default_model_dir(), threads=1)
        batch = ref.get("batch_size", 32)
        fresh = np.concatenate([
            embedder.embed(sentences[i : i + batch]) for i in range(0, len(sentences), batch)
        ]).astype(np.float64)
        diff = float(np.abs(fresh - vectors).max())
        print(f"recomputed: max abs difference {diff:.3g}", file=sys.stderr)
        if diff > args.tolerance:
            failures.append(f"recomputed vectors differ by {diff:.3g} > {args.tolerance}")

    for f in failures:
        print(f"check_reference: FAIL: {f}", file=sys.stderr)
    passed = 0 if failures else 1
    print(f"{passed} passed, {1 - passed} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
