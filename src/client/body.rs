//! Reading response bodies with a limit, so that a server that never ends a
//! body (or sends a huge one) cannot take the process's memory.
//!
//! The limit of a successful embeddings body follows from the request: the
//! inputs times the dimensions times the widest way a value is written
//! (a JSON decimal), plus room for the rest. Error bodies only need a message.

use bytes::Bytes;

/// The most bytes one vector value takes in a response: a JSON decimal such
/// as `-0.0012345678901234567e-10, ` with pretty-printing's indentation. The
/// base64 encoding takes less (4 bytes in 5⅓ characters).
const WIDEST_VALUE_BYTES: usize = 48;

/// Room for an item's `index`, `object` and brackets.
const ITEM_BYTES: usize = 256;

/// Room for `usage`, `model` and the rest of an embeddings body.
const SLACK_BYTES: usize = 64 * 1024;

/// Assumed when the dimensions are not known before the first answer.
const UNKNOWN_DIMENSIONS: usize = 8192;

/// What is kept of an error body: enough for the server's message.
pub const ERROR_BODY_BYTES: usize = 16 * 1024;

/// Model listings and chat replies without streaming.
pub const OTHER_BODY_BYTES: usize = 16 * 1024 * 1024;

/// The most bytes a successful embeddings response to `inputs` texts may
/// have, with `dimensions` values a vector when known.
pub fn embeddings_limit(inputs: usize, dimensions: Option<usize>) -> usize {
    let dimensions = dimensions.filter(|&d| d > 0).unwrap_or(UNKNOWN_DIMENSIONS);
    let per_item = dimensions
        .saturating_mul(WIDEST_VALUE_BYTES)
        .saturating_add(ITEM_BYTES);
    inputs.saturating_mul(per_item).saturating_add(SLACK_BYTES)
}

/// Why a body could not be read whole.
#[derive(Debug)]
pub enum BodyError {
    /// The body is longer than the limit; what was read is dropped.
    TooLarge {
        limit: usize,
    },
    Transport(reqwest::Error),
}

/// Reads a whole body of at most `limit` bytes.
pub async fn read(mut response: reqwest::Response, limit: usize) -> Result<Bytes, BodyError> {
    let declared = response
        .content_length()
        .and_then(|n| usize::try_from(n).ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(BodyError::TooLarge { limit });
    }
    let mut body = Vec::with_capacity(declared.unwrap_or(0).min(limit));
    while let Some(piece) = response.chunk().await.map_err(BodyError::Transport)? {
        if body.len() + piece.len() > limit {
            return Err(BodyError::TooLarge { limit });
        }
        if body.is_empty() && declared == Some(piece.len()) {
            // The whole body in one piece: no copy.
            return Ok(piece);
        }
        body.extend_from_slice(&piece);
    }
    Ok(Bytes::from(body))
}

/// The first `limit` bytes of a body, or what arrived before it was cut off;
/// the rest is never read.
pub async fn prefix(mut response: reqwest::Response, limit: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while let Ok(Some(piece)) = response.chunk().await {
        let room = limit - body.len();
        body.extend_from_slice(&piece[..piece.len().min(room)]);
        if body.len() >= limit {
            break;
        }
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_follows_the_request() {
        let three = embeddings_limit(3, Some(1024));
        assert!(three >= 3 * 1024 * 24, "{three}");
        assert!(three < 1 << 20, "{three}");
        assert!(embeddings_limit(3, None) > three);
        assert_eq!(embeddings_limit(usize::MAX, Some(usize::MAX)), usize::MAX);
    }
}
