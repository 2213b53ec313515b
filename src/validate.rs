//! The checks every embeddings response must pass before a vector is kept.
//!
//! A response is trusted for nothing: the count, the placement by `index`,
//! the length of every vector and the finiteness of every value are checked,
//! and the first failure says exactly which check it was.

use crate::types::{RawItem, RawVectors, Vectors};

/// The vector length of the models the service documents (kept with the
/// job's checks, which refuse a `backend.dimensions` longer than it).
pub use crate::job::known_model_dimensions;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    #[error("item count: {got} vectors for {expected} inputs")]
    Count { expected: usize, got: usize },
    #[error("index range: index {index} is outside 0..{count}")]
    IndexOutOfRange { index: i64, count: usize },
    #[error("index uniqueness: index {index} appears more than once")]
    DuplicateIndex { index: usize },
    #[error("vector length: index {index} has {got} values, expected {expected}")]
    Dimensions {
        index: usize,
        expected: usize,
        got: usize,
    },
    #[error("finite values: index {index} has {value} at position {position}")]
    NonFinite {
        index: usize,
        position: usize,
        value: f32,
    },
    #[error("vector length: the vectors are empty")]
    Empty,
    /// Every vector has another length than expected: the model makes
    /// vectors of that length, and sending again cannot change it.
    #[error("vector length: every vector has {got} values, expected {expected}")]
    Length { expected: usize, got: usize },
    #[error("non-zero vectors: index {index} is all zeros")]
    AllZero { index: usize },
}

/// Checks an answer to a request of `inputs` texts, from any backend.
/// `dimensions` is the length every vector must have, or `None` to take the
/// first vector's. An answer whose items arrive in order, as they usually
/// do, is kept without a copy.
pub fn check(
    raw: impl Into<RawVectors>,
    inputs: usize,
    dimensions: Option<usize>,
) -> Result<Vectors, ValidationError> {
    let checked = check_rows(raw, inputs, dimensions)?;
    match checked.rejected.into_iter().next() {
        Some(rejected) => Err(rejected.error),
        None => Ok(checked.vectors),
    }
}

/// One vector that failed a check in an answer whose count and indices are right.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    /// The input it answers.
    pub index: usize,
    pub error: ValidationError,
}

/// An answer whose count and indices are right, sorted: the vectors that
/// passed, in input order, and those that did not.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// The rows of the inputs not in `rejected`, in input order.
    pub vectors: Vectors,
    /// Ascending by index.
    pub rejected: Vec<Rejected>,
}

/// Checks an answer as [`check`] does, but keeps the vectors that pass when
/// only some fail their length or finiteness check, so that only the inputs
/// of those need sending again. A wrong count, misplaced indices, or every
/// vector of an answer of two or more having one same wrong length
/// ([`ValidationError::Length`], the model makes vectors of another length)
/// fail the whole answer. Without `dimensions`, the length most vectors have
/// (the first vector's, on a tie) is the one expected.
pub fn check_rows(
    raw: impl Into<RawVectors>,
    inputs: usize,
    dimensions: Option<usize>,
) -> Result<Checked, ValidationError> {
    let RawVectors {
        items,
        values,
        usage,
        ..
    } = raw.into();
    let got = items.len();
    if got != inputs {
        return Err(ValidationError::Count {
            expected: inputs,
            got,
        });
    }
    // For each index, the item that holds it.
    let mut placed: Vec<Option<usize>> = vec![None; inputs];
    for (position, item) in items.iter().enumerate() {
        let index = usize::try_from(item.index)
            .ok()
            .filter(|&i| i < inputs)
            .ok_or(ValidationError::IndexOutOfRange {
                index: item.index,
                count: inputs,
            })?;
        if placed[index].replace(position).is_some() {
            return Err(ValidationError::DuplicateIndex { index });
        }
    }
    // With the count equal and no duplicates, every index is present.
    let rows: Vec<RawItem> = placed.into_iter().flatten().map(|p| items[p]).collect();
    let expected = dimensions.unwrap_or_else(|| most_common_length(&rows));
    if expected == 0 && inputs > 0 {
        return Err(ValidationError::Empty);
    }
    if let Some(first) = rows.first() {
        if rows.len() >= 2 && first.len != expected && rows.iter().all(|r| r.len == first.len) {
            return Err(ValidationError::Length {
                expected,
                got: first.len,
            });
        }
    }
    let mut rejected = Vec::new();
    let mut in_order = true;
    for (index, item) in rows.iter().enumerate() {
        if item.len != expected {
            rejected.push(Rejected {
                index,
                error: ValidationError::Dimensions {
                    index,
                    expected,
                    got: item.len,
                },
            });
            continue;
        }
        let row = &values[item.start..item.start + item.len];
        if let Some(position) = row.iter().position(|v| !v.is_finite()) {
            rejected.push(Rejected {
                index,
                error: ValidationError::NonFinite {
                    index,
                    position,
                    value: row[position],
                },
            });
            continue;
        }
        // A vector of zeros has no direction: every similarity with it is 0 or NaN.
        if row.iter().all(|v| *v == 0.0) {
            return Err(ValidationError::AllZero { index });
        }
        in_order &= item.start == index * expected;
    }
    let values = if rejected.is_empty() && in_order && values.len() == inputs * expected {
        values
    } else {
        let mut ordered = Vec::with_capacity((inputs - rejected.len()) * expected);
        let mut failed = rejected.iter().map(|r| r.index).peekable();
        for (index, item) in rows.iter().enumerate() {
            if failed.peek() == Some(&index) {
                failed.next();
                continue;
            }
            ordered.extend_from_slice(&values[item.start..item.start + item.len]);
        }
        ordered
    };
    Ok(Checked {
        vectors: Vectors {
            dimensions: expected,
            values,
            usage: usage.unwrap_or_default(),
            discarded: crate::types::Usage::default(),
        },
        rejected,
    })
}

