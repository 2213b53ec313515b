"""Writes Parquet inputs the way pyarrow and DuckDB write them, for the
source tests: pyarrow's defaults (snappy, dictionary-encoded strings),
large_string and string_view columns, and DuckDB's COPY ... TO.

Usage: write_inputs.py DIRECTORY
Each file has columns id (string or int) and body (some nulls and empties).
"""
import os
import sys

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq


def rows():
    ids, bodies = [], []
    for i in range(50):
        ids.append(f"rec-{i}")
        if i % 10 == 3:
            bodies.append(None)
        elif i % 10 == 7:
            bodies.append("")
        else:
            bodies.append(f"Record {i} says something about vector indexes and tokens. " * (1 + i % 4))
    return ids, bodies


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    ids, bodies = rows()
    base = pa.table({"id": ids, "body": bodies, "extra": list(range(len(ids)))})
    pq.write_table(base, f"{out}/pyarrow_default.parquet")
    large = pa.table({"id": pa.array(ids, pa.large_string()), "body": pa.array(bodies, pa.large_string())})
    pq.write_table(large, f"{out}/pyarrow_large.parquet", compression="zstd")
    view = pa.table({"id": pa.array(ids, pa.string_view()), "body": pa.array(bodies, pa.string_view())})
    pq.write_table(view, f"{out}/pyarrow_view.parquet")
    dictionary = pa.table({"id": ids, "body": pa.array(bodies).dictionary_encode()})
    pq.write_table(dictionary, f"{out}/pyarrow_dictionary.parquet", store_schema=False)
    con = duckdb.connect()
    con.register("base", base)
    con.execute(f"COPY (SELECT id, body FROM base) TO '{out}/duckdb.parquet' (FORMAT parquet)")
    print("ok")


if __name__ == "__main__":
    main()
