//! The simulator's Batch API: files, the batch lifecycle, the listing, the
//! limits, each fault flag, and answers equal to the synchronous route's.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use embedjob::simulate::{count_tokens, BatchConfig, SimConfig, Simulator};
use serde_json::{json, Value};

const KEY: &str = "sk-batch-test";
const MODEL: &str = "svc-embed-1";
/// Polls of a batch before a test gives up: with 10 ms between polls, far
/// more than a batch of `Duration::ZERO` (or 1 s) needs.
const MAX_POLLS: usize = 3000;

struct Api {
    sim: Simulator,
    http: reqwest::Client,
}

impl Api {
    async fn start(batches: BatchConfig) -> Api {
        Api::with(SimConfig {
            batches,
            ..SimConfig::default()
        })
        .await
    }

    async fn with(config: SimConfig) -> Api {
        Api {
            sim: Simulator::start(config).await.expect("simulator starts"),
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}/v1{path}", self.sim.base_url())
    }

    /// The status and JSON body of a request.
    async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        let response = request.bearer_auth(KEY).send().await.expect("an answer");
        let status = response.status().as_u16();
        let body = response.bytes().await.expect("a whole body");
        let value = serde_json::from_slice(&body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
        (status, value)
    }

    async fn upload_as(&self, purpose: &str, filename: &str, content: &[u8]) -> (u16, Value) {
        let boundary = "----embedjob-test-boundary";
        let mut body = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\
             Content-Type: application/octet-stream\r\n\r\n"
        )
        .into_bytes();
        body.extend_from_slice(content);
        body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        let request = self
            .http
            .post(self.url("/files"))
            .header(
                "content-type",
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body);
        self.send(request).await
    }

    async fn upload(&self, content: &str) -> String {
        let (status, file) = self
            .upload_as("batch", "in.jsonl", content.as_bytes())
            .await;
        assert_eq!(status, 200, "{file}");
        assert_eq!(file["purpose"], "batch");
        assert_eq!(file["bytes"], content.len());
        file["id"].as_str().unwrap().to_string()
    }

    async fn create_raw(&self, body: &Value) -> (u16, Value) {
        self.send(self.http.post(self.url("/batches")).json(body))
            .await
    }

    async fn create(&self, file_id: &str, metadata: Value) -> Value {
        let (status, batch) = self
            .create_raw(
                &json!({"input_file_id": file_id, "endpoint": "/v1/embeddings",
                                "completion_window": "24h", "metadata": metadata}),
            )
            .await;
        assert_eq!(status, 200, "{batch}");
        batch
    }

    async fn batch(&self, id: &str) -> Value {
        let (status, batch) = self
            .send(self.http.get(self.url(&format!("/batches/{id}"))))
            .await;
        assert_eq!(status, 200, "{batch}");
        batch
    }

    /// Polls until `done` holds of the batch.
    async fn until(&self, id: &str, done: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..MAX_POLLS {
            let batch = self.batch(id).await;
            if done(&batch) {
                return batch;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("batch {id} never got there: {}", self.batch(id).await);
    }

    async fn finished(&self, id: &str) -> Value {
        self.until(id, |batch| {
            ["completed", "failed", "expired", "cancelled"]
                .contains(&batch["status"].as_str().unwrap_or_default())
        })
        .await
    }

    /// The lines of a file's content.
    async fn lines(&self, file_id: &Value) -> Vec<Value> {
        let id = file_id.as_str().expect("a file id");
        let response = self
            .http
            .get(self.url(&format!("/files/{id}/content")))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let text = response.text().await.unwrap();
        assert!(text.ends_with('\n'), "every line ends");
        text.lines()
            .map(|line| serde_json::from_str(line).expect("each line is JSON"))
            .collect()
    }

    /// The synchronous route's answer to `body`.
    async fn sync(&self, body: &Value) -> Value {
        let (status, answer) = self
            .send(self.http.post(self.url("/embeddings")).json(body))
            .await;
        assert_eq!(status, 200, "{answer}");
        answer
    }
}

fn body(texts: &[&str]) -> Value {
    json!({"model": MODEL, "input": texts, "encoding_format": "base64"})
}

fn line(custom_id: &str, body: &Value) -> String {
    format!(
        "{}\n",
        json!({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings", "body": body})
    )
}

/// `n` lines of two texts each, `p{i}`.
fn file(n: usize) -> String {
    (0..n)
        .map(|i| {
            line(
                &format!("p{i}"),
                &body(&[&format!("text {i}"), &format!("more {i}")]),
            )
        })
        .collect()
}

fn instant() -> BatchConfig {
    BatchConfig {
        duration: Duration::ZERO,
        ..BatchConfig::default()
    }
}

fn by_custom_id(lines: &[Value]) -> BTreeMap<String, Value> {
    let map: BTreeMap<String, Value> = lines
        .iter()
        .map(|line| {
            (
                line["custom_id"].as_str().unwrap().to_string(),
                line.clone(),
            )
        })
        .collect();
    assert_eq!(map.len(), lines.len(), "each custom_id once");
    map
}

#[tokio::test]
async fn a_batch_runs_to_completion_with_the_sync_routes_answers_billed() {
    let api = Api::start(instant()).await;
    let float = json!({"model": MODEL, "input": ["a float line"], "encoding_format": "float"});
    let content = file(6) + &line("float", &float);
    let file_id = api.upload(&content).await;
    let metadata = json!({"embedjob_job": "docs", "embedjob_part": "3"});
    let created = api.create(&file_id, metadata.clone()).await;
    assert_eq!(created["status"], "validating");
    assert_eq!(created["metadata"], metadata);
    assert_eq!(created["input_file_id"], file_id.as_str());
    let id = created["id"].as_str().unwrap();

    let done = api.finished(id).await;
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(
        done["request_counts"],
        json!({"total": 7, "completed": 7, "failed": 0})
    );
    assert!(done["error_file_id"].is_null());
    for stage in ["in_progress_at", "finalizing_at", "completed_at"] {
        assert!(done[stage].is_u64(), "{stage} stamped: {done}");
    }
    let lines = by_custom_id(&api.lines(&done["output_file_id"]).await);
    assert_eq!(lines.len(), 7);
    let ledger_before_sync = api.sim.ledger();
    let mut usage = 0;
    for (custom_id, line) in &lines {
        assert_eq!(line["error"], Value::Null);
        assert_eq!(line["response"]["status_code"], 200);
        let sent = if custom_id == "float" {
            float.clone()
        } else {
            let i = &custom_id[1..];
            body(&[&format!("text {i}"), &format!("more {i}")])
        };
        // The same answer, vectors (base64 or floats) and usage, as the synchronous route's.
        assert_eq!(
            line["response"]["body"],
            api.sync(&sent).await,
            "{custom_id}"
        );
        usage += line["response"]["body"]["usage"]["prompt_tokens"]
            .as_u64()
            .unwrap();
    }
    assert!(lines["float"]["response"]["body"]["data"][0]["embedding"].is_array());
    assert!(lines["p0"]["response"]["body"]["data"][0]["embedding"].is_string());
    assert_eq!(done["usage"]["input_tokens"], usage);

    assert_eq!(ledger_before_sync.batch_lines_billed, 7);
    assert_eq!(ledger_before_sync.batch_tokens, usage);
    assert_eq!(ledger_before_sync.prompt_tokens, usage);
    assert_eq!(ledger_before_sync.batches_created, 1);
    assert_eq!(ledger_before_sync.texts_billed_twice(), 0);
    // Each of the 13 texts was billed again by the synchronous requests above.
    assert_eq!(api.sim.ledger().texts_billed_twice(), 13);

    // The input cannot be downloaded, as on OpenAI; files go when deleted.
    let (status, _) = api
        .send(api.http.get(api.url(&format!("/files/{file_id}/content"))))
        .await;
    assert_eq!(status, 400);
    let output = done["output_file_id"].as_str().unwrap();
    let (status, deleted) = api
        .send(api.http.delete(api.url(&format!("/files/{output}"))))
        .await;
    assert_eq!((status, &deleted["deleted"]), (200, &json!(true)));
    let (status, gone) = api
        .send(api.http.get(api.url(&format!("/files/{output}/content"))))
        .await;
    assert_eq!(status, 404, "{gone}");
    assert_eq!(gone["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn the_listing_pages_newest_first_with_metadata_as_given() {
    let api = Api::start(instant()).await;
    let file_id = api.upload(&file(1)).await;
    let mut ids = Vec::new();
    for part in 0..5 {
        let batch = api
            .create(&file_id, json!({"part": part.to_string()}))
            .await;
        ids.push(batch["id"].as_str().unwrap().to_string());
    }
    ids.reverse();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    // 5 batches, 2 a page: 3 pages, the last one without more.
    for page in 0..3 {
        let query = after
            .as_ref()
            .map_or(String::new(), |a| format!("&after={a}"));
        let (status, list) = api
            .send(api.http.get(api.url(&format!("/batches?limit=2{query}"))))
            .await;
        assert_eq!(status, 200, "{list}");
        let data = list["data"].as_array().unwrap();
        assert_eq!(list["has_more"], page < 2, "{list}");
        assert_eq!(list["first_id"], data[0]["id"]);
        assert_eq!(list["last_id"], data[data.len() - 1]["id"]);
        for batch in data {
            let id = batch["id"].as_str().unwrap().to_string();
            let part = 4 - ids.iter().position(|i| *i == id).unwrap();
            assert_eq!(batch["metadata"], json!({"part": part.to_string()}));
            seen.push(id);
        }
        after = list["last_id"].as_str().map(str::to_string);
    }
    assert_eq!(seen, ids);
    let (status, _) = api.send(api.http.get(api.url("/batches?limit=101"))).await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn uploads_and_creations_are_refused_as_openai_refuses_them() {
    let api = Api::start(BatchConfig {
        max_file_bytes: 100,
        ..instant()
    })
    .await;
    let (status, error) = api.upload_as("batch", "in.jsonl", &[b'x'; 101]).await;
    assert_eq!(status, 400, "{error}");
    assert_eq!(error["error"]["param"], "file");
    let (status, _) = api.upload_as("batch", "in.csv", b"{}\n").await;
    assert_eq!(status, 400);
    let (status, _) = api.upload_as("fine-tune", "in.jsonl", b"{}\n").await;
    assert_eq!(status, 400);
    let file_id = api.upload("{}\n").await;
    let create = |file: &str, endpoint: &str, window: &str, metadata: Value| {
        json!({"input_file_id": file, "endpoint": endpoint, "completion_window": window,
               "metadata": metadata})
    };
    let cases = [
        (
            create("file-nope", "/v1/embeddings", "24h", Value::Null),
            404,
            Value::Null,
        ),
        (
            create(&file_id, "/v1/chat/completions", "24h", Value::Null),
            400,
            json!("endpoint"),
        ),
        (
            create(&file_id, "/v1/embeddings", "48h", Value::Null),
            400,
            json!("completion_window"),
        ),
        (
            create(&file_id, "/v1/embeddings", "24h", json!({"k": 1})),
            400,
            json!("metadata.k"),
        ),
        (
            create(
                &file_id,
                "/v1/embeddings",
                "24h",
                Value::Object((0..17).map(|i| (i.to_string(), json!("v"))).collect()),
            ),
            400,
            json!("metadata"),
        ),
    ];
    for (request, status, param) in cases {
        let (got, error) = api.create_raw(&request).await;
        assert_eq!(got, status, "{request} -> {error}");
        assert_eq!(error["error"]["type"], "invalid_request_error");
        if !param.is_null() {
            assert_eq!(error["error"]["param"], param, "{error}");
        }
    }
    let (status, _) = api.send(api.http.get(api.url("/batches/batch_nope"))).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_malformed_file_or_one_over_the_limits_fails_validation_naming_the_line() {
    let api = Api::start(BatchConfig {
        max_lines: 3,
        max_inputs: 5,
        ..instant()
    })
    .await;
    let malformed = file(1) + "{\"custom_id\": \n" + &file(1);
    let cases = [
        (malformed, "invalid_json_line", Some(2)),
        // 4 lines, one more than allowed.
        (file(4), "too_many_tasks", None),
        // 3 lines of 2 inputs: 6 inputs, one more than allowed.
        (file(3), "too_many_tasks", None),
    ];
    for (content, code, line) in cases {
        let file_id = api.upload(&content).await;
        let batch = api.create(&file_id, Value::Null).await;
        let failed = api.finished(batch["id"].as_str().unwrap()).await;
        assert_eq!(failed["status"], "failed", "{failed}");
        let error = &failed["errors"]["data"][0];
        assert_eq!(error["code"], code, "{failed}");
        assert_eq!(error["line"], json!(line), "{failed}");
        assert!(failed["output_file_id"].is_null());
    }
    assert_eq!(api.sim.ledger().batch_lines_billed, 0);
}

#[tokio::test]
async fn the_first_batches_fail_validation_when_told_to() {
    let api = Api::start(BatchConfig {
        fail_validation: 1,
        ..instant()
    })
    .await;
    let file_id = api.upload(&file(2)).await;
    let first = api.create(&file_id, Value::Null).await;
    let first = api.finished(first["id"].as_str().unwrap()).await;
    assert_eq!(first["status"], "failed");
    assert_eq!(first["errors"]["data"][0]["code"], "invalid_request");
    let second = api.create(&file_id, Value::Null).await;
    let second = api.finished(second["id"].as_str().unwrap()).await;
    assert_eq!(second["status"], "completed");
}

#[tokio::test]
async fn the_enqueued_token_quota_fails_a_batch_until_an_earlier_one_ends() {
    // A stuck batch holds its tokens (those of its four texts); the quota
    // takes one batch and not two.
    let tokens: u64 = ["text 0", "more 0", "text 1", "more 1"]
        .iter()
        .map(|text| u64::from(count_tokens(text)))
        .sum();
    let api = Api::start(BatchConfig {
        enqueued_tokens: Some(tokens + 1),
        stuck: 1,
        ..instant()
    })
    .await;
    let file_id = api.upload(&file(2)).await;
    let stuck = api.create(&file_id, Value::Null).await;
    let stuck = stuck["id"].as_str().unwrap();
    api.until(stuck, |batch| batch["status"] == "in_progress")
        .await;
    let refused = api.create(&file_id, Value::Null).await;
    let refused = api.finished(refused["id"].as_str().unwrap()).await;
    assert_eq!(refused["status"], "failed");
    let error = &refused["errors"]["data"][0];
    assert_eq!(error["code"], "token_limit_exceeded", "{refused}");
    assert!(error["message"]
        .as_str()
        .unwrap()
        .contains(&format!("Limit: {} enqueued tokens", tokens + 1)));
    let (status, _) = api
        .send(api.http.post(api.url(&format!("/batches/{stuck}/cancel"))))
        .await;
    assert_eq!(status, 200);
    api.finished(stuck).await;
    let after = api.create(&file_id, Value::Null).await;
    let after = api.finished(after["id"].as_str().unwrap()).await;
    assert_eq!(after["status"], "completed", "{after}");
}

#[tokio::test]
async fn a_stuck_batch_stays_in_progress_until_cancelled_with_its_lines_so_far() {
    let api = Api::start(BatchConfig {
        stuck: 1,
        ..instant()
    })
    .await;
    let file_id = api.upload(&file(6)).await;
    let batch = api.create(&file_id, Value::Null).await;
    let id = batch["id"].as_str().unwrap();
    // Half its 6 lines run, then it stays.
    let stuck = api
        .until(id, |batch| batch["request_counts"]["completed"] == 3)
        .await;
    assert_eq!(stuck["status"], "in_progress");
    let (status, cancelling) = api
        .send(api.http.post(api.url(&format!("/batches/{id}/cancel"))))
        .await;
    assert_eq!(status, 200);
    assert_eq!(cancelling["status"], "cancelling");
    let cancelled = api.finished(id).await;
    assert_eq!(cancelled["status"], "cancelled");
    assert_eq!(api.lines(&cancelled["output_file_id"]).await.len(), 3);
    assert_eq!(api.sim.ledger().batch_lines_billed, 3);
    let (status, _) = api
        .send(api.http.post(api.url(&format!("/batches/{id}/cancel"))))
        .await;
    assert_eq!(status, 400, "a cancelled batch cannot be cancelled again");
}

#[tokio::test]
async fn an_expired_batch_keeps_the_lines_done_and_expires_the_rest() {
    // 1 s: in progress from 0.1 s to 0.9 s, 8 lines due one every 0.1 s;
    // expiring at 0.5 s leaves (0.5 - 0.1) / 0.8 * 8 = 4 lines done.
    let api = Api::start(BatchConfig {
        duration: Duration::from_secs(1),
        expire_after: Some(Duration::from_millis(500)),
        ..BatchConfig::default()
    })
    .await;
    let file_id = api.upload(&file(8)).await;
    let batch = api.create(&file_id, Value::Null).await;
    let expired = api.finished(batch["id"].as_str().unwrap()).await;
    assert_eq!(expired["status"], "expired", "{expired}");
    assert_eq!(
        expired["request_counts"],
        json!({"total": 8, "completed": 4, "failed": 4})
    );
    let done = by_custom_id(&api.lines(&expired["output_file_id"]).await);
    let rest = by_custom_id(&api.lines(&expired["error_file_id"]).await);
    for line in rest.values() {
        assert_eq!(line["response"], Value::Null);
        assert_eq!(line["error"]["code"], "batch_expired");
    }
    let all: BTreeSet<&String> = done.keys().chain(rest.keys()).collect();
    assert_eq!(all.len(), 8, "each line in one file");
    let ledger = api.sim.ledger();
    assert_eq!(
        (ledger.batch_lines_billed, ledger.batch_lines_expired),
        (4, 4)
    );
}

#[tokio::test]
async fn failed_lines_go_to_the_error_file_unbilled() {
    let api = Api::with(SimConfig {
        poison: Some("POISON".to_string()),
        max_inputs_per_request: Some(2),
        batches: instant(),
        ..SimConfig::default()
    })
    .await;
    let content = file(2)
        + &line("bad", &body(&["a POISON text"]))
        + &line("wide", &body(&["one", "two", "three"]));
    let file_id = api.upload(&content).await;
    let batch = api.create(&file_id, Value::Null).await;
    let done = api.finished(batch["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed");
    assert_eq!(
        done["request_counts"],
        json!({"total": 4, "completed": 2, "failed": 2})
    );
    let errors = by_custom_id(&api.lines(&done["error_file_id"]).await);
    let refused = |id: &str| errors[id]["response"]["body"]["error"]["code"].clone();
    assert_eq!(errors["bad"]["response"]["status_code"], 400);
    assert_eq!(refused("bad"), "context_length_exceeded");
    // The synchronous route's refusal of too many inputs: 413 by default.
    assert_eq!(errors["wide"]["response"]["status_code"], 413);
    assert_eq!(refused("wide"), "too_many_inputs");
    assert_eq!(api.sim.ledger().batch_lines_billed, 2);

    let failing = Api::start(BatchConfig {
        line_failures: 1.0,
        ..instant()
    })
    .await;
    let file_id = failing.upload(&file(3)).await;
    let batch = failing.create(&file_id, Value::Null).await;
    let done = failing.finished(batch["id"].as_str().unwrap()).await;
    assert_eq!(
        done["request_counts"],
        json!({"total": 3, "completed": 0, "failed": 3})
    );
    assert!(done["output_file_id"].is_null());
    for line in failing.lines(&done["error_file_id"]).await {
        assert_eq!(line["response"]["status_code"], 500);
        assert_eq!(line["response"]["body"]["error"]["type"], "server_error");
    }
    let ledger = failing.sim.ledger();
    assert_eq!((ledger.batch_lines_billed, ledger.prompt_tokens), (0, 0));
    assert_eq!(ledger.batch_lines_failed, 3);
}

#[tokio::test]
async fn output_lines_are_shuffled_unless_asked_for_in_order() {
    let ids = |lines: Vec<Value>| -> Vec<String> {
        lines
            .iter()
            .map(|line| line["custom_id"].as_str().unwrap().to_string())
            .collect()
    };
    let input: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
    for in_order in [false, true] {
        let api = Api::start(BatchConfig {
            in_order,
            ..instant()
        })
        .await;
        let file_id = api.upload(&file(20)).await;
        let batch = api.create(&file_id, Value::Null).await;
        let done = api.finished(batch["id"].as_str().unwrap()).await;
        let got = ids(api.lines(&done["output_file_id"]).await);
        // Seed 0 shuffles 20 lines; 1 in 20! that it leaves them be.
        assert_eq!(got == input, in_order, "{got:?}");
        assert_eq!(got.iter().collect::<BTreeSet<_>>(), input.iter().collect());
    }
}

#[tokio::test]
async fn a_dropped_creation_still_creates_the_batch_found_in_the_listing() {
    let api = Api::start(BatchConfig {
        create_drop: 1,
        ..instant()
    })
    .await;
    let file_id = api.upload(&file(2)).await;
    let request = json!({"input_file_id": file_id, "endpoint": "/v1/embeddings",
                         "completion_window": "24h", "metadata": {"embedjob_part": "0"}});
    let sent = api
        .http
        .post(api.url("/batches"))
        .bearer_auth(KEY)
        .json(&request)
        .send()
        .await;
    let answered = match sent {
        Ok(response) => response.bytes().await.is_ok(),
        Err(_) => false,
    };
    assert!(!answered, "the answer is dropped");
    let (_, list) = api.send(api.http.get(api.url("/batches"))).await;
    let adopted = &list["data"][0];
    assert_eq!(adopted["metadata"], json!({"embedjob_part": "0"}));
    let done = api.finished(adopted["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed");
    let ledger = api.sim.ledger();
    assert_eq!(
        (ledger.batches_created, ledger.batch_creates_dropped),
        (1, 1)
    );
    // Only the first is dropped.
    api.create(&file_id, Value::Null).await;
}

#[derive(clap::Parser)]
struct Cli {
    #[command(flatten)]
    options: embedjob::simulate::SimulateOptions,
}

fn flags(args: &[&str]) -> Result<SimConfig, String> {
    use clap::Parser as _;
    let argv = std::iter::once("simulate").chain(args.iter().copied());
    Cli::try_parse_from(argv)
        .expect("flags parse")
        .options
        .to_config()
}

#[test]
fn the_batch_flags_build_the_configuration_and_bad_ones_are_named() {
    let config = flags(&[
        "--batch-seconds",
        "2.5",
        "--batch-enqueued-tokens",
        "1000",
        "--batch-fail-validation",
        "1",
        "--batch-line-failures",
        "0.1",
        "--batch-expire-after",
        "1",
        "--batch-expire-first",
        "2",
        "--batch-stuck",
        "3",
        "--batch-in-order",
        "--batch-create-drop",
        "4",
        "--batch-max-lines",
        "10",
    ])
    .expect("valid flags");
    assert_eq!(
        config.batches,
        BatchConfig {
            duration: Duration::from_millis(2500),
            enqueued_tokens: Some(1000),
            fail_validation: 1,
            line_failures: 0.1,
            expire_after: Some(Duration::from_secs(1)),
            expire_first: Some(2),
            stuck: 3,
            in_order: true,
            create_drop: 4,
            max_lines: 10,
            ..BatchConfig::default()
        }
    );
    assert_eq!(
        flags(&[]).expect("defaults").batches,
        BatchConfig::default()
    );
    let problems = flags(&[
        "--batch-line-failures",
        "1.5",
        "--batch-seconds=-1",
        "--batch-max-inputs",
        "0",
    ])
    .expect_err("invalid flags");
    for flag in [
        "--batch-line-failures",
        "--batch-seconds",
        "--batch-max-inputs",
    ] {
        assert!(problems.contains(flag), "{flag} in {problems}");
    }
}

/// The official `openai` Python package's Batch API calls against the simulator.
#[tokio::test]
async fn the_openai_python_client_runs_a_batch_against_the_simulator() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var_os("EMBEDJOB_REFERENCE_PYTHON").map_or_else(
        || root.join(".cache/venv/bin/python"),
        std::path::PathBuf::from,
    );
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup-python (scripts/test does)",
        python.display()
    );
    let api = Api::start(instant()).await;
    let mut command = std::process::Command::new(python);
    command
        .arg(root.join("tests/reference/openai_batch.py"))
        .env("OPENAI_BASE_URL", api.url(""))
        .env("OPENAI_API_KEY", KEY)
        .env_remove("OPENAI_ORG_ID")
        .env_remove("HTTPS_PROXY")
        .env_remove("HTTP_PROXY")
        .env_remove("ALL_PROXY");
    let output = crate::support::run(command).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let report: Value = serde_json::from_slice(&output.stdout).expect("a JSON report");
    assert_eq!(report["file"]["bytes"], report["file"]["expected"]);
    assert_eq!(report["created_status"], "validating");
    assert_eq!(report["status"], "completed");
    assert_eq!(
        report["counts"],
        json!({"total": 5, "completed": 5, "failed": 0})
    );
    assert_eq!(report["metadata"], json!({"embedjob_part": "0"}));
    let lines = report["lines"].as_object().unwrap();
    assert_eq!(lines.len(), 5);
    for (custom_id, vector) in lines {
        // The client asked for floats: the default encoding.
        let text = format!("text {}", &custom_id[1..]);
        let vector: Vec<f32> = serde_json::from_value(vector.clone()).unwrap();
        assert_eq!(vector, embedjob::simulate::embedding_vector(1024, &text));
    }
    assert_eq!(report["cancel_status"], "cancelling");
    let mut created = report["batches"].as_array().unwrap().clone();
    created.reverse();
    assert_eq!(
        report["listed"],
        Value::Array(created),
        "newest first, every page"
    );
    assert_eq!(report["deleted"], true);
}

#[tokio::test]
async fn files_are_listed_newest_first_by_purpose() {
    let api = Api::start(instant()).await;
    let mut uploaded = Vec::new();
    for n in 1..=3 {
        uploaded.push(api.upload(&file(n)).await);
    }
    uploaded.reverse();
    let list = |query: String| {
        let request = api.http.get(api.url(&format!("/files?{query}")));
        api.send(request)
    };
    let (status, first) = list("purpose=batch&limit=2".to_string()).await;
    assert_eq!(status, 200, "{first}");
    let ids = |page: &Value| -> Vec<String> {
        page["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|file| file["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&first), uploaded[..2]);
    assert_eq!(first["has_more"], true);
    let after = first["last_id"].as_str().unwrap();
    let (_, second) = list(format!("purpose=batch&limit=2&after={after}")).await;
    assert_eq!(ids(&second), uploaded[2..]);
    assert_eq!(second["has_more"], false);

    let batch = api.create(&uploaded[0], Value::Null).await;
    let done = api.finished(batch["id"].as_str().unwrap()).await;
    let (_, outputs) = list("purpose=batch_output".to_string()).await;
    assert_eq!(ids(&outputs), [done["output_file_id"].as_str().unwrap()]);
    let (status, _) = api
        .send(api.http.delete(api.url(&format!("/files/{}", uploaded[1]))))
        .await;
    assert_eq!(status, 200);
    let (_, left) = list("purpose=batch".to_string()).await;
    assert_eq!(ids(&left), [uploaded[0].clone(), uploaded[2].clone()]);
}

#[tokio::test]
async fn hostile_files_and_lines_end_in_errors_not_panics() {
    let api = Api::start(instant()).await;
    // Lines validation accepts but the synchronous route refuses: each ends in the error file.
    let refused = [
        json!({"model": MODEL, "input": [[-1]]}),
        json!({"model": MODEL, "input": [[4_294_967_296u64]]}),
        json!({"model": MODEL, "input": []}),
        json!({"model": MODEL, "input": ""}),
        json!({"model": MODEL, "input": [null]}),
        json!({"model": MODEL, "input": ["x"], "dimensions": 1e300}),
        json!({"model": MODEL, "input": ["x"], "dimensions": 0}),
        json!({"model": MODEL, "input": ["x"], "encoding_format": "hex"}),
        json!({"model": MODEL}),
    ];
    let content: String = refused
        .iter()
        .enumerate()
        .map(|(i, body)| line(&format!("r{i}"), body))
        .collect();
    let file_id = api.upload(&content).await;
    let batch = api.create(&file_id, Value::Null).await;
    let done = api.finished(batch["id"].as_str().unwrap()).await;
    assert_eq!(done["status"], "completed", "{done}");
    let errors = api.lines(&done["error_file_id"]).await;
    assert_eq!(errors.len(), refused.len());
    for error in &errors {
        assert_eq!(error["response"]["status_code"], 400, "{error}");
        assert_eq!(
            error["response"]["body"]["error"]["type"],
            "invalid_request_error"
        );
    }
    // Files validation refuses, whatever their bytes.
    let files: [&[u8]; 6] = [
        b"\xff\xfe\x00garbage\n",
        b"[1, 2, 3]\n",
        b"{\"custom_id\": 7, \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": {}}\n",
        b"{\"custom_id\": \"a\", \"method\": \"GET\", \"url\": \"/v1/embeddings\", \"body\": {}}\n",
        b"{\"custom_id\": \"a\", \"method\": \"POST\", \"url\": \"/v1/embeddings\", \"body\": \"x\"}\n",
        b"\n\n\n",
    ];
    for bytes in files {
        let (status, file) = api.upload_as("batch", "in.jsonl", bytes).await;
        assert_eq!(status, 200, "{file}");
        let batch = api.create(file["id"].as_str().unwrap(), Value::Null).await;
        let failed = api.finished(batch["id"].as_str().unwrap()).await;
        assert_eq!(failed["status"], "failed", "{failed}");
        assert_eq!(failed["errors"]["data"][0]["line"], 1, "{failed}");
    }
    // Uploads that are not multipart, or cut short, are refused.
    for (content_type, body) in [
        ("application/json", "{}"),
        ("multipart/form-data; boundary=b", "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n\r\nno end"),
        ("multipart/form-data; boundary=b", "no boundary at all"),
    ] {
        let request = api
            .http
            .post(api.url("/files"))
            .header("content-type", content_type)
            .body(body);
        let (status, error) = api.send(request).await;
        assert_eq!(status, 400, "{content_type}: {error}");
    }
    assert_eq!(api.sim.ledger().batch_lines_billed, 0);
}

impl Api {
    /// The answer to an upload of `body` (with the boundary `b`), sent whole
    /// or in `pieces` of that many bytes.
    async fn upload_raw(&self, body: Vec<u8>, pieces: Option<usize>) -> (u16, Value) {
        let body = match pieces {
            None => reqwest::Body::from(body),
            Some(size) => {
                let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
                    body.chunks(size).map(|piece| Ok(piece.to_vec())).collect();
                reqwest::Body::wrap_stream(futures::stream::iter(pieces))
            }
        };
        let request = self
            .http
            .post(self.url("/files"))
            .header("content-type", "multipart/form-data; boundary=b")
            .body(body);
        self.send(request).await
    }
}

/// A form of `parts`, each a part's headers and its value, with the boundary `b`.
fn form(parts: &[(&str, &[u8])]) -> Vec<u8> {
    let mut body = Vec::new();
    for (headers, value) in parts {
        body.extend_from_slice(format!("--b\r\n{headers}\r\n\r\n").as_bytes());
        body.extend_from_slice(value);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(b"--b--\r\n");
    body
}

const PURPOSE: &str = "Content-Disposition: form-data; name=\"purpose\"";
const FILE: &str = "Content-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"";

#[tokio::test]
async fn an_upload_split_anywhere_is_stored_whole_past_the_body_limit_of_other_routes() {
    // Other routes refuse bodies over 1 KiB; the upload route takes files up to the file limit.
    let api = Api::with(SimConfig {
        max_body_bytes: 1024,
        batches: instant(),
        ..SimConfig::default()
    })
    .await;
    // 200 lines (about 24 KiB) whose texts look like the boundary and its end.
    let content: String = (0..200)
        .map(|i| line(&format!("p{i}"), &body(&[&format!("--b--\n--b {i}")])))
        .collect();
    // 7-byte pieces cut the delimiter at every place.
    let (status, file) = api
        .upload_raw(
            form(&[(PURPOSE, b"batch"), (FILE, content.as_bytes())]),
            Some(7),
        )
        .await;
    assert_eq!(status, 200, "{file}");
    assert_eq!(file["bytes"], content.len());
    assert_eq!(file["filename"], "in.jsonl");
    // Every line came through whole: the batch answers each.
    let batch = api.create(file["id"].as_str().unwrap(), Value::Null).await;
    let done = api.finished(batch["id"].as_str().unwrap()).await;
    assert_eq!(
        done["request_counts"],
        json!({"total": 200, "completed": 200, "failed": 0}),
        "{done}"
    );
    assert_eq!(
        by_custom_id(&api.lines(&done["output_file_id"]).await).len(),
        200
    );
}

#[tokio::test]
async fn malformed_forms_end_in_a_400_naming_what_is_wrong() {
    let api = Api::start(BatchConfig {
        max_file_bytes: 100,
        ..instant()
    })
    .await;
    let small = 16 * 1024;
    let long = vec![b'x'; small + 1];
    let other = "Content-Disposition: form-data; name=\"other\"";
    let cases: [(Vec<u8>, Value, &str); 7] = [
        // No file part.
        (
            form(&[(PURPOSE, b"batch")]),
            json!("file"),
            "Missing required parameter",
        ),
        // No purpose.
        (
            form(&[(FILE, b"{}")]),
            json!("purpose"),
            "Missing required parameter",
        ),
        // A small field one byte past its 16 KiB, kept or dropped.
        (
            form(&[(PURPOSE, &long), (FILE, b"{}")]),
            Value::Null,
            "too long",
        ),
        (
            form(&[(other, &long), (PURPOSE, b"batch"), (FILE, b"{}")]),
            Value::Null,
            "too long",
        ),
        // Two files.
        (
            form(&[(PURPOSE, b"batch"), (FILE, b"{}"), (FILE, b"{}")]),
            Value::Null,
            "more than one file",
        ),
        // A file one byte over the limit.
        (
            form(&[(PURPOSE, b"batch"), (FILE, &[b'x'; 101])]),
            json!("file"),
            "File is too large",
        ),
        // Part headers that never end, one byte past the body's limit (the file's 100
        // bytes and 1 MiB of form), sent whole so that the server reads it all.
        (
            [
                b"--b\r\nX-Long: ".as_slice(),
                &vec![b'x'; (1 << 20) + 101 - 13],
            ]
            .concat(),
            json!("file"),
            "File is too large",
        ),
    ];
    for (body, param, message) in cases {
        let shown = String::from_utf8_lossy(&body[..body.len().min(120)]).into_owned();
        let (status, error) = api.upload_raw(body, None).await;
        assert_eq!(status, 400, "{shown}: {error}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
        assert_eq!(error["error"]["param"], param, "{shown}: {error}");
        let text = error["error"]["message"].as_str().unwrap_or_default();
        assert!(text.contains(message), "{shown}: {error}");
    }
    // A body that is not a form, or one cut short, names the multipart body.
    for body in [
        b"no boundary at all".to_vec(),
        b"--b\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nno end".to_vec(),
        b"--b\r\nno header end".to_vec(),
        b"--b\r\n\x00\x01: bad header\r\n\r\nx\r\n--b--".to_vec(),
    ] {
        let (status, error) = api.upload_raw(body, Some(5)).await;
        assert_eq!(status, 400, "{error}");
        let text = error["error"]["message"].as_str().unwrap_or_default();
        assert!(
            text.starts_with("The multipart body could not be read"),
            "{error}"
        );
    }
    // Nothing refused was kept.
    let (status, list) = api.send(api.http.get(api.url("/files"))).await;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["data"], json!([]), "{list}");
}