/// The length most vectors have; the first vector's on a tie.
fn most_common_length(rows: &[RawItem]) -> usize {
    let mut counts: Vec<(usize, usize)> = Vec::new();
    for row in rows {
        match counts.iter_mut().find(|(len, _)| *len == row.len) {
            Some((_, n)) => *n += 1,
            None => counts.push((row.len, 1)),
        }
        if counts.len() > 8 {
            break;
        }
    }
    let best = counts.iter().map(|&(_, n)| n).max().unwrap_or(0);
    counts
        .iter()
        .find(|&&(_, n)| n == best)
        .map_or(0, |&(len, _)| len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::{EmbeddingItem, EmbeddingResponse};
    use crate::types::Usage;

    fn response(items: &[(i64, Vec<f32>)]) -> EmbeddingResponse {
        EmbeddingResponse {
            data: items
                .iter()
                .map(|(index, embedding)| EmbeddingItem {
                    index: *index,
                    embedding: embedding.clone(),
                })
                .collect(),
            usage: Some(Usage {
                prompt_tokens: 3,
                completion_tokens: 0,
                total_tokens: 3,
            }),
            model: None,
        }
    }

    #[test]
    fn rows_are_placed_by_index() {
        let v = check(
            response(&[(1, vec![1.0, 1.0]), (0, vec![0.0, 0.5])]),
            2,
            Some(2),
        )
        .unwrap();
        assert_eq!(v.row(0), &[0.0, 0.5]);
        assert_eq!(v.row(1), &[1.0, 1.0]);
        assert_eq!(v.usage.prompt_tokens, 3);
    }

    #[test]
    fn each_check_names_itself() {
        let cases = [
            (response(&[(0, vec![1.0])]), 2, Some(1), "item count"),
            (
                response(&[(0, vec![1.0]), (2, vec![1.0])]),
                2,
                Some(1),
                "index range",
            ),
            (
                response(&[(0, vec![1.0]), (-1, vec![1.0])]),
                2,
                Some(1),
                "index range",
            ),
            (
                response(&[(0, vec![1.0]), (0, vec![1.0])]),
                2,
                Some(1),
                "index uniqueness",
            ),
            (
                response(&[(0, vec![1.0]), (1, vec![1.0, 2.0])]),
                2,
                None,
                "vector length",
            ),
            (
                response(&[(0, vec![1.0, 2.0])]),
                1,
                Some(3),
                "vector length",
            ),
            (
                response(&[(0, vec![f32::NAN])]),
                1,
                Some(1),
                "finite values",
            ),
            (
                response(&[(0, vec![1.0, f32::INFINITY])]),
                1,
                None,
                "finite values",
            ),
            (response(&[(0, vec![])]), 1, None, "vector length"),
            (
                response(&[(0, vec![1.0, 0.0]), (1, vec![0.0, -0.0])]),
                2,
                Some(2),
                "non-zero vectors",
            ),
        ];
        for (resp, inputs, dims, check_name) in cases {
            let err = check(resp, inputs, dims).unwrap_err();
            assert!(
                err.to_string().starts_with(check_name),
                "{err} should name {check_name}"
            );
        }
    }

    #[test]
    fn a_failed_vector_is_set_apart_and_the_rest_kept() {
        let checked = check_rows(
            response(&[
                (2, vec![2.0, 2.0]),
                (0, vec![0.0, 0.5]),
                (1, vec![f32::NAN, 1.0]),
                (3, vec![3.0]),
            ]),
            4,
            Some(2),
        )
        .unwrap();
        assert_eq!(checked.vectors.values, [0.0, 0.5, 2.0, 2.0]);
        let failed: Vec<usize> = checked.rejected.iter().map(|r| r.index).collect();
        assert_eq!(failed, [1, 3]);
        assert!(checked.rejected[1]
            .error
            .to_string()
            .starts_with("vector length"));
        assert_eq!(checked.vectors.usage.prompt_tokens, 3);
    }

    #[test]
    fn every_vector_of_one_other_length_fails_the_answer() {
        let err = check_rows(
            response(&[(0, vec![1.0; 3]), (1, vec![1.0; 3])]),
            2,
            Some(2),
        )
        .unwrap_err();
        assert_eq!(
            err,
            ValidationError::Length {
                expected: 2,
                got: 3
            }
        );
        // One vector alone may be damaged: it is sent again.
        let one = check_rows(response(&[(0, vec![1.0; 3])]), 1, Some(2)).unwrap();
        assert_eq!(one.rejected.len(), 1);
        // Without a length to expect, most vectors set it.
        let most = check_rows(
            response(&[(0, vec![1.0]), (1, vec![1.0, 2.0]), (2, vec![3.0, 4.0])]),
            3,
            None,
        )
        .unwrap();
        assert_eq!(most.vectors.dimensions, 2);
        assert_eq!(most.rejected[0].index, 0);
    }

    #[test]
    fn known_models() {
        assert_eq!(known_model_dimensions("svc-embed-1"), Some(1024));
        assert_eq!(known_model_dimensions("svc-embed-1-l"), Some(3072));
        assert_eq!(known_model_dimensions("other"), None);
    }
}
