"""The official `openai` client, with its default arguments, against the
service at OPENAI_BASE_URL (the test starts `embedjob simulate` there).

Prints one JSON object of what came back; the Rust test checks it.
The client asks for base64 embeddings by default and decodes them itself.
"""

import json
import os
import sys

import openai


def main() -> None:
    client = openai.OpenAI(max_retries=0)
    one = client.embeddings.create(model="svc-embed-1", input="hello from python")
    many = client.embeddings.create(model="svc-embed-1", input=["first", "second", "third"])
    ids = json.loads(os.environ["TOKEN_IDS"])
    by_ids = client.embeddings.create(model="svc-embed-1", input=[ids])
    models = [m.id for m in client.models.list()]
    retrieved = client.models.retrieve("svc-embed-1-l").id
    chat = client.chat.completions.create(
        model="svc-base", messages=[{"role": "user", "content": "ping"}]
    )
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model="svc-base",
            messages=[{"role": "user", "content": "stream me"}],
            stream=True,
        )
        if chunk.choices
    )
    usage = None
    for chunk in client.chat.completions.create(
        model="svc-base",
        messages=[{"role": "user", "content": "count me"}],
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage.model_dump()
    json.dump(
        {
            "one": {
                "vector": one.data[0].embedding,
                "prompt_tokens": one.usage.prompt_tokens,
            },
            "many": [item.embedding for item in sorted(many.data, key=lambda d: d.index)],
            "token_ids": by_ids.data[0].embedding,
            "models": models,
            "retrieved": retrieved,
            "chat": chat.choices[0].message.content,
            "streamed": streamed,
            "stream_usage": usage,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
