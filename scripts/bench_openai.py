"""The Python baseline of scripts/bench: what people write today.

Reads a JSON Lines corpus (one chunk per record), sends batches of texts
with the openai package's AsyncOpenAI and its defaults (it asks for base64
and decodes it to floats itself), at most
CONCURRENCY requests in flight under asyncio, and writes the ids and vectors
to Parquet with pyarrow, a record batch per response, as they arrive.

    python bench_openai.py CORPUS.jsonl OUT.parquet MODEL DIMENSIONS CONCURRENCY BATCH_SIZE

The base URL comes from EMBEDJOB_BASE_URL and the key from EMBEDJOB_API_KEY.
Prints one JSON object: chunks and the seconds from the first read to the
closed file (the interpreter's start-up and imports are not counted).
"""

import asyncio
import json
import os
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
from openai import AsyncOpenAI


async def main():
    corpus, out, model, dimensions, concurrency, batch_size = sys.argv[1:7]
    dimensions, concurrency, batch_size = int(dimensions), int(concurrency), int(batch_size)
    started = time.perf_counter()
    with open(corpus) as f:
        records = [json.loads(line) for line in f]
    batches = [records[i:i + batch_size] for i in range(0, len(records), batch_size)]
    client = AsyncOpenAI(
        api_key=os.environ["EMBEDJOB_API_KEY"],
        base_url=os.environ["EMBEDJOB_BASE_URL"].rstrip("/") + "/v1",
    )
    schema = pa.schema([
        ("id", pa.string()),
        ("embedding", pa.list_(pa.float32(), dimensions)),
    ])
    writer = pq.ParquetWriter(out, schema, compression="zstd")
    semaphore = asyncio.Semaphore(concurrency)

    async def embed(batch):
        async with semaphore:
            response = await client.embeddings.create(
                model=model,
                input=[r["text"] for r in batch],
            )
        data = sorted(response.data, key=lambda d: d.index)
        table = pa.table(
            {
                "id": [r["id"] for r in batch],
                "embedding": pa.array([d.embedding for d in data], type=schema.field("embedding").type),
            },
            schema=schema,
        )
        writer.write_table(table)
        return len(batch)

    chunks = sum(await asyncio.gather(*(embed(b) for b in batches)))
    writer.close()
    await client.close()
    print(json.dumps({"chunks": chunks, "seconds": time.perf_counter() - started}))


asyncio.run(main())
