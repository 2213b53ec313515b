//! `embedjob query`: a chunk's own text finds that chunk first, in a
//! Parquet output and in a pgvector table, with the service (simulated) and
//! with the local model; and `embed --local`.

use std::path::{Path, PathBuf};

use embedjob::simulate::SimConfig;
use serde_json::Value;

use crate::support::{
    bin, corpus, expected_chunks, files_source, no_key, no_secrets, query_json, query_output, run,
    run_job, run_pg, simulator, text, write_job, write_pg_job, TestDb, KEY, PASSWORD_ENV,
};

/// A chunk whose text appears once in the corpus, and its id.
fn unique_chunk(root: &Path, nth: usize) -> (String, String) {
    let expected = expected_chunks(root);
    let mut counts = std::collections::HashMap::new();
    for text in expected.values() {
        *counts.entry(text.clone()).or_insert(0) += 1;
    }
    expected
        .into_iter()
        .filter(|(_, t)| counts[t] == 1)
        .nth(nth)
        .expect("a chunk of its own")
}

fn assert_own_top_hit(results: &[Value], id: &str, text: &str) {
    assert_eq!(results[0]["id"], id, "{results:#?}");
    assert_eq!(results[0]["rank"], 1);
    assert_eq!(results[0]["text"], text);
    let score = results[0]["score"].as_f64().unwrap();
    assert!((score - 1.0).abs() < 1e-4, "score {score}");
    assert!(results[1]["score"].as_f64().unwrap() < score);
    assert_eq!(results[0]["doc_id"], id.rsplit_once('#').unwrap().0);
}

