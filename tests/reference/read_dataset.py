"""Reads a sharded embedjob output directory (part-IIIII-of-NNNNN.parquet files)
as one table with pyarrow, DuckDB, Polars and LanceDB, the way users will, and
prints one JSON object: for each reader the rows, a SHA-256 of the sorted ids
joined by newlines, the vector dimensions and the sum of every vector value
(computed from that reader's own result, rounded to 3 decimals; DuckDB, which
reads the vectors as plain lists, has no dimensions to report when there are no
rows). Exits 1 when a reader fails, sees the embedding as anything but a
fixed-length float32 vector, or when the readers disagree.

Usage: read_dataset.py DIR
"""
import glob
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile

import duckdb
import lancedb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq


def seen(ids, dims, vector_sum):
    digest = hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()
    return {"rows": len(ids), "ids": digest, "dimensions": dims, "vector_sum": float(vector_sum)}


def arrow_seen(table, reader):
    kind = table.schema.field("embedding").type
    if not (pa.types.is_fixed_size_list(kind) and kind.value_type == pa.float32()):
        raise ValueError(f"{reader} reads embedding as {kind}, not a fixed-size list of float32")
    values = np.asarray(table.column("embedding").combine_chunks().flatten(), dtype=np.float64)
    return seen(table.column("id").to_pylist(), kind.list_size, values.sum())


def read_pyarrow(path):
    return arrow_seen(pq.read_table(path), "pyarrow")


def read_duckdb(path):
    # Every column is loaded, so a column a file cannot be read as fails here as it would for users.
    # DuckDB reads a Parquet fixed-size list as a plain list (FLOAT[]); its length is checked per row.
    pattern = f"{path}/*.parquet".replace("'", "''")
    con = duckdb.connect()
    con.execute(f"CREATE TABLE chunks AS SELECT * FROM read_parquet('{pattern}')")
    kinds = {k for (k,) in con.execute("SELECT DISTINCT typeof(embedding) FROM chunks").fetchall()}
    if kinds - {"FLOAT[]"}:
        raise ValueError(f"duckdb reads embedding as {sorted(kinds)}, not FLOAT[]")
    lengths = [n for (n,) in con.execute("SELECT DISTINCT len(embedding) FROM chunks").fetchall()]
    if len(lengths) > 1:
        raise ValueError(f"duckdb reads vectors of {sorted(lengths)} values")
    ids = [i for (i,) in con.execute("SELECT id FROM chunks").fetchall()]
    (total,) = con.execute("SELECT coalesce(sum(list_sum(embedding::DOUBLE[])), 0) FROM chunks").fetchone()
    return seen(ids, lengths[0] if lengths else None, total)  # no rows: no length to measure


def read_polars(path):
    frame = pl.read_parquet(f"{path}/*.parquet")
    kind = frame.schema["embedding"]
    if not (isinstance(kind, pl.Array) and kind.inner == pl.Float32):
        raise ValueError(f"polars reads embedding as {kind}, not Array(Float32)")
    total = frame["embedding"].explode().cast(pl.Float64).sum()
    return seen(frame["id"].to_list(), kind.size, total)


def read_lancedb(path):
    folder = tempfile.mkdtemp(prefix="read_dataset-lancedb-")
    try:
        table = lancedb.connect(folder).create_table("chunks", data=ds.dataset(path))
        stored = table.to_arrow()
        result = arrow_seen(stored, "lancedb")
        if result["rows"]:
            # The column serves as LanceDB's vector column: a row's own vector is its nearest.
            first = stored.column("embedding")[0].as_py()
            hit = table.search(first, vector_column_name="embedding").limit(1).to_list()[0]
            if hit["_distance"] > 1e-6:
                raise ValueError(f"lancedb finds no row at distance 0 from a stored vector: {hit['_distance']}")
        return result
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        sys.exit(2)
    path = sys.argv[1].rstrip("/") or "/"
    if not os.path.isdir(path) or not glob.glob(os.path.join(glob.escape(path), "*.parquet")):
        sys.exit(f"read_dataset: {path} is not a directory holding .parquet files")
    report, errors = {}, []
    for name, read in (("pyarrow", read_pyarrow), ("duckdb", read_duckdb), ("polars", read_polars), ("lancedb", read_lancedb)):
        try:
            report[name] = read(path)
        except Exception as err:  # every reader's failure is reported, not only the first
            report[name] = {"error": f"{type(err).__name__}: {err}"}
            errors.append(f"{name} cannot read {path}: {type(err).__name__}: {err}")
    good = [(name, r) for name, r in report.items() if "error" not in r]
    for name, r in good[1:]:
        first_name, first = good[0]
        for key in ("rows", "ids", "dimensions"):
            if r[key] != first[key] and None not in (r[key], first[key]):
                errors.append(f"{name} and {first_name} disagree on {key}: {r[key]} != {first[key]}")
        if not math.isclose(r["vector_sum"], first["vector_sum"], rel_tol=1e-9, abs_tol=1e-6):
            errors.append(f"{name} and {first_name} disagree on vector_sum: {r['vector_sum']} != {first['vector_sum']}")
    for _, r in good:
        r["vector_sum"] = round(r["vector_sum"], 3)
    print(json.dumps(report))
    if errors:
        sys.exit("\n".join(f"read_dataset: {e}" for e in errors))


if __name__ == "__main__":
    main()
