//! A service behind `https` whose certificate a private authority signed,
//! as a company's internal servers are: trusted through `SSL_CERT_FILE`,
//! and refused at once, with what to do, without it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use embedjob::simulate::SimConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

use crate::support::{
    assert_complete, bin, corpus, expected_chunks, files_source, no_key, read_output, run,
    simulator, write_job, KEY,
};

/// The most connections the TLS front takes: its accept loop is bounded.
const MOST_CONNECTIONS: usize = 256;

/// An authority of the test's own, and a certificate it signed for
/// 127.0.0.1: the authority's PEM, and the server's chain and key.
fn private_authority() -> (String, Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "embedjob test authority");
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = params.self_signed(&ca_key).unwrap();
    let mut server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    server.subject_alt_names = vec![rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap())];
    let server_key = rcgen::KeyPair::generate().unwrap();
    let signed = server.signed_by(&server_key, &ca, &ca_key).unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
    (ca.pem(), vec![signed.der().clone()], key)
}

/// A TLS front on 127.0.0.1 for the plain service at `backend`: each
/// connection's TLS is ended here and its bytes passed on. Returns its
/// `https` URL and a count of the connections it took; it stops taking
/// them after [`MOST_CONNECTIONS`].
async fn tls_front(
    backend: std::net::SocketAddr,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> (String, Arc<AtomicUsize>) {
    let config = ServerConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let taken = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&taken);
    tokio::spawn(async move {
        for _ in 0..MOST_CONNECTIONS {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            counted.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake.
                let Ok(mut tls) = acceptor.accept(socket).await else {
                    return;
                };
                if let Ok(mut plain) = TcpStream::connect(backend).await {
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                }
            });
        }
    });
    (url, taken)
}

/// A job over a small corpus against the simulator behind a TLS front,
/// with the authority's PEM written beside it, and the front's count of the
/// connections it took.
async fn behind_tls(
    dir: &Path,
) -> (
    PathBuf,
    PathBuf,
    embedjob::simulate::Simulator,
    Arc<AtomicUsize>,
) {
    let sim = simulator(SimConfig::default()).await;
    let (ca, chain, key) = private_authority();
    let (url, connections) = tls_front(sim.addr(), chain, key).await;
    let root = corpus(dir, 6);
    let job = write_job(dir, &format!("{url}/v1"), &files_source(&root), "");
    let ca_file = dir.join("authority.pem");
    std::fs::write(&ca_file, ca).unwrap();
    (job, ca_file, sim, connections)
}

fn run_with(job: &Path, ca_file: Option<&Path>) -> std::process::Command {
    let mut command = bin();
    command
        .env("EMBEDJOB_API_KEY", KEY)
        .args(["run", crate::support::path_arg(job), "--quiet"]);
    if let Some(ca_file) = ca_file {
        command.env("SSL_CERT_FILE", ca_file);
    }
    command
}

#[tokio::test]
async fn a_private_authority_named_by_ssl_cert_file_is_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let (job, ca_file, sim, _) = behind_tls(dir.path()).await;
    let output = run(run_with(&job, Some(&ca_file))).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected_chunks(&dir.path().join("docs")), 1024);
    assert!(sim.ledger().requests > 0);
}

#[tokio::test]
async fn a_private_authority_in_a_directory_named_by_ssl_cert_dir_is_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let (job, ca_file, sim, _) = behind_tls(dir.path()).await;
    let authorities = dir.path().join("authorities");
    std::fs::create_dir_all(&authorities).unwrap();
    std::fs::rename(&ca_file, authorities.join("company.pem")).unwrap();
    let mut command = run_with(&job, None);
    command.env("SSL_CERT_DIR", &authorities);
    let output = run(command).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let rows = read_output(&dir.path().join("out/result.parquet"));
    assert_complete(&rows, &expected_chunks(&dir.path().join("docs")), 1024);
    assert!(sim.ledger().requests > 0);
}

/// Without the authority, the client refuses the certificate at its first
/// connection and makes no other (the job allows 10 retries): the run ends
/// with what to do, the service billed nothing, and no output is written.
#[tokio::test]
async fn a_certificate_no_trusted_authority_signed_stops_the_run_at_once_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let (job, _, sim, connections) = behind_tls(dir.path()).await;
    let output = run(run_with(&job, None)).await;
    let (_, stderr) = no_key(&output, KEY);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot use the service")
            && stderr.contains("certificate was refused")
            && stderr.contains("SSL_CERT_FILE"),
        "{stderr}"
    );
    assert_eq!(sim.ledger().requests, 0);
    assert!(!dir.path().join("out/result.parquet").exists());
    assert_eq!(connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_ssl_cert_file_that_holds_no_certificate_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let (job, _, sim, connections) = behind_tls(dir.path()).await;
    let missing = dir.path().join("missing.pem");
    let notes = dir.path().join("notes.txt");
    std::fs::write(&notes, "not a certificate\n").unwrap();
    let endless = PathBuf::from("/dev/zero");
    let folder = dir.path().to_path_buf();
    for (file, says) in [
        (&missing, "missing.pem"),
        (&notes, "no PEM certificate"),
        (&endless, "more than 16 MiB"),
        (&folder, "directory"),
    ] {
        let output = run(run_with(&job, Some(file))).await;
        let (_, stderr) = no_key(&output, KEY);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("SSL_CERT_FILE") && stderr.contains(says),
            "{stderr}"
        );
    }
    assert_eq!(sim.ledger().requests, 0);
    assert_eq!(
        connections.load(Ordering::SeqCst),
        0,
        "refused before any request"
    );
    assert!(!dir.path().join("out/result.parquet").exists());
}
