//! Knowing the cost before a run: `estimate`, and what it is measured against.

use embedjob::simulate::{KeySpec, SimConfig, Simulator};
use serde_json::Value;

use crate::support::{
    bin, embedjob, json, mixed_corpus, no_key, path_arg, run, simulator, text, write_cost_job, KEY,
};

#[tokio::test]
async fn the_estimate_is_what_the_run_sends_and_pays_for() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(SimConfig::default()).await;
    let job = write_cost_job(dir.path(), &sim.base_url(), "");

    let output = embedjob(&["estimate", path_arg(&job), "--json"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let estimate = json(&output);
    assert_eq!(
        sim.ledger().embedding_requests,
        0,
        "an estimate sends no embedding request"
    );
    assert!(
        !dir.path().join("out").exists(),
        "an estimate writes nothing"
    );

    let output = embedjob(&["run", path_arg(&job), "--json", "--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let summary = json(&output);
    let ledger = sim.ledger();

    assert!(estimate["requests"].as_u64().unwrap() > 5, "{estimate}");
    // Repeated texts are sent once, by the estimate as by the run.
    assert!(
        estimate["repeated_chunks"].as_u64().unwrap() > 0,
        "{estimate}"
    );
    assert_eq!(estimate["repeated_chunks"], summary["deduplicated"]);
    assert_eq!(estimate["requests"], summary["requests"]);
    assert_eq!(estimate["requests"].as_u64(), Some(ledger.billed_requests));
    assert_eq!(estimate["chunks"], summary["chunks"]);
    assert_eq!(estimate["documents"], summary["documents"]);
    // Tolerance 0: chunks are counted with cl100k over exactly the text sent,
    // as the simulator bills (encode_ordinary, special tokens as text), and a
    // run without faults bills each request once.
    assert_eq!(estimate["tokens"].as_u64(), Some(ledger.prompt_tokens));
    assert_eq!(estimate["tokens"], summary["estimated_tokens"]);
    let cost = estimate["cost"].as_f64().unwrap();
    let billed = summary["cost"].as_f64().unwrap();
    assert!((cost - billed).abs() < 1e-12, "{cost} vs {billed}");
    assert_eq!(estimate["input_per_1k"].as_f64(), Some(0.0001));
    assert_eq!(estimate["context_window"].as_u64(), Some(8192));
    assert_eq!(estimate["shortest_duration_seconds"], Value::Null);

    // The human form: a table on stdout, nothing on stderr. With the output
    // in place, the next run would send nothing; --fresh estimates starting over.
    let output = embedjob(&["estimate", path_arg(&job)]).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert!(stdout.contains("requests             0\n"), "{stdout}");
    let output = embedjob(&["estimate", path_arg(&job), "--fresh"]).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let requests = format!("requests             {}", summary["requests"]);
    assert!(stdout.contains(&requests), "{stdout}");
    assert!(stdout.contains("cost "), "{stdout}");
}

#[tokio::test]
async fn the_estimate_follows_set_overrides_and_rate_limits() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(SimConfig::default()).await;
    let job = write_cost_job(dir.path(), &sim.base_url(), "");
    let output = embedjob(&[
        "estimate",
        path_arg(&job),
        "--json",
        "--set",
        "backend.max_inputs_per_request=1",
        "--set",
        "backend.model=svc-embed-1-l",
        "--set",
        "backend.requests_per_minute=120",
    ])
    .await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let estimate = json(&output);
    // One chunk a request.
    assert_eq!(estimate["requests"], estimate["chunks_to_send"]);
    assert_eq!(estimate["model"], "svc-embed-1-l");
    assert_eq!(estimate["dimensions"], 3072);
    assert_eq!(estimate["input_per_1k"].as_f64(), Some(0.00013));
    // 120 a minute: a burst of 2, then one every half second.
    let requests = estimate["requests"].as_f64().unwrap();
    assert_eq!(
        estimate["shortest_duration_seconds"].as_f64(),
        Some((requests - 2.0) * 0.5)
    );
    assert_eq!(sim.ledger().embedding_requests, 0);
}

#[tokio::test]
async fn estimate_errors_are_config_errors_with_nothing_on_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(SimConfig {
        keys: vec![KeySpec {
            key: KEY.to_string(),
            models: Some(vec!["svc-embed-1".to_string()]),
        }],
        ..SimConfig::default()
    })
    .await;
    let job = write_cost_job(dir.path(), &sim.base_url(), "");
    let cases: [(&str, Vec<&str>, &str); 4] = [
        (
            "an unknown key in the job file",
            vec!["--set", "backend.colour=blue"],
            "backend.colour",
        ),
        (
            "a model the key cannot see",
            vec!["--set", "backend.model=svc-embed-1-l"],
            "svc-embed-1-l",
        ),
        (
            "a missing input",
            vec!["--set", "source.paths=[\"/nonexistent/docs\"]"],
            "/nonexistent/docs",
        ),
        (
            "a chunk size beyond the model's window",
            vec![
                "--set",
                "chunking.max_tokens=9000",
                "--set",
                "backend.max_tokens_per_request=9000",
            ],
            "context window",
        ),
    ];
    for (case, extra, named) in cases {
        let mut args = vec!["estimate", path_arg(&job), "--json"];
        args.extend(extra);
        let output = embedjob(&args).await;
        let (stdout, stderr) = no_key(&output, KEY);
        assert_eq!(output.status.code(), Some(2), "{case}: {stderr}");
        assert!(stdout.is_empty(), "{case}: {stdout}");
        assert!(stderr.contains(named), "{case}: {stderr}");
    }

    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", "sk-refused-9999")
        .args(["estimate", path_arg(&job)]);
    let output = run(command).await;
    let (stdout, stderr) = no_key(&output, "sk-refused-9999");
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stdout.is_empty());
    assert!(stderr.contains("refused the API key"), "{stderr}");
    assert_eq!(sim.ledger().embedding_requests, 0);
}

