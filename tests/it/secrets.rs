//! Every secret the process holds, not only the API key: the database
//! password from the environment and credentials inside a URL, kept out of
//! stdout, stderr and every file, in every form a server could echo them.

use std::path::{Path, PathBuf};
use std::process::Output;

use embedjob::simulate::SimConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::hostile::{assert_no_key_anywhere, key_forms};
use crate::support::{bin, run, simulator, text, three_documents, write_job, KEY};

/// The variable the fake database's jobs name in `output.password_env`.
const PASSWORD_VAR: &str = "EMBEDJOB_SECRETS_TEST_PASSWORD";

/// A server on 127.0.0.1 that speaks just enough of the PostgreSQL protocol
/// to refuse every connection with an ErrorResponse whose message, detail
/// and hint are `echo`. Serves until the test ends.
async fn echoing_database(echo: String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let echo = echo.clone();
            tokio::spawn(async move {
                // The startup message: its length, then that many bytes less four.
                let Ok(length) = socket.read_u32().await else {
                    return;
                };
                let mut rest = vec![0; (length as usize).saturating_sub(4).min(1 << 16)];
                if socket.read_exact(&mut rest).await.is_err() {
                    return;
                }
                let mut fields = Vec::new();
                for (kind, value) in [
                    (b'S', "FATAL"),
                    (b'V', "FATAL"),
                    (b'C', "28P01"),
                    (b'M', echo.as_str()),
                    (b'D', echo.as_str()),
                    (b'H', echo.as_str()),
                ] {
                    fields.push(kind);
                    fields.extend_from_slice(value.as_bytes());
                    fields.push(0);
                }
                fields.push(0);
                let mut message = vec![b'E'];
                message.extend_from_slice(&(fields.len() as u32 + 4).to_be_bytes());
                message.extend_from_slice(&fields);
                let _ = socket.write_all(&message).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    port
}

/// A job over three documents writing to a pgvector table at `port`.
fn pg_job(dir: &Path, base_url: &str, port: u16) -> PathBuf {
    let job = write_job(
        dir,
        base_url,
        &crate::support::files_source(&three_documents(dir)),
        "",
    );
    let text = std::fs::read_to_string(&job).unwrap();
    let (head, _) = text.split_once("[output]").unwrap();
    let text = format!(
        "{head}[output]\nkind = \"pgvector\"\n\
         url = \"postgresql://postgres@127.0.0.1:{port}/postgres\"\n\
         password_env = \"{PASSWORD_VAR}\"\ntable = \"chunks\"\nstate_dir = \"{}\"\n",
        dir.join("state").display()
    );
    std::fs::write(&job, text).unwrap();
    job
}

async fn embedjob(dir: &Path, password: &str, args: &[&str]) -> Output {
    let mut command = bin();
    command
        .current_dir(dir)
        .env("EMBEDJOB_API_KEY", KEY)
        .env(PASSWORD_VAR, password)
        .args(args);
    run(command).await
}

/// A server (or a proxy in front of it) that echoed the database password
/// URL-encoded, JSON-escaped, in base64 or hex, or a 12-character piece of
/// it, had it printed on stderr and in the `--json` summary: only the raw
/// password was replaced. The password is now a registered secret, scrubbed
/// in every form like the API key.
#[tokio::test]
async fn regression_the_database_password_echoed_by_the_server_was_printed() {
    let sim = simulator(SimConfig::default()).await;
    for password in ["Pg/Secr+et=2026&x y:z@w", "plainsecret0123456789xyz"] {
        let mut forms = key_forms(password);
        let chars: Vec<char> = password.chars().collect();
        for start in [0, 3, chars.len() - 12] {
            forms.push(chars[start..start + 12].iter().collect());
        }
        let echo = format!(
            "password authentication failed for user \"postgres\": got {}",
            forms.join(" | ")
        );
        let port = echoing_database(echo).await;
        let dir = tempfile::tempdir().unwrap();
        let job = pg_job(dir.path(), &sim.base_url(), port);
        let job = job.to_str().unwrap();
        for args in [
            vec!["run", job, "--json"],
            vec!["run", job],
            vec!["query", job, "anything", "--json"],
        ] {
            let output = embedjob(dir.path(), password, &args).await;
            let stderr = text(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(
                stderr.contains("password authentication failed"),
                "{args:?}: the server's message is kept: {stderr}"
            );
            assert_no_key_anywhere(&output, dir.path(), password);
        }
    }
}

/// An API key given as the base URL's user name or password, or as a query
/// parameter (`api_key`, `key`, `token`, `access_token`, …), was printed
/// raw or percent-encoded in the error. Such a URL is now refused as a
/// configuration problem, saying where the credentials are and not what.
#[tokio::test]
async fn regression_credentials_in_the_base_url_were_printed() {
    let secret = "sk-url/Secret+2026=abcdefgh";
    let encoded: String = secret
        .bytes()
        .map(|b| match b {
            b'/' | b'+' | b'=' => format!("%{b:02X}"),
            b => (b as char).to_string(),
        })
        .collect();
    let all_encoded: String = secret.bytes().map(|b| format!("%{b:02x}")).collect();
    let urls = [
        (format!("http://user:{encoded}@127.0.0.1:9/v1"), "password"),
        (format!("http://{encoded}@127.0.0.1:9/v1"), "user name"),
        (format!("http://{encoded}:@127.0.0.1:9"), "user name"),
        (
            format!("http://127.0.0.1:9/v1?api_key={encoded}"),
            "api_key",
        ),
        (format!("http://127.0.0.1:9/v1?key={all_encoded}"), "key"),
        (
            format!("http://127.0.0.1:9/v1/?model=m&token={encoded}"),
            "token",
        ),
        (
            format!("http://127.0.0.1:9?access_token={encoded}#x"),
            "access_token",
        ),
        (
            format!("http://127.0.0.1:9/v1?API-KEY={encoded}"),
            "api_key",
        ),
        // Too broken to parse: still not echoed.
        (format!("http://u:{encoded}@127.0.0.1:port/v1"), "password"),
    ];
    let dir = tempfile::tempdir().unwrap();
    let job = write_job(
        dir.path(),
        "http://127.0.0.1:9",
        &crate::support::files_source(&three_documents(dir.path())),
        "",
    );
    let job = job.to_str().unwrap();
    for (url, place) in &urls {
        let set = format!("backend.base_url={url}");
        for command in ["run", "estimate", "query"] {
            let mut args = vec![command, job, "--set", &set, "--json"];
            if command == "query" {
                args.insert(2, "anything");
            }
            let output = embedjob(dir.path(), "unused", &args).await;
            let stderr = text(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{url} {command}: {stderr}");
            assert!(
                stderr.contains("holds credentials (not shown)") && stderr.contains(place),
                "{url} {command}: {stderr}"
            );
            assert_no_key_anywhere(&output, dir.path(), secret);
        }
    }
    // The commands that take the service's address from the environment.
    for (url, _) in &urls {
        let mut command = bin();
        command
            .current_dir(dir.path())
            .env("EMBEDJOB_API_KEY", KEY)
            .env("EMBEDJOB_BASE_URL", url)
            .args(["models"]);
        let output = run(command).await;
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{url}: {stderr}");
        assert!(
            stderr.contains("holds credentials (not shown)"),
            "{url}: {stderr}"
        );
        assert_no_key_anywhere(&output, dir.path(), secret);
    }
}

/// `sslmode=verify-full` (or any mode that needs TLS) in the database URL
/// was refused as an "invalid connection string", not saying why. It is
/// now a configuration problem naming the key and saying TLS is not
/// supported by this build.
#[tokio::test]
async fn regression_an_sslmode_needing_tls_was_an_invalid_connection_string() {
    let sim = simulator(SimConfig::default()).await;
    let port = echoing_database(String::new()).await;
    let dir = tempfile::tempdir().unwrap();
    let job = pg_job(dir.path(), &sim.base_url(), port);
    let job = job.to_str().unwrap();
    for mode in ["allow", "require", "verify-ca", "verify-full"] {
        let set =
            format!("output.url=postgresql://postgres@127.0.0.1:{port}/postgres?sslmode={mode}");
        for command in ["run", "query"] {
            let mut args = vec![command, job, "--set", &set];
            if command == "query" {
                args.insert(2, "anything");
            }
            let output = embedjob(dir.path(), "pw-unused", &args).await;
            let stderr = text(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{mode} {command}: {stderr}");
            assert!(
                stderr.contains(&format!("sslmode={mode}"))
                    && stderr.contains("TLS is not supported by this build"),
                "{mode} {command}: {stderr}"
            );
        }
    }
    assert_eq!(
        sim.ledger().embedding_requests,
        0,
        "refused before any work"
    );
}

/// A dummy key of one character, as a server that takes any key is given
/// (`EMBEDJOB_API_KEY=1`): the run succeeds, and its summary, on stdout and
/// in `<output>.summary.json`, is JSON with its numbers and names whole.
/// Scrubbed as text, every `1` of the summary was `[REDACTED]`, the summary
/// file could not be written, and the run exited 1 after its vectors were
/// paid for. `embed --json` prints vectors whose numbers are whole too.
#[tokio::test]
async fn regression_a_dummy_key_of_one_character_failed_the_run() {
    let sim = simulator(SimConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let root = three_documents(dir.path());
    let source = crate::support::files_source(&root);
    let job = write_job(dir.path(), &sim.base_url(), &source, "");
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", "1")
        .args(["run", crate::support::path_arg(&job), "--json"]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let printed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let file = std::fs::read(dir.path().join("out/result.parquet.summary.json")).unwrap();
    let written: serde_json::Value = serde_json::from_slice(&file).unwrap();
    for summary in [&printed, &written] {
        assert_eq!(summary["exit_code"], 0, "{summary}");
        assert_eq!(summary["tokenizer"], "cl100k_base", "{summary}");
        assert!(summary["chunks"].as_u64().unwrap() >= 1, "{summary}");
    }

    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", "1")
        .env("EMBEDJOB_BASE_URL", sim.base_url())
        .args([
            "embed",
            "--model",
            "svc-embed-1",
            "--json",
            "the river rose",
        ]);
    let output = run(command).await;
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let printed: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let vector: Vec<f32> = printed["embeddings"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(
        vector,
        embedjob::simulate::embedding_vector(1024, "the river rose")
    );
}
