//! What the commands write to stderr for people, besides progress: their
//! own notes, and the warnings lower layers hand up as values
//! ([`crate::warnings`]). Every line goes through [`crate::secret::scrub`],
//! so that a key a server echoed into a warning never reaches the terminal.

use std::io::Write;

use crate::warnings::{Warning, Warnings};

/// Writes `line` to `out`, scrubbed of the key.
fn write_line(out: &mut impl Write, line: &str) {
    // stderr gone (a closed pipe) is no reason to fail the command.
    let _ = writeln!(out, "{}", crate::secret::scrub(line));
}

/// A warning as printed: `embedjob: warning: …`, or for a line another
/// library logged, `embedjob: <library>: …`.
fn line_of(warning: &Warning) -> String {
    match warning.from {
        None => format!("embedjob: warning: {}", warning.text),
        Some(from) => format!("embedjob: {from}: {}", warning.text),
    }
}

/// Prints one warning.
pub(super) fn print(warning: &Warning) {
    write_line(&mut std::io::stderr().lock(), &line_of(warning));
}

/// Prints a warning of the command's own, or one a lower layer returned.
pub(super) fn warn(text: &str) {
    print(&Warning::new(text));
}

/// Prints each warning a lower layer returned.
pub(super) fn warn_all<S: AsRef<str>>(warnings: impl IntoIterator<Item = S>) {
    for warning in warnings {
        warn(warning.as_ref());
    }
}

/// Prints the warnings a lower layer holds, and from now on each as it comes.
pub(super) fn follow(warnings: &Warnings) {
    warnings.forward(print);
}

/// A warnings list the command prints as warnings arrive.
pub(super) fn printed() -> Warnings {
    let warnings = Warnings::new();
    follow(&warnings);
    warnings
}

/// Prints a note of the command's: `embedjob: …`.
pub(super) fn note(text: &str) {
    write_line(&mut std::io::stderr().lock(), &format!("embedjob: {text}"));
}

/// Prints a line for people as it is (a command's closing count).
pub(super) fn say(text: &str) {
    write_line(&mut std::io::stderr().lock(), text);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_layers_warning_is_written_without_the_key() {
        let key = "sk-messages-test-0123456789abcdef";
        crate::secret::register(key);
        let layer = Warnings::new();
        layer.warn(format!("the service answered as model {key:?}"));
        layer.push(Warning::logged("onnxruntime", format!("bad {key}")));
        let mut out = Vec::new();
        for warning in layer.take() {
            write_line(&mut out, &line_of(&warning));
        }
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains(key), "{text}");
        assert_eq!(
            text,
            "embedjob: warning: the service answered as model \"[REDACTED]\"\n\
             embedjob: onnxruntime: bad [REDACTED]\n"
        );
    }
}
