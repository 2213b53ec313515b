"""The official `openai` client's Batch API calls, with default arguments,
against the service at OPENAI_BASE_URL (the test starts the simulator there).

Uploads a request file, creates batches, polls, downloads the output,
pages through the listing and cancels; prints one JSON object of what came
back, which the Rust test checks.
"""

import io
import json
import time

import openai

LINES = 5


def main() -> None:
    client = openai.OpenAI(max_retries=0)
    content = "".join(
        json.dumps(
            {
                "custom_id": f"p{i}",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"model": "svc-embed-1", "input": [f"text {i}"]},
            }
        )
        + "\n"
        for i in range(LINES)
    )
    uploaded = client.files.create(
        file=("requests.jsonl", io.BytesIO(content.encode())), purpose="batch"
    )
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/embeddings",
        completion_window="24h",
        metadata={"embedjob_part": "0"},
    )
    created_status = batch.status
    # Bounded: the test's simulator finishes a batch at once.
    for _ in range(3000):
        batch = client.batches.retrieve(batch.id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            break
        time.sleep(0.01)
    output = client.files.content(batch.output_file_id).text
    lines = [json.loads(line) for line in output.splitlines()]
    more = [
        client.batches.create(
            input_file_id=uploaded.id,
            endpoint="/v1/embeddings",
            completion_window="24h",
            metadata={"embedjob_part": str(part)},
        ).id
        for part in (1, 2)
    ]
    cancelled = client.batches.cancel(more[-1])
    # Pages of one: the client follows `after` through every batch.
    listed = [b.id for b in client.batches.list(limit=1)]
    deleted = client.files.delete(batch.output_file_id).deleted
    print(
        json.dumps(
            {
                "file": {"id": uploaded.id, "bytes": uploaded.bytes, "expected": len(content)},
                "created_status": created_status,
                "status": batch.status,
                "counts": batch.request_counts.model_dump(),
                "metadata": batch.metadata,
                "lines": {
                    line["custom_id"]: line["response"]["body"]["data"][0]["embedding"]
                    for line in lines
                },
                "batches": [batch.id] + more,
                "cancel_status": cancelled.status,
                "listed": listed,
                "deleted": deleted,
            }
        )
    )


if __name__ == "__main__":
    main()
