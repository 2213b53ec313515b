"""Reads an embedjob output with pyarrow and DuckDB, as users will, and checks
that the embedding column is a fixed-size list of float32 of the given length.

Usage: check_output.py OUTPUT.parquet DIMENSIONS
"""
import sys

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq


def main() -> None:
    path, dims = sys.argv[1], int(sys.argv[2])

    table = pq.read_table(path)
    field = table.schema.field("embedding")
    expected = pa.list_(pa.float32(), dims)
    assert field.type.equals(expected) or (
        pa.types.is_fixed_size_list(field.type)
        and field.type.list_size == dims
        and field.type.value_type == pa.float32()
    ), f"embedding is {field.type}, expected {expected}"
    assert not field.nullable, "embedding must be not null"
    assert table.schema.field("id").type == pa.string()
    assert table.num_rows > 0
    ids = table.column("id").to_pylist()
    assert len(set(ids)) == len(ids), "ids are unique"
    meta = pq.read_metadata(path).metadata
    assert meta[b"embedjob.dimensions"] == str(dims).encode(), meta
    for key in (b"embedjob.schema_version", b"embedjob.model", b"embedjob.usage.prompt_tokens", b"embedjob.requests"):
        assert key in meta, key
    print(f"pyarrow ok: {table.num_rows} rows, {field.type}")

    con = duckdb.connect()
    rows, length, typ = con.execute(
        f"SELECT count(*), min(len(embedding)), any_value(typeof(embedding)) FROM read_parquet('{path}')"
    ).fetchone()
    assert rows == table.num_rows, (rows, table.num_rows)
    assert length == dims, (length, dims)
    assert typ.startswith("FLOAT"), typ
    con.execute(f"SELECT array_cosine_similarity(embedding::FLOAT[{dims}], embedding::FLOAT[{dims}]) FROM read_parquet('{path}') LIMIT 1")
    print(f"duckdb ok: {rows} rows, {typ}")


if __name__ == "__main__":
    main()
