//! The client's Batch API against the simulator, and against scripted
//! servers for what the simulator does not do (bodies cut off, lines too long).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::Duration;

use embedjob::client::{
    embeddings_from_body, ApiKey, BatchLine, BatchObject, BatchStatus, Client, ClientConfig,
    ErrorKind, NewBatch,
};
use embedjob::simulate::{self, BatchConfig, SimConfig};
use futures::StreamExt;
use serde_json::json;

use crate::support::{client, scripted_server, simulator, Scripted, KEY};

/// A simulator whose batches complete in `duration`.
fn config(batches: BatchConfig) -> SimConfig {
    SimConfig {
        batches,
        ..SimConfig::default()
    }
}

fn quick() -> BatchConfig {
    BatchConfig {
        duration: Duration::from_millis(200),
        ..BatchConfig::default()
    }
}

/// Writes a request file of `lines`, each `(custom_id, texts, base64)`.
fn request_file(dir: &Path, lines: &[(&str, &[&str], bool)]) -> std::path::PathBuf {
    let path = dir.join("requests.jsonl");
    let mut text = String::new();
    for (custom_id, texts, base64) in lines {
        let mut body = json!({"model": "svc-embed-1", "input": texts});
        if *base64 {
            body["encoding_format"] = json!("base64");
        }
        let line = json!({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body});
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap();
    path
}

fn metadata(part: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("embedjob_job".to_string(), "docs".to_string()),
        ("embedjob_part".to_string(), part.to_string()),
    ])
}

/// A batch of the uploaded file `file_id`, tagged as part `part`.
async fn create(client: &Client, file_id: &str, part: &str) -> BatchObject {
    let metadata = metadata(part);
    client
        .create_batch(&NewBatch {
            input_file_id: file_id,
            endpoint: "/v1/embeddings",
            completion_window: "24h",
            metadata: &metadata,
        })
        .await
        .unwrap()
}

async fn submit(client: &Client, dir: &Path, part: &str) -> BatchObject {
    let path = request_file(dir, &[("p0-0", &["alpha"], true)]);
    let file = client
        .upload_batch_file(&path, &format!("embedjob-{part}.jsonl"))
        .await
        .unwrap();
    create(client, &file.id, part).await
}

