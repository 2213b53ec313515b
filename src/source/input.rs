//! An input's bytes: a file, or stdin for `-`, decompressed when it is gzip
//! or zstd. Compression is known by the data's first bytes (its magic
//! number), whatever the file is called, so `zcat`-able input of any name
//! and compressed stdin both read as text. Valid UTF-8 text never starts
//! with either magic number.

use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;

use super::records::STDIN;
use super::{io_error, open_file, SourceError};
use crate::bounded::{self, BoundedError};

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

/// Read buffer for streamed inputs.
const BUFFER_BYTES: usize = 64 * 1024;

/// How an input's bytes are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codec {
    Plain,
    Gzip,
    Zstd,
}

impl Codec {
    /// The codec whose magic number `head` starts with.
    pub(crate) fn sniff(head: &[u8]) -> Codec {
        if head.starts_with(GZIP_MAGIC) {
            Codec::Gzip
        } else if head.starts_with(ZSTD_MAGIC) {
            Codec::Zstd
        } else {
            Codec::Plain
        }
    }

    fn name(self) -> &'static str {
        match self {
            Codec::Plain => "plain",
            Codec::Gzip => "gzip",
            Codec::Zstd => "zstd",
        }
    }
}

/// Whether `path` names stdin.
pub(crate) fn is_stdin(path: &Path) -> bool {
    path.as_os_str() == STDIN
}

/// The decompressed bytes of `path` (stdin for `-`), buffered, read as they
/// are needed.
pub(crate) fn open(path: &Path) -> Result<Box<dyn BufRead + Send>, SourceError> {
    let mut raw: Box<dyn Read + Send> = if is_stdin(path) {
        Box::new(io::stdin())
    } else {
        Box::new(open_file(path)?)
    };
    let mut head = Vec::with_capacity(ZSTD_MAGIC.len());
    (&mut raw)
        .take(ZSTD_MAGIC.len() as u64)
        .read_to_end(&mut head)
        .map_err(|e| io_error(path, e))?;
    let codec = Codec::sniff(&head);
    let whole = io::Cursor::new(head).chain(raw);
    let decoded: Box<dyn Read + Send> = match codec {
        Codec::Plain => Box::new(whole),
        Codec::Gzip => Box::new(Decompressing {
            inner: MultiGzDecoder::new(whole),
            codec,
        }),
        Codec::Zstd => Box::new(Decompressing {
            inner: zstd::stream::read::Decoder::new(whole).map_err(|e| io_error(path, e))?,
            codec,
        }),
    };
    Ok(Box::new(BufReader::with_capacity(BUFFER_BYTES, decoded)))
}

/// A whole file's bytes, decompressed when they are gzip or zstd, read
/// only up to `limit` bytes (decompressed), so a compression bomb costs no
/// more than the limit.
pub(crate) fn read_whole(path: &Path, limit: u64) -> Result<Vec<u8>, WholeError> {
    let mut raw = open_file(path).map_err(WholeError::Io)?;
    let mut head = Vec::with_capacity(ZSTD_MAGIC.len());
    (&mut raw)
        .take(ZSTD_MAGIC.len() as u64)
        .read_to_end(&mut head)
        .map_err(|e| WholeError::Io(io_error(path, e)))?;
    let codec = Codec::sniff(&head);
    let whole = io::Cursor::new(head).chain(raw);
    let read = match codec {
        Codec::Plain => bounded::read_to_end(whole, limit),
        Codec::Gzip => bounded::read_to_end(MultiGzDecoder::new(whole), limit),
        Codec::Zstd => zstd::stream::read::Decoder::new(whole)
            .map_err(BoundedError::Io)
            .and_then(|decoder| bounded::read_to_end(decoder, limit)),
    };
    match read {
        Ok(bytes) => Ok(bytes),
        Err(BoundedError::TooLarge { limit }) => Err(WholeError::TooLarge { limit }),
        Err(BoundedError::Io(e)) if codec == Codec::Plain => Err(WholeError::Io(io_error(path, e))),
        Err(BoundedError::Io(e)) => Err(WholeError::Undecodable(format!(
            "cannot decompress the {} data: {e}",
            codec.name()
        ))),
    }
}

/// Why a whole file could not be read.
#[derive(Debug)]
pub(crate) enum WholeError {
    /// The file could not be read.
    Io(SourceError),
    /// It looks compressed but does not decompress.
    Undecodable(String),
    /// It holds more than `limit` bytes (once decompressed).
    TooLarge { limit: u64 },
}