#[tokio::test]
async fn a_chunks_own_text_finds_it_first_with_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 20);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(&job, &["--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let db = TestDb::new().await;
    let pg_job = write_pg_job(
        dir.path(),
        &sim.base_url(),
        &files_source(&root),
        &db,
        "chunks",
        "",
    );
    let output = run_pg(&pg_job, &db, &["--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));

    for nth in [0, 7, 30] {
        let (id, chunk) = unique_chunk(&root, nth);
        sim.reset_ledger();
        let results = query_json(&job, &chunk, 5, &[]).await;
        assert_eq!(results.len(), 5);
        assert_own_top_hit(&results, &id, &chunk);
        assert_eq!(
            sim.ledger().billed_requests,
            1,
            "the query is embedded once"
        );

        let password = [(PASSWORD_ENV, db.password.as_str())];
        let results = query_json(&pg_job, &chunk, 5, &password).await;
        assert_own_top_hit(&results, &id, &chunk);
    }

    // The human form: a line per result with its score, id and a snippet.
    let (id, chunk) = unique_chunk(&root, 3);
    let output = query_output(&job, &chunk, &["-k", "2"], &[]).await;
    let (stdout, _) = no_key(&output, KEY);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(
        lines[0].contains(&id) && lines[0].contains("1.0000"),
        "{stdout}"
    );
    let password = [(PASSWORD_ENV, db.password.as_str())];
    let output = query_output(&pg_job, &chunk, &["-k", "2"], &password).await;
    no_secrets(&output, &db);
}

/// A small corpus and a local job over it, with `[output]` lines.
fn local_job(dir: &Path, root: &Path, output: &str) -> PathBuf {
    let job = format!(
        "name = \"local-query\"\n[source]\n{}\n[chunking]\nmax_tokens = 64\noverlap_tokens = 0\n\
         [backend]\nkind = \"local\"\n[output]\n{output}\n",
        files_source(root)
    );
    let path = dir.join(format!("local-{}.toml", rand::random::<u32>()));
    std::fs::write(&path, job).unwrap();
    path
}

#[tokio::test]
async fn a_chunks_own_text_finds_it_first_with_the_local_model() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("docs");
    std::fs::create_dir_all(&root).unwrap();
    let topics = [
        "Cats sleep most of the afternoon in a patch of warm sunlight.",
        "The invoice is due at the end of the month, with a late fee after that.",
        "Rust's borrow checker rejects two mutable references to one value.",
        "A lighthouse keeper climbs the spiral stairs every evening at dusk.",
        "Sourdough needs a starter that has been fed flour and water for days.",
        "The train to the coast leaves from platform nine on weekdays.",
    ];
    for (i, topic) in topics.iter().enumerate() {
        std::fs::write(root.join(format!("t{i}.txt")), topic).unwrap();
    }
    let parquet = local_job(
        dir.path(),
        &root,
        &format!(
            "path = \"{}\"",
            dir.path().join("out/local.parquet").display()
        ),
    );
    let mut command = bin();
    command.arg("run").arg(&parquet).arg("--quiet");
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));

    let db = TestDb::new().await;
    let pg = local_job(
        dir.path(),
        &root,
        &format!(
            "kind = \"pgvector\"\nurl = \"{}\"\npassword_env = \"{PASSWORD_ENV}\"\n\
             table = \"local\"\nstate_dir = \"{}\"",
            db.url,
            dir.path().join("state").display()
        ),
    );
    let output = run_pg(&pg, &db, &["--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));

    let password = [(PASSWORD_ENV, db.password.as_str())];
    for (i, topic) in topics.iter().enumerate() {
        let id = format!("t{i}.txt#0");
        let results = query_json(&parquet, topic, 3, &[]).await;
        assert_own_top_hit(&results, &id, topic);
        let results = query_json(&pg, topic, 3, &password).await;
        assert_own_top_hit(&results, &id, topic);
    }
    // A paraphrase finds its topic too: the local model's vectors mean something.
    let results = query_json(&parquet, "where does the coastal train depart", 1, &[]).await;
    assert_eq!(results[0]["id"], "t5.txt#0");
}

#[tokio::test]
async fn query_refuses_bad_arguments_and_a_missing_output() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 3);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");

    let output = query_output(&job, "anything", &[], &[]).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no output yet"), "{stderr}");

    for k in ["0", "1001"] {
        let output = query_output(&job, "anything", &["-k", k], &[]).await;
        let (_, stderr) = no_key(&output, KEY);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("-k must be between 1 and 1000"), "{stderr}");
    }
    let output = query_output(&job, "  ", &[], &[]).await;
    assert_eq!(output.status.code(), Some(2));

    // An output made with another model is not searched with this one's vectors.
    assert_eq!(run_job(&job, &["--quiet"]).await.status.code(), Some(0));
    let output = query_output(
        &job,
        "anything",
        &["--set", "backend.model=svc-embed-1-l"],
        &[],
    )
    .await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("1024"), "{stderr}");
    assert!(stderr.contains("3072"), "{stderr}");
}

#[tokio::test]
async fn embed_uses_the_local_model_without_a_key() {
    let mut command = bin();
    command.args(["embed", "--local", "--json", "hello there", "a second text"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let value: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(value["model"], "all-MiniLM-L6-v2");
    assert_eq!(value["dimensions"], 384);
    let embeddings = value["embeddings"].as_array().unwrap();
    assert_eq!(embeddings.len(), 2);
    assert_eq!(embeddings[0].as_array().unwrap().len(), 384);

    let mut command = bin();
    command.args(["embed", "hello"]);
    let output = run(command).await;
    assert_eq!(
        output.status.code(),
        Some(2),
        "--model or --local is required"
    );
}

/// Rewrites the Parquet file at `path` with the vectors of the rows named
/// in `damage` replaced, keeping its schema and key-value metadata.
fn damage_vectors(path: &Path, damage: &std::collections::BTreeMap<String, Vec<f32>>) {
    use arrow::array::{Array, ArrayRef, AsArray, FixedSizeListArray, Float32Array};
    use arrow::datatypes::{DataType, Float32Type};
    use arrow::record_batch::RecordBatch;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;
    use std::sync::Arc;

    let builder =
        ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).unwrap()).unwrap();
    let kv: Vec<_> = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.key != "ARROW:schema")
        .collect();
    let schema = builder.schema().clone();
    let column = schema.index_of("embedding").unwrap();
    let DataType::FixedSizeList(item, size) = schema.field(column).data_type().clone() else {
        panic!("embedding is a fixed-size list");
    };
    let mut batches = Vec::new();
    let mut damaged = 0;
    for batch in builder.build().unwrap() {
        let batch = batch.unwrap();
        let ids = batch.column_by_name("id").unwrap().as_string::<i32>();
        let embeddings = batch.column(column).as_fixed_size_list();
        let mut values = Vec::new();
        for i in 0..batch.num_rows() {
            match damage.get(ids.value(i)) {
                Some(vector) => {
                    assert_eq!(vector.len(), size as usize);
                    values.extend_from_slice(vector);
                    damaged += 1;
                }
                None => values
                    .extend_from_slice(embeddings.value(i).as_primitive::<Float32Type>().values()),
            }
        }
        let list = FixedSizeListArray::try_new(
            item.clone(),
            size,
            Arc::new(Float32Array::from(values)),
            embeddings.nulls().cloned(),
        )
        .unwrap();
        let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
        columns[column] = Arc::new(list);
        batches.push(RecordBatch::try_new(schema.clone(), columns).unwrap());
    }
    assert_eq!(damaged, damage.len(), "every damaged row is in the file");
    let properties = WriterProperties::builder()
        .set_key_value_metadata(Some(kv))
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = ArrowWriter::try_new(file, schema, Some(properties)).unwrap();
    for batch in &batches {
        writer.write(batch).unwrap();
    }
    writer.close().unwrap();
}