/// Polls until the batch has ended. The simulator ends one in `quick()`'s
/// 200 ms; 500 polls 20 ms apart allow fifty times that on a busy machine
/// and keep the loop bounded.
async fn settle(client: &Client, id: &str) -> BatchObject {
    for _ in 0..500 {
        let batch = client.batch(id).await.unwrap();
        if batch.status.is_terminal() {
            return batch;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("batch {id} did not end within 500 polls");
}

async fn lines(client: &Client, file: &str) -> Vec<BatchLine> {
    let stream = client.file_lines(file, 1 << 20).await.unwrap();
    stream.map(Result::unwrap).collect().await
}

#[tokio::test]
async fn a_batch_goes_from_upload_to_vectors() {
    let sim = simulator(config(quick())).await;
    let client = client(&sim.base_url());
    let dir = tempfile::tempdir().unwrap();
    let texts: [(&str, &[&str], bool); 3] = [
        ("p0-0", &["alpha", "beta gamma"], true),
        ("p0-1", &["delta"], false),
        ("p0-2", &["epsilon", "zeta", "eta theta"], true),
    ];
    let path = request_file(dir.path(), &texts);
    let file = client
        .upload_batch_file(&path, "embedjob-abc-0.jsonl")
        .await
        .unwrap();
    assert_eq!(file.bytes, std::fs::metadata(&path).unwrap().len());
    assert_eq!(file.purpose, "batch");
    assert_eq!(file.filename, "embedjob-abc-0.jsonl");

    let created = create(&client, &file.id, "0").await;
    assert_eq!(created.input_file_id, file.id);
    assert_eq!(created.metadata, metadata("0"));
    assert!(!created.status.is_terminal(), "{}", created.status);

    let done = settle(&client, &created.id).await;
    assert_eq!(done.status, BatchStatus::Completed, "{:?}", done.errors);
    assert_eq!(
        (done.request_counts.total, done.request_counts.completed),
        (3, 3)
    );
    let output = done.output_file_id.clone().expect("an output file");
    let mut by_id: HashMap<String, BatchLine> = lines(&client, &output)
        .await
        .into_iter()
        .map(|line| (line.custom_id.clone(), line))
        .collect();
    assert_eq!(by_id.len(), 3);
    let mut tokens = 0;
    for (custom_id, inputs, _) in texts {
        let line = by_id.remove(custom_id).expect(custom_id);
        assert!(line.api_error().is_none(), "{:?}", line.api_error());
        let vectors = embeddings_from_body(&line.response.unwrap().body).unwrap();
        for (i, text) in inputs.iter().enumerate() {
            let item = vectors.items.iter().position(|it| it.index == i as i64);
            assert_eq!(
                vectors.vector(item.unwrap()),
                simulate::embedding_vector(1024, text).as_slice(),
                "{custom_id} {text}"
            );
        }
        tokens += vectors.usage.unwrap().prompt_tokens;
    }
    assert_eq!(
        tokens,
        sim.ledger().batch_tokens,
        "usage is what was billed"
    );

    client.delete_file(&output).await.unwrap();
    client.delete_file(&file.id).await.unwrap();
    let gone = client.file_lines(&output, 1 << 20).await.err().unwrap();
    assert_eq!(gone.status, Some(404), "{gone}");
    assert!(!gone.message.contains("no route"), "{gone}");
    assert!(gone.to_string().contains(&output), "{gone}");
}

#[tokio::test]
async fn the_listing_pages_newest_first() {
    let sim = simulator(config(quick())).await;
    let client = client(&sim.base_url());
    let dir = tempfile::tempdir().unwrap();
    let mut ids = Vec::new();
    for part in ["0", "1", "2"] {
        ids.push(submit(&client, dir.path(), part).await.id);
    }
    ids.reverse();

    let first = client.batches(None, 2).await.unwrap();
    let seen: Vec<&str> = first.data.iter().map(|b| b.id.as_str()).collect();
    assert_eq!(seen, [ids[0].as_str(), ids[1].as_str()]);
    assert!(first.has_more);
    assert_eq!(first.last_id.as_deref(), Some(ids[1].as_str()));
    assert_eq!(first.data[0].metadata, metadata("2"));

    let second = client.batches(first.last_id.as_deref(), 2).await.unwrap();
    let seen: Vec<&str> = second.data.iter().map(|b| b.id.as_str()).collect();
    assert_eq!(seen, [ids[2].as_str()]);
    assert!(!second.has_more);
    // A limit past what the API takes is taken as its most, not refused.
    assert_eq!(client.batches(None, 1000).await.unwrap().data.len(), 3);
}

#[tokio::test]
async fn a_stuck_batch_is_cancelled() {
    let sim = simulator(config(BatchConfig {
        stuck: 1,
        ..quick()
    }))
    .await;
    let client = client(&sim.base_url());
    let dir = tempfile::tempdir().unwrap();
    let batch = submit(&client, dir.path(), "0").await;
    let cancelling = client.cancel_batch(&batch.id).await.unwrap();
    assert!(
        matches!(
            cancelling.status,
            BatchStatus::Cancelling | BatchStatus::Cancelled
        ),
        "{}",
        cancelling.status
    );
    assert_eq!(
        settle(&client, &batch.id).await.status,
        BatchStatus::Cancelled
    );
}

#[tokio::test]
async fn a_failed_validation_and_failed_lines_are_read() {
    let sim = simulator(config(BatchConfig {
        fail_validation: 1,
        line_failures: 1.0,
        ..quick()
    }))
    .await;
    let client = client(&sim.base_url());
    let dir = tempfile::tempdir().unwrap();
    let failed = settle(&client, &submit(&client, dir.path(), "0").await.id).await;
    assert_eq!(failed.status, BatchStatus::Failed);
    assert!(!failed.errors.is_empty());
    assert!(
        failed.errors.iter().all(|e| !e.message.is_empty()),
        "{:?}",
        failed.errors
    );

    let done = settle(&client, &submit(&client, dir.path(), "1").await.id).await;
    assert_eq!(done.status, BatchStatus::Completed);
    assert_eq!(done.request_counts.failed, 1);
    let errors = lines(&client, &done.error_file_id.unwrap()).await;
    assert_eq!(errors.len(), 1);
    let error = errors[0].api_error().expect("a failed line");
    assert_eq!(error.kind, ErrorKind::Transient, "{error}");
    assert_eq!(error.status, Some(500));
}

#[tokio::test]
async fn an_unknown_batch_and_a_missing_route_say_which() {
    let sim = simulator(config(quick())).await;
    let unknown = client(&sim.base_url())
        .batch("batch_nope")
        .await
        .unwrap_err();
    assert_eq!(unknown.status, Some(404));
    assert_eq!(unknown.kind, ErrorKind::Permanent);
    assert_eq!(unknown.endpoint, "GET /v1/batches/batch_nope");
    assert!(unknown.message.contains("batch_nope"), "{unknown}");
    assert!(!unknown.message.contains("no route"), "{unknown}");

    let mut wrong_path = ClientConfig::new(sim.base_url(), ApiKey::new(KEY));
    wrong_path.api_path = Some("/v2".into());
    let wrong_path = Client::new(wrong_path).unwrap();
    let missing = wrong_path.batch("batch_nope").await.unwrap_err();
    assert!(
        missing
            .message
            .contains("the server has no route GET /v2/batches/batch_nope"),
        "{missing}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = request_file(dir.path(), &[("p0-0", &["alpha"], true)]);
    let missing = wrong_path
        .upload_batch_file(&path, "embedjob-x-0.jsonl")
        .await
        .unwrap_err();
    // The server answers before it reads the body: the answer, or when the
    // write failed first, the listing asked after, says the route is missing.
    assert!(
        missing.message.contains("has no route") && missing.message.contains("/v2/"),
        "{missing}"
    );
    assert_eq!(missing.endpoint, "POST /v2/files");
    assert_eq!(missing.kind, ErrorKind::Permanent);
    for error in [&unknown, &missing] {
        assert!(!error.to_string().contains(KEY));
    }

    let absent = client(&sim.base_url())
        .upload_batch_file(&dir.path().join("absent.jsonl"), "absent.jsonl")
        .await
        .unwrap_err();
    assert_eq!(absent.kind, ErrorKind::Permanent);
    assert!(absent.message.contains("absent.jsonl"), "{absent}");
}

/// A server on 127.0.0.1 for two connections: the first (the upload) is
/// closed once its head is read, unanswered; the second (the listing) gets
/// `listing`, a whole HTTP response.
async fn cut_upload_server(listing: &'static str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        for answer in [None, Some(listing)] {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            // A request head is a few hundred bytes; 64 KiB bounds the loop.
            while !head.ends_with(b"\r\n\r\n") && head.len() < 64 * 1024 {
                if socket.read(&mut byte).await.unwrap_or(0) == 0 {
                    break;
                }
                head.push(byte[0]);
            }
            if let Some(answer) = answer {
                let _ = socket.write_all(answer.as_bytes()).await;
            }
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn an_upload_cut_off_asks_the_listing_whether_the_route_exists() {
    let dir = tempfile::tempdir().unwrap();
    let path = request_file(dir.path(), &[("p0-0", &["alpha"], true)]);
    let missing = "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n\
                   content-length: 82\r\nconnection: close\r\n\r\n\
                   {\"error\":{\"message\":\"Unknown request URL: GET /v1/batches.\",\"code\":\"unknown_url\"}}";
    let error = client(&cut_upload_server(missing).await)
        .upload_batch_file(&path, "embedjob-x-0.jsonl")
        .await
        .unwrap_err();
    assert_eq!(error.endpoint, "POST /v1/files");
    assert_eq!(error.kind, ErrorKind::Permanent, "{error}");
    assert!(
        error
            .message
            .contains("has no route GET /v1/batches?limit=1 either"),
        "{error}"
    );

    let listed = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                  content-length: 28\r\nconnection: close\r\n\r\n\
                  {\"data\":[],\"has_more\":false}";
    let error = client(&cut_upload_server(listed).await)
        .upload_batch_file(&path, "embedjob-x-0.jsonl")
        .await
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::Transient, "{error}");
    assert!(!error.message.contains("no route"), "{error}");
}

/// A scripted file content's lines, and the error that ends them if any.
async fn scripted_lines(pieces: &[&str], max: usize) -> (Vec<String>, Option<String>) {
    let mut reply = Scripted::json(200, "");
    reply.pieces = pieces.iter().map(|p| p.as_bytes().to_vec()).collect();
    let (base_url, _) = scripted_server(vec![reply]).await;
    let mut stream = Box::pin(client(&base_url).file_lines("file-xyz", max).await.unwrap());
    let mut ids = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(line) => ids.push(line.custom_id),
            Err(e) => {
                assert!(stream.next().await.is_none(), "the stream ends at {e}");
                return (ids, Some(e.to_string()));
            }
        }
    }
    (ids, None)
}

#[tokio::test]
async fn file_lines_end_with_an_error_when_cut_off_or_too_long() {
    let line = |id: &str| {
        format!("{{\"custom_id\":\"{id}\",\"error\":{{\"code\":\"x\",\"message\":\"m\"}}}}\n")
    };
    let (a, b) = (line("a"), line("b"));
    let whole = format!("{a}{b}");
    let (ids, error) = scripted_lines(&[&whole[..10], &whole[10..50], &whole[50..]], 200).await;
    assert_eq!((ids, error), (vec!["a".to_string(), "b".to_string()], None));

    let (ids, error) = scripted_lines(&[&a, &b[..b.len() - 3]], 200).await;
    assert_eq!(ids, ["a"]);
    let error = error.expect("a cut-off body is an error");
    assert!(
        error.contains("file-xyz") && error.contains("cut off inside line 2"),
        "{error}"
    );

    let long = format!("{{\"custom_id\":\"{}\"}}\n", "x".repeat(300));
    let (ids, error) = scripted_lines(&[&a, &long, &b], 200).await;
    assert_eq!(ids, ["a"]);
    let error = error.expect("a line past the bound is an error");
    assert!(
        error.contains("line 2 of file file-xyz is longer than 200 bytes"),
        "{error}"
    );
}

#[tokio::test]
async fn a_body_reset_midway_ends_the_lines_with_an_error() {
    let mut reply = Scripted::json(200, "");
    reply.pieces = vec![b"{\"custom_id\":\"a\"}\n{\"custom_id\":\"b\"}\n".to_vec()];
    reply.abort = true;
    let (base_url, seen) = scripted_server(vec![reply]).await;
    let items: Vec<_> = client(&base_url)
        .file_lines("file-r", 1024)
        .await
        .unwrap()
        .collect()
        .await;
    // The server may reset before its last piece is flushed: whatever lines
    // came, the stream ends with the error, never silently short.
    let (error, lines) = items.split_last().unwrap();
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l.as_ref().unwrap().custom_id.as_str())
        .collect();
    assert!(["a", "b"].starts_with(&ids), "{ids:?}");
    let error = error.as_ref().unwrap_err();
    assert_eq!(error.kind, ErrorKind::Transient, "{error}");
    assert_eq!(error.endpoint, "GET /v1/files/file-r/content");
    let sent = seen.lock().unwrap()[0]["authorization"].clone();
    assert_eq!(sent.to_str().unwrap(), format!("Bearer {KEY}"));
}

#[tokio::test]
async fn a_bad_line_is_named_and_the_rest_still_come() {
    let mut reply = Scripted::json(200, "");
    reply.pieces = vec![b"{\"custom_id\":\"a\"}\nnot json\n{\"custom_id\":\"c\"}\n".to_vec()];
    let (base_url, _) = scripted_server(vec![reply]).await;
    let items: Vec<_> = client(&base_url)
        .file_lines("file-q", 1024)
        .await
        .unwrap()
        .collect()
        .await;
    assert_eq!(items.len(), 3);
    assert_eq!(items[0].as_ref().unwrap().custom_id, "a");
    let error = items[1].as_ref().unwrap_err();
    assert!(error.message.contains("line 2 of file file-q"), "{error}");
    assert_eq!(items[2].as_ref().unwrap().custom_id, "c");
}
