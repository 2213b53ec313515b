//! Whom an `https` base URL is trusted from: the Mozilla roots built in, the
//! system's store (`/etc/ssl/certs` and the like, where a company installs
//! its own authority), and the certificates the standard `SSL_CERT_FILE`
//! names, a PEM file, as curl, Python and Go clients read it. A server whose
//! certificate none of them signed is refused at once, with what to do, not
//! retried: no retry makes it trusted.

use crate::bounded::{self, BoundedError, MAX_CA_FILE_BYTES};

use super::ConfigError;

/// The variable that names a PEM file of certificate authorities to trust.
pub const CA_FILE_VAR: &str = "SSL_CERT_FILE";

/// What to do about a certificate no trusted authority signed.
pub const UNTRUSTED_HINT: &str = "if a private certificate authority signed it, set \
     SSL_CERT_FILE to a PEM file that holds that authority's certificate, or install it in the \
     system's store";

/// Checks the file `SSL_CERT_FILE` names, for a base URL of `scheme`:
/// nothing for plain HTTP or when it is unset or empty. The client's trust
/// store reads the file itself (with the system's store, `rustls-native-certs`
/// takes it in), but passes over one it cannot use, and the run would end
/// at its first request with the certificate refused: this says why first.
///
/// # Errors
/// A file that cannot be read, is larger than [`MAX_CA_FILE_BYTES`], or
/// holds no PEM certificate.
pub(super) fn check_ca_file(
    scheme: &str,
    ca_file: Option<std::ffi::OsString>,
) -> Result<(), ConfigError> {
    let Some(path) = ca_file.filter(|p| !p.is_empty() && scheme.eq_ignore_ascii_case("https"))
    else {
        return Ok(());
    };
    let shown = path.to_string_lossy().into_owned();
    let fail = |reason: String| ConfigError::CaFile {
        path: shown.clone(),
        reason,
    };
    let file = std::fs::File::open(&path).map_err(|e| fail(e.to_string()))?;
    let bytes = bounded::read_to_end(file, MAX_CA_FILE_BYTES).map_err(|e| match e {
        BoundedError::TooLarge { .. } => fail(format!("it holds {e}")),
        BoundedError::Io(e) => fail(e.to_string()),
    })?;
    let certificates = reqwest::Certificate::from_pem_bundle(&bytes)
        .map_err(|e| fail(format!("it is not PEM: {e}")))?;
    if certificates.is_empty() {
        return Err(fail("it holds no PEM certificate".into()));
    }
    Ok(())
}

/// Whether a transport error's text says the server's certificate was
/// refused (rustls: "invalid peer certificate: UnknownIssuer", `Expired`,
/// `NotValidForName` and the like).
pub(super) fn refused_certificate(chain: &str) -> bool {
    chain.contains("invalid peer certificate")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssl_cert_file_is_read_for_https_only_and_must_hold_a_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let var = |p: &std::path::Path| Some(p.as_os_str().to_os_string());
        // Plain HTTP, unset or empty: nothing is read.
        assert!(check_ca_file("http", var(&missing)).is_ok());
        assert!(check_ca_file("https", None).is_ok());
        assert!(check_ca_file("https", Some("".into())).is_ok());
        let error = check_ca_file("https", var(&missing))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("SSL_CERT_FILE") && error.contains("missing.pem"),
            "{error}"
        );
        let text = dir.path().join("notes.txt");
        std::fs::write(&text, "not a certificate\n").unwrap();
        let error = check_ca_file("HTTPS", var(&text)).unwrap_err().to_string();
        assert!(error.contains("no PEM certificate"), "{error}");
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let pem = dir.path().join("ca.pem");
        std::fs::write(&pem, ca.cert.pem()).unwrap();
        assert!(check_ca_file("https", var(&pem)).is_ok());
    }

    #[test]
    fn a_refused_certificate_is_told_from_other_transport_errors() {
        assert!(refused_certificate(
            "error sending request: client error (Connect): invalid peer certificate: UnknownIssuer"
        ));
        assert!(!refused_certificate(
            "error sending request: client error (Connect): tcp connect error: Connection refused"
        ));
    }
}
