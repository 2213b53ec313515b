//! Job files, corpora, and reading and checking what a run wrote.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Float32Type, UInt32Type, UInt64Type};
use embedjob::chunk::{Chunker, TokenChunker};
use embedjob::job::ChunkingConfig;
use embedjob::simulate;
use embedjob::types::{content_hash, Document};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

/// Writes `dir/job.toml`, the one job file of a test's directory.
fn write_job_file(dir: &Path, job: &str) -> PathBuf {
    let path = dir.join("job.toml");
    std::fs::write(&path, job).unwrap();
    path
}

/// A job file in `dir` against `base_url`, with extra lines appended to sections.
pub fn write_job(dir: &Path, base_url: &str, source: &str, backend_extra: &str) -> PathBuf {
    let job = format!(
        r#"name = "test"
[source]
{source}
[chunking]
max_tokens = 64
overlap_tokens = 8
[backend]
kind = "api"
base_url = "{base_url}"
model = "svc-embed-1"
max_inputs_per_request = 8
concurrency = 4
max_retries = 10
timeout_seconds = 5
{backend_extra}
[output]
path = "{out}"
"#,
        out = dir.join("out/result.parquet").display()
    );
    write_job_file(dir, &job)
}

/// The `[source]` lines for a files job over `root`.
pub fn files_source(root: &Path) -> String {
    format!("kind = \"files\"\npaths = [\"{}\"]", root.display())
}

pub fn corpus(dir: &Path, documents: usize) -> PathBuf {
    let root = dir.join("docs");
    std::fs::create_dir_all(root.join("nested")).unwrap();
    for i in 0..documents {
        let sub = if i % 3 == 0 { "nested/" } else { "" };
        let mut body = format!("# Document {i}\n\n");
        for p in 0..(1 + i % 5) {
            body.push_str(&format!(
                "Paragraph {p} of document {i} talks about vector indexes, tokens and batches. \
                 It repeats a little so that chunks have some length: {}\n\n",
                "lorem ipsum dolor sit amet ".repeat(1 + (i * p) % 7)
            ));
        }
        std::fs::write(root.join(format!("{sub}doc{i:03}.md")), body).unwrap();
    }
    root
}

/// The chunks a run must produce, computed here with the library's chunker.
pub fn expected_chunks(root: &Path) -> BTreeMap<String, String> {
    let chunker = TokenChunker::cl100k(&ChunkingConfig {
        max_tokens: 64,
        overlap_tokens: 8,
        markdown: None,
        tokenizer: None,
        wordpieces: None,
    })
    .unwrap();
    let mut expected = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let doc_id = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .replace('\\', "/");
            let document = Document {
                doc_id,
                source: path.to_string_lossy().into(),
                text: std::fs::read_to_string(&path).unwrap(),
                metadata: None,
            };
            for chunk in chunker.chunk(&document) {
                expected.insert(chunk.id, chunk.text);
            }
        }
    }
    expected
}

pub struct Rows {
    pub ids: Vec<String>,
    pub texts: Vec<String>,
    pub vectors: Vec<Vec<f32>>,
    pub token_counts: Vec<u32>,
    pub metadata: HashMap<String, String>,
    pub embedding_type: DataType,
}

