"""The job file every benchmark section writes: a JSON Lines corpus, chunks of
at most 256 tokens, an api backend, and the output the section names."""
import os


def write_job(work, name, corpus_path, *, base_url, model, concurrency, batch,
              output, backend_extra=""):
    """Writes job-<name>.toml in `work` and returns its path. `output` is the
    [output] section's lines; `backend_extra`, more [backend] lines."""
    path = os.path.join(work, f"job-{name}.toml")
    with open(path, "w") as f:
        f.write(f"""name = "bench-{name}"
[source]
kind = "jsonl"
path = "{corpus_path}"
text_field = "text"
id_field = "id"
[chunking]
max_tokens = 256
overlap_tokens = 0
[backend]
kind = "api"
base_url = "{base_url}"
model = "{model}"
concurrency = {concurrency}
max_inputs_per_request = {batch}
{backend_extra}[output]
{output}
""")
    return path