#[tokio::test]
async fn the_local_estimate_needs_no_key_and_costs_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = mixed_corpus(dir.path(), true);
    let job = dir.path().join("local.toml");
    std::fs::write(
        &job,
        format!(
            "[source]\nkind = \"files\"\npaths = [\"{}\"]\n[chunking]\nmax_tokens = 64\noverlap_tokens = 8\n\
             [backend]\nkind = \"local\"\nmax_inputs_per_request = 6\n[output]\npath = \"{}\"\n",
            root.display(),
            dir.path().join("out/local.parquet").display()
        ),
    )
    .unwrap();
    let mut command = bin();
    command.args(["estimate", path_arg(&job), "--json"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let estimate: Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(estimate["backend"], "local");
    assert_eq!(estimate["cost"].as_f64(), Some(0.0));
    assert_eq!(estimate["dimensions"], 384);

    let mut command = bin();
    command.args(["run", path_arg(&job), "--json", "--quiet"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let summary: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(estimate["requests"], summary["requests"]);
    assert_eq!(estimate["chunks"], summary["chunks"]);
    // Counted with the model's own tokenizer, as the run counts its chunks;
    // the model's usage adds [CLS] and [SEP] to every chunk.
    assert_eq!(estimate["tokens"], summary["estimated_tokens"]);
    assert_eq!(
        summary["usage"]["prompt_tokens"].as_u64(),
        Some(
            estimate["tokens"].as_u64().unwrap() + 2 * estimate["chunks_to_send"].as_u64().unwrap()
        )
    );
}

/// Whether an estimate warns that how the service counts is not known yet.
fn warns_of_an_unknown_count(estimate: &Value) -> bool {
    estimate["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|w| w.as_str().unwrap().contains("is not known yet"))
}

/// A service that counts tokens its own way: the next estimate scales the
/// local count by what the last run was billed, and says so.
///
/// This was tested only by estimating again the corpus the ratio was learned
/// on, where remembering the last bill passes as well as scaling by the
/// ratio. The ratio learned on one corpus is carried here to a changed one,
/// of another size and another mix of bytes and tokens.
#[tokio::test]
async fn regression_the_learned_estimate_was_tested_only_on_the_corpus_it_learned_from() {
    let dir = tempfile::tempdir().unwrap();
    let sim = simulator(SimConfig {
        billing: embedjob::simulate::Billing {
            count: embedjob::simulate::TokenCount::Bytes,
            factor: 1.25,
        },
        bare_listing: true,
        ..SimConfig::default()
    })
    .await;
    let job = write_cost_job(dir.path(), &sim.base_url(), "input_per_1k = 0.5");
    let estimate = |extra: &'static [&'static str]| {
        let job = job.clone();
        async move {
            let mut args = vec!["estimate", path_arg(&job), "--json"];
            args.extend_from_slice(extra);
            json(&embedjob(&args).await)
        }
    };

    // Corpus A: nothing learned yet, and the estimate says its count is the job's.
    let before = estimate(&[]).await;
    assert_eq!(before["billed_token_ratio"], Value::Null);
    assert!(warns_of_an_unknown_count(&before), "{before}");
    let local = before["tokens"].as_u64().unwrap();
    let cost = before["cost"].as_f64().unwrap();
    assert!(
        (cost - local as f64 / 1000.0 * 0.5).abs() < 1e-12,
        "the job's price prices a service that lists none: {before}"
    );

    let output = embedjob(&["run", path_arg(&job), "--json", "--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    // The listing names no window: a probe before the run was billed too,
    // and is not the chunks' ratio.
    let summary = json(&output);
    let probe = summary["learned_limits"]["window_probe"]["tokens"]
        .as_u64()
        .unwrap();
    let billed_a = sim.ledger().prompt_tokens - probe;
    assert_ne!(billed_a, local);
    let ratio = summary["billed_token_ratio"].as_f64().unwrap();
    assert!((ratio - billed_a as f64 / local as f64).abs() < 1e-12);

    // Corpus B: half of A's documents gone, more added, mostly CJK text
    // (three bytes a character, which the service bills by), so that B has
    // another size and another ratio of its own.
    let root = dir.path().join("docs");
    for i in 0..6 {
        for extension in ["txt", "md"] {
            let _ = std::fs::remove_file(root.join(format!("note{i:02}.{extension}")));
        }
    }
    for i in 0..9 {
        let body: String = (0..3 + i)
            .map(|p| format!("第{p}段：東京の埋め込み、ベクトル索引、費用 {i}。\n\n"))
            .collect();
        std::fs::write(root.join(format!("b{i:02}.md")), body).unwrap();
    }

    // Estimated whole, B's own count scaled by the ratio learned on A.
    let fresh = estimate(&["--fresh"]).await;
    let tokens_b = fresh["tokens"].as_u64().unwrap();
    assert_ne!(tokens_b, local, "B is not A's size");
    assert_eq!(fresh["billed_token_ratio"].as_f64(), Some(ratio), "{fresh}");
    assert!(!warns_of_an_unknown_count(&fresh), "{fresh}");
    let expected_b = (tokens_b as f64 * ratio).round() as u64;
    assert_eq!(fresh["expected_billed_tokens"].as_u64(), Some(expected_b));
    assert_ne!(expected_b, billed_a, "not A's bill remembered");
    let cost = fresh["cost"].as_f64().unwrap();
    assert!(
        (cost - expected_b as f64 / 1000.0 * 0.5).abs() < 1e-9,
        "{fresh}"
    );
    let table = text(
        &embedjob(&["estimate", path_arg(&job), "--fresh"])
            .await
            .stdout,
    );
    assert!(table.contains("expected billed"), "{table}");
    assert!(table.contains(&format!("{expected_b} tokens")), "{table}");

    // Estimated as the next run would send it: only B's new chunks, scaled
    // by the same ratio.
    let next = estimate(&[]).await;
    let to_send = next["tokens"].as_u64().unwrap();
    assert!(0 < to_send && to_send < tokens_b, "{next}");
    assert_eq!(next["billed_token_ratio"].as_f64(), Some(ratio), "{next}");
    assert_eq!(
        next["expected_billed_tokens"].as_u64(),
        Some((to_send as f64 * ratio).round() as u64),
        "{next}"
    );

    // B's own ratio is not A's: the estimate above was a prediction from
    // A, not B's bill known in advance.
    let output = embedjob(&["run", path_arg(&job), "--json", "--quiet", "--fresh"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let billed_b = sim.ledger().prompt_tokens - billed_a;
    assert_eq!(json(&output)["estimated_tokens"].as_u64(), Some(tokens_b));
    assert_ne!(billed_b, expected_b, "B bills at a ratio of its own");

    // Another tokenizer is another count: the ratio is not carried over to it.
    let output = embedjob(&[
        "estimate",
        path_arg(&job),
        "--json",
        "--fresh",
        "--set",
        "chunking.tokenizer=o200k_base",
    ])
    .await;
    assert_eq!(json(&output)["billed_token_ratio"], Value::Null);
    assert!(
        warns_of_an_unknown_count(&json(&output)),
        "{}",
        text(&output.stdout)
    );
}

/// A simulator that bills three times the bytes over four (about three
/// times the local count), listing windows unless `bare`, and the cost job
/// against it at a price per 1000 tokens, which is returned.
async fn billing_thrice(dir: &std::path::Path, bare: bool) -> (Simulator, std::path::PathBuf, f64) {
    let sim = simulator(SimConfig {
        billing: embedjob::simulate::Billing {
            count: embedjob::simulate::TokenCount::Bytes,
            factor: 3.0,
        },
        bare_listing: bare,
        ..SimConfig::default()
    })
    .await;
    let price = 0.5;
    let job = write_cost_job(dir, &sim.base_url(), &format!("input_per_1k = {price}"));
    (sim, job, price)
}

/// A service that bills its own count, more than the local one: `--max-cost`
/// holds to what it bills, the window probe's requests included. Counted
/// in local tokens, what was in flight was priced at a third of its bill or
/// less here, and a run behind LiteLLM (infinity bills characters) with
/// `--max-cost 0.005` was billed 0.0085 and finished with exit 0.
#[tokio::test]
async fn a_budget_holds_to_what_the_service_bills_not_to_the_local_count() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, job, price) = billing_thrice(dir.path(), true).await;
    let estimate = json(&embedjob(&["estimate", path_arg(&job), "--json"]).await);
    // Half again what the local count prices the whole job at: under what
    // the service bills for it.
    let budget = estimate["cost"].as_f64().unwrap() * 1.5;

    let max_cost = budget.to_string();
    let output = embedjob(&["run", path_arg(&job), "--json", "--max-cost", &max_cost]).await;
    let (stdout, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(4), "{stdout}\n{stderr}");
    let summary = json(&output);
    assert!(
        summary["stopped"].as_str().unwrap().contains("budget"),
        "{summary}"
    );
    assert!(
        summary["learned_limits"]["window_probe"]["tokens"].as_u64() > Some(0),
        "the probe was billed: {summary}"
    );
    let ledger = sim.ledger();
    let billed = ledger.prompt_tokens as f64 * price / 1000.0;
    assert!(
        billed <= budget,
        "billed {billed}, over the budget {budget}"
    );
    assert!(
        billed > budget * 0.5,
        "the budget was used, not left idle: {billed} of {budget}"
    );
    let cost = summary["cost"].as_f64().unwrap();
    assert!((cost - billed).abs() < 1e-12, "{cost} against {billed}");
    assert!(
        summary["billed_token_ratio"].as_f64().unwrap() > 2.0,
        "the service billed more than the local count: {summary}"
    );
    assert!(
        ledger.texts.values().all(|&n| n == 1),
        "nothing embedded twice"
    );
}

/// A job whose last run recorded what the service bills per local token:
/// the next run's budget counts its first request at that ratio. Counted at
/// the local count until an answer told, a first request the budget could
/// pay for by the local count but not as billed was sent, and the run went
/// over its budget by the difference.
#[tokio::test]
async fn a_budget_counts_the_first_request_at_the_ratio_the_last_run_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, job, price) = billing_thrice(dir.path(), false).await;
    let output = embedjob(&["run", path_arg(&job), "--json", "--quiet"]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let ratio = json(&output)["billed_token_ratio"].as_f64().unwrap();
    assert!(
        ratio > 2.0,
        "the service bills more than the local count: {ratio}"
    );

    // One new document: one request, whose local count the estimate gives.
    std::fs::write(
        dir.path().join("docs/added.txt"),
        "A note added after the first run, short enough for one chunk.",
    )
    .unwrap();
    let estimate = json(&embedjob(&["estimate", path_arg(&job), "--json"]).await);
    assert_eq!(estimate["requests"].as_u64(), Some(1), "{estimate}");
    let local = estimate["tokens"].as_f64().unwrap();
    let billed_before = sim.ledger().prompt_tokens;

    // Enough for the request by the local count, not as the service bills it.
    let short = (local * 1.5 * price / 1000.0).to_string();
    let output = embedjob(&["run", path_arg(&job), "--json", "--max-cost", &short]).await;
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    assert!(
        json(&output)["stopped"]
            .as_str()
            .unwrap()
            .contains("budget"),
        "{}",
        text(&output.stdout)
    );
    assert_eq!(
        sim.ledger().prompt_tokens,
        billed_before,
        "nothing was sent"
    );

    // Twice what the ratio predicts: the request goes. (Another text's
    // ratio is its own: this plain one bills more per token than the mixed
    // corpus did.)
    let enough = (local * ratio * 2.0 * price / 1000.0).to_string();
    let output = embedjob(&["run", path_arg(&job), "--json", "--max-cost", &enough]).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(
        sim.ledger().prompt_tokens > billed_before,
        "the request was sent"
    );
}

/// With a budget and no ratio recorded, the first request is counted at its
/// local count before any answer tells how the service bills, so it goes
/// with one chunk: a service that bills more can take the run past the
/// budget by that chunk's difference at most. Sent whole, a first request
/// the budget covered by the local count was billed three times that, over
/// the budget.
#[tokio::test]
async fn the_request_that_tells_how_the_service_bills_holds_one_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let (sim, job, price) = billing_thrice(dir.path(), false).await;
    let estimate = json(&embedjob(&["estimate", path_arg(&job), "--json"]).await);
    // A whole first request fits by the local count; billed three times
    // that, it would not.
    let largest = estimate["largest_request_tokens"].as_f64().unwrap();
    let budget = largest * 1.2 * price / 1000.0;
    let max_cost = budget.to_string();
    let output = embedjob(&["run", path_arg(&job), "--json", "--max-cost", &max_cost]).await;
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    let summary = json(&output);
    assert!(
        summary["stopped"].as_str().unwrap().contains("budget"),
        "{summary}"
    );
    let billed = sim.ledger().prompt_tokens as f64 * price / 1000.0;
    assert!(
        billed <= budget,
        "billed {billed} over the budget {budget}: {summary}"
    );
    assert_eq!(summary["embedded"], 1, "{summary}");
    assert_eq!(summary["requests"], 1, "{summary}");
}