pub fn read_output(path: &Path) -> Rows {
    let file = std::fs::File::open(path).unwrap();
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
    let metadata = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .map(|kv| {
            kv.iter()
                .map(|e| (e.key.clone(), e.value.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    let embedding_type = builder
        .schema()
        .field_with_name("embedding")
        .unwrap()
        .data_type()
        .clone();
    let mut rows = Rows {
        ids: vec![],
        texts: vec![],
        vectors: vec![],
        token_counts: vec![],
        metadata,
        embedding_type,
    };
    for batch in builder.build().unwrap() {
        let batch = batch.unwrap();
        let ids = batch.column_by_name("id").unwrap().as_string::<i32>();
        let texts = batch.column_by_name("text").unwrap().as_string::<i32>();
        let tokens = batch
            .column_by_name("token_count")
            .unwrap()
            .as_primitive::<UInt32Type>();
        let starts = batch
            .column_by_name("byte_start")
            .unwrap()
            .as_primitive::<UInt64Type>();
        let embeddings = batch
            .column_by_name("embedding")
            .unwrap()
            .as_fixed_size_list();
        for i in 0..batch.num_rows() {
            rows.ids.push(ids.value(i).to_string());
            rows.texts.push(texts.value(i).to_string());
            rows.token_counts.push(tokens.value(i));
            assert!(starts.is_valid(i));
            let values = embeddings.value(i);
            rows.vectors
                .push(values.as_primitive::<Float32Type>().values().to_vec());
        }
    }
    rows
}

/// Every expected chunk is in the output exactly once, with the simulator's vector for its text.
pub fn assert_complete(rows: &Rows, expected: &BTreeMap<String, String>, dimensions: usize) {
    let unique: HashSet<&String> = rows.ids.iter().collect();
    assert_eq!(unique.len(), rows.ids.len(), "ids are unique");
    assert_eq!(rows.ids.len(), expected.len(), "every chunk, once");
    for ((id, text), vector) in rows.ids.iter().zip(&rows.texts).zip(&rows.vectors) {
        assert_eq!(
            expected.get(id),
            Some(text),
            "row {id} holds its chunk's text"
        );
        assert_eq!(vector.len(), dimensions, "row {id}");
        assert!(vector.iter().all(|v| v.is_finite()), "row {id}");
        assert_eq!(
            vector,
            &simulate::embedding_vector(dimensions, text),
            "row {id}'s vector"
        );
    }
}

pub fn text_hash(text: &str) -> String {
    hex::encode(content_hash(text))
}

/// What a re-run after [`edit_one_add_one_delete_one`] must do.
pub struct Edits {
    pub after: BTreeMap<String, String>,
    pub to_send: HashSet<String>,
    pub unchanged: u64,
    pub changed: u64,
    pub added: u64,
    pub removed: u64,
}

/// Edits one document, adds one and deletes one; `before` maps the chunk
/// ids of the first run to their texts.
pub fn edit_one_add_one_delete_one(
    root: &std::path::Path,
    before: &BTreeMap<String, String>,
) -> Edits {
    // Edit one document, add one, delete one.
    let edited = root.join("doc004.md");
    let mut text = std::fs::read_to_string(&edited).unwrap();
    text.push_str("A closing paragraph added since the last run, about cron jobs.\n");
    std::fs::write(&edited, text).unwrap();
    std::fs::write(
        root.join("doc100.md"),
        "# A new document\n\nIt did not exist at the first run.\n",
    )
    .unwrap();
    std::fs::remove_file(root.join("doc005.md")).unwrap();
    let after = expected_chunks(root);

    let old_texts: HashSet<&String> = before.values().collect();
    let to_send: HashSet<String> = after
        .values()
        .filter(|t| !old_texts.contains(t))
        .map(|t| text_hash(t))
        .collect();
    let unchanged = after.values().filter(|t| old_texts.contains(t)).count() as u64;
    let changed = after
        .iter()
        .filter(|(id, t)| !old_texts.contains(t) && before.contains_key(*id))
        .count() as u64;
    let added = after.len() as u64 - unchanged - changed;
    let removed = before.keys().filter(|id| !after.contains_key(*id)).count() as u64;
    Edits {
        after,
        to_send,
        unchanged,
        changed,
        added,
        removed,
    }
}

/// Three short documents: one request of three inputs.
pub fn three_documents(dir: &Path) -> PathBuf {
    let root = dir.join("docs");
    std::fs::create_dir_all(&root).unwrap();
    for (i, text) in ["alpha beta", "gamma delta", "epsilon zeta"]
        .iter()
        .enumerate()
    {
        std::fs::write(root.join(format!("d{i}.txt")), text).unwrap();
    }
    root
}

/// A corpus mixing markdown, plain text, code and non-ASCII text, so that
/// chunk boundaries and token counts are not all alike; with `repeats`,
/// some chunks repeat the text of others.
pub fn mixed_corpus(dir: &Path, repeats: bool) -> PathBuf {
    let root = dir.join("docs");
    std::fs::create_dir_all(&root).unwrap();
    for i in 0..12 {
        let mut body = format!("# Notes {i}\n\n");
        for p in 0..(2 + i % 4) {
            body.push_str(&format!(
                "Paragraph {p}: vector indexes, tokens and batches; café, naïve, 東京, \
                 emoji 🚀 and `code_{i}()`. {}\n\n",
                (0..1 + (i * p) % 9)
                    .map(|k| if repeats {
                        "Embedding runs cost money. ".to_string()
                    } else {
                        format!("Run {i}.{p}.{k} costs money. ")
                    })
                    .collect::<String>()
            ));
        }
        let name = if i % 3 == 0 { "txt" } else { "md" };
        std::fs::write(root.join(format!("note{i:02}.{name}")), body).unwrap();
    }
    root
}

/// The estimate tests' job: `mixed_corpus` with repeats, in small chunks
/// and small requests so that there are many of each to count.
pub fn write_cost_job(dir: &Path, base_url: &str, backend_extra: &str) -> PathBuf {
    write_cost_job_over(dir, mixed_corpus(dir, true), base_url, backend_extra)
}

/// [`write_cost_job`] over the files under `root`.
pub fn write_cost_job_over(
    dir: &Path,
    root: PathBuf,
    base_url: &str,
    backend_extra: &str,
) -> PathBuf {
    let job = format!(
        r#"name = "cost"
[source]
kind = "files"
paths = ["{root}"]
[chunking]
max_tokens = 48
overlap_tokens = 6
[backend]
kind = "api"
base_url = "{base_url}"
model = "svc-embed-1"
max_inputs_per_request = 5
max_tokens_per_request = 200
concurrency = 3
timeout_seconds = 5
{backend_extra}
[output]
path = "{out}"
"#,
        root = root.display(),
        out = dir.join("out/result.parquet").display()
    );
    write_job_file(dir, &job)
}