/// A decoder whose errors say that decompressing failed.
struct Decompressing<R> {
    inner: R,
    codec: Codec,
}

impl<R: Read> Read for Decompressing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("cannot decompress the {} data: {e}", self.codec.name()),
            )
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::io::Write;

    use super::*;

    pub(crate) fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(bytes).unwrap();
        encoder.finish().unwrap()
    }

    /// At least `total` bytes of `pattern` repeated, gzip- or
    /// zstd-compressed by a writer loop, so a bomb of gigabytes costs a
    /// megabyte of memory to build.
    pub(crate) fn bomb(codec: Codec, pattern: &[u8], total: u64) -> Vec<u8> {
        let mut block = Vec::with_capacity(1 << 20);
        while block.len() + pattern.len() < 1 << 20 {
            block.extend_from_slice(pattern);
        }
        let blocks = total.div_ceil(block.len() as u64);
        match codec {
            Codec::Gzip => {
                let mut encoder =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                for _ in 0..blocks {
                    encoder.write_all(&block).unwrap();
                }
                encoder.finish().unwrap()
            }
            _ => {
                let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
                for _ in 0..blocks {
                    encoder.write_all(&block).unwrap();
                }
                encoder.finish().unwrap()
            }
        }
    }

    fn read(path: &Path) -> String {
        let mut text = String::new();
        open(path).unwrap().read_to_string(&mut text).unwrap();
        text
    }

    #[test]
    fn gzip_zstd_and_plain_read_the_same_whatever_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let text = "line one\nline two\n".repeat(100);
        let plain = dir.path().join("a.txt");
        std::fs::write(&plain, &text).unwrap();
        let gz = dir.path().join("b.txt.gz");
        // Two gzip members, as `cat a.gz b.gz` makes.
        let mut members = gzip(&text.as_bytes()[..50]);
        members.extend(gzip(&text.as_bytes()[50..]));
        std::fs::write(&gz, members).unwrap();
        let zst = dir.path().join("c.data");
        std::fs::write(&zst, zstd::encode_all(text.as_bytes(), 3).unwrap()).unwrap();
        for path in [&plain, &gz, &zst] {
            assert_eq!(read(path), text, "{}", path.display());
            assert_eq!(
                read_whole(path, 1 << 20).unwrap(),
                text.as_bytes(),
                "{}",
                path.display()
            );
        }
        let tiny = dir.path().join("tiny");
        std::fs::write(&tiny, "x").unwrap();
        assert_eq!(read(&tiny), "x");
    }

    #[test]
    fn regression_a_compression_bomb_is_read_only_up_to_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let limit = crate::bounded::MAX_DOCUMENT_BYTES;
        for (codec, name) in [(Codec::Gzip, "bomb.gz"), (Codec::Zstd, "bomb.zst")] {
            let path = dir.path().join(name);
            // Four times the limit: far more than a read that stops at it.
            std::fs::write(&path, bomb(codec, b"all work and no play", 4 * limit)).unwrap();
            let read = read_whole(&path, limit);
            assert!(
                matches!(read, Err(WholeError::TooLarge { limit: l }) if l == limit),
                "{name}: {:?}",
                read.map(|bytes| bytes.len())
            );
        }
        // Exactly at the limit is still a document.
        let path = dir.path().join("plain.txt");
        std::fs::write(&path, vec![b'a'; 1000]).unwrap();
        assert_eq!(read_whole(&path, 1000).unwrap().len(), 1000);
        assert!(matches!(
            read_whole(&path, 999),
            Err(WholeError::TooLarge { limit: 999 })
        ));
    }

    #[test]
    fn damaged_compressed_data_is_an_error_that_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cut.gz");
        let whole = gzip("some text that is long enough to be cut".as_bytes());
        std::fs::write(&path, &whole[..whole.len() / 2]).unwrap();
        let mut text = String::new();
        let error = open(&path).unwrap().read_to_string(&mut text).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("cannot decompress the gzip data"),
            "{error}"
        );
        let Err(WholeError::Undecodable(message)) = read_whole(&path, 1 << 20) else {
            panic!("a cut gzip file decompressed");
        };
        assert!(message.contains("gzip"), "{message}");
    }
}
