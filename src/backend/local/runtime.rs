//! The ONNX Runtime library file: its platform name, its version (read
//! from its bytes or its name, without loading it), and whether it is a
//! shared library at all.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// The platform's file name of ONNX Runtime, e.g. `libonnxruntime.so`.
pub fn runtime_file_name() -> String {
    format!(
        "{}onnxruntime{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    )
}

/// An ONNX Runtime release number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuntimeVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl fmt::Display for RuntimeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl RuntimeVersion {
    /// Reads the leading `MAJOR.MINOR[.PATCH]` of `text`.
    fn parse_prefix(text: &[u8]) -> Option<RuntimeVersion> {
        let end = text
            .iter()
            .position(|b| !(b.is_ascii_digit() || *b == b'.'))
            .unwrap_or(text.len());
        let text = std::str::from_utf8(&text[..end]).ok()?;
        Self::from_parts(text.split('.'))
    }

    fn from_parts<'a>(mut parts: impl Iterator<Item = &'a str>) -> Option<RuntimeVersion> {
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = match parts.next() {
            Some(p) => p.parse().ok()?,
            None => 0,
        };
        Some(RuntimeVersion {
            major,
            minor,
            patch,
        })
    }
}

/// The version a library file name carries, as in `libonnxruntime.so.1.31.1`
/// or `libonnxruntime.1.31.1.dylib`: the first run of numeric dot-separated
/// parts after `onnxruntime`.
pub fn version_from_file_name(name: &str) -> Option<RuntimeVersion> {
    let (_, rest) = name.split_once("onnxruntime")?;
    let parts: Vec<&str> = rest.split('.').collect();
    let numeric = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    let start = parts.iter().position(numeric)?;
    let run: Vec<&str> = parts[start..].iter().copied().take_while(numeric).collect();
    if run.len() < 2 {
        return None;
    }
    RuntimeVersion::from_parts(run.into_iter())
}

/// The marker ONNX Runtime's linker script puts in its symbol versions
/// (`VERS_1.31.1`); it sits in the first few kilobytes of the ELF file.
const VERSION_MARKER: &[u8] = b"VERS_";

/// Finds the version recorded inside a library by scanning its bytes for
/// `VERS_<version>`, without loading it. `None` when the file holds no marker
/// (builds for other platforms, or a file that is not ONNX Runtime).
pub fn version_from_bytes(path: &Path) -> io::Result<Option<RuntimeVersion>> {
    const BLOCK: usize = 1 << 20;
    // Long enough for a marker and its version to straddle two blocks.
    const KEEP: usize = 32;
    let mut file = File::open(path)?;
    let mut buffer = Vec::with_capacity(BLOCK + KEEP);
    let mut block = vec![0u8; BLOCK];
    loop {
        let read = file.read(&mut block)?;
        let at_end = read == 0;
        buffer.extend_from_slice(&block[..read]);
        let mut from = 0;
        while let Some(found) = memchr::memmem::find(&buffer[from..], VERSION_MARKER) {
            let start = from + found + VERSION_MARKER.len();
            let tail = &buffer[start..];
            // A marker too near the end of the buffer is read again with the next block.
            if !at_end && tail.len() < KEEP {
                break;
            }
            if let Some(version) = RuntimeVersion::parse_prefix(tail) {
                return Ok(Some(version));
            }
            from = start;
        }
        if at_end {
            return Ok(None);
        }
        let keep_from = buffer.len().saturating_sub(KEEP);
        buffer.drain(..keep_from);
    }
}

/// The version of the ONNX Runtime library at `path`, without loading it.
///
/// The bytes are the truth (a renamed file keeps its `VERS_` marker), so
/// they are read first; the name of the file the path resolves to, after
/// symlinks, is the fallback. `None` when neither says.
pub fn runtime_version(path: &Path) -> io::Result<Option<RuntimeVersion>> {
    if let Some(version) = version_from_bytes(path)? {
        return Ok(Some(version));
    }
    let resolved = std::fs::canonicalize(path)?;
    Ok(resolved
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(version_from_file_name))
}

/// Whether the file starts like a shared library of this platform.
pub(super) fn looks_like_library(path: &Path) -> io::Result<bool> {
    let mut magic = [0u8; 4];
    let mut file = File::open(path)?;
    let mut filled = 0;
    while filled < magic.len() {
        let n = file.read(&mut magic[filled..])?;
        if n == 0 {
            return Ok(false);
        }
        filled += n;
    }
    Ok(if cfg!(target_os = "macos") {
        matches!(
            magic,
            [0xcf, 0xfa, 0xed, 0xfe] | [0xfe, 0xed, 0xfa, 0xcf] | [0xca, 0xfe, 0xba, 0xbe]
        )
    } else if cfg!(windows) {
        magic.starts_with(b"MZ")
    } else {
        magic == *b"\x7fELF"
    })
}