/// A stored vector with a NaN ranked first (`total_cmp` puts NaN above
/// every number), with the score `null`; an infinity or an all-zero vector
/// came out with no score either. Damaged rows are never results now, and
/// the query says how many it passed over.
#[tokio::test]
async fn regression_a_damaged_vector_in_a_parquet_output_was_ranked_first() {
    let dir = tempfile::tempdir().unwrap();
    let root = corpus(dir.path(), 12);
    let sim = simulator(SimConfig::default()).await;
    let job = write_job(dir.path(), &sim.base_url(), &files_source(&root), "");
    let output = run_job(&job, &["--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let chunks = expected_chunks(&root);
    let (own_id, own_text) = unique_chunk(&root, 2);
    let dimensions = 1024;
    // The chunk the query would find first, and others: each kind of damage.
    let with = |v: f32| {
        let mut vector = embedjob::simulate::embedding_vector(dimensions, "x");
        vector[dimensions / 2] = v;
        vector
    };
    let mut damage = std::collections::BTreeMap::new();
    damage.insert(own_id.clone(), with(f32::NAN));
    let others: Vec<&String> = chunks.keys().filter(|id| **id != own_id).collect();
    damage.insert(others[0].clone(), with(f32::INFINITY));
    damage.insert(others[1].clone(), with(f32::NEG_INFINITY));
    damage.insert(others[2].clone(), vec![0.0; dimensions]);
    let out = dir.path().join("out/result.parquet");
    damage_vectors(&out, &damage);

    let output = query_output(&job, &own_text, &["-k", "1000", "--json"], &[]).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let value: Value = serde_json::from_str(&stdout).unwrap();
    let results = value["results"].as_array().unwrap();
    assert_eq!(value["passed_over"], damage.len(), "{stdout}");
    assert_eq!(results.len(), chunks.len() - damage.len(), "{stdout}");
    for (rank, hit) in results.iter().enumerate() {
        assert_eq!(hit["rank"], rank + 1);
        assert!(hit["score"].as_f64().is_some_and(f64::is_finite), "{hit}");
        let id = hit["id"].as_str().unwrap();
        assert!(!damage.contains_key(id), "damaged row {id} is a result");
    }
    assert!(
        stderr.contains(&format!("passed over {} stored row", damage.len())),
        "{stderr}"
    );

    // The human form says so too, on stderr only.
    let output = query_output(&job, &own_text, &["-k", "3"], &[]).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert_eq!(stdout.lines().count(), 3, "{stdout}");
    assert!(!stdout.contains("passed over"), "{stdout}");
    assert!(stderr.contains("passed over 4 stored row"), "{stderr}");
}
