//! The checksum of the vectors a file holds, so that a file damaged after it
//! was written (a flipped bit, a torn copy) is never read back as vectors.
//!
//! XXH3 (64 bits, seed 0) over every row in order: its content hash (32
//! bytes) and then its vector (little-endian `f32`). It is recorded as
//! `embedjob.checksum` = `xxh3-64:<16 hex digits>`; the hash is fast enough
//! to keep up with writing (several GB/s), and covers what a reader uses.

use std::hash::Hasher as _;

use twox_hash::XxHash3_64;

const ALGORITHM: &str = "xxh3-64";

/// A checksum being computed, row after row.
#[derive(Clone)]
pub struct Checksum {
    hasher: XxHash3_64,
}

impl Default for Checksum {
    fn default() -> Self {
        Checksum::new()
    }
}

impl std::fmt::Debug for Checksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Checksum")
    }
}

impl Checksum {
    pub fn new() -> Self {
        Checksum {
            hasher: XxHash3_64::with_seed(0),
        }
    }

    /// Adds one row: its content hash and its vector.
    pub fn row(&mut self, content_hash: &[u8; 32], vector: &[f32]) {
        self.hasher.write(content_hash);
        if cfg!(target_endian = "little") {
            use arrow::datatypes::ToByteSlice as _;
            self.hasher.write(vector.to_byte_slice());
        } else {
            for value in vector {
                self.hasher.write(&value.to_le_bytes());
            }
        }
    }

    /// The value recorded under [`CHECKSUM_KEY`].
    pub fn value(&self) -> String {
        format!("{ALGORITHM}:{:016x}", self.hasher.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_change_to_a_row_changes_the_checksum() {
        let sum = |rows: &[([u8; 32], Vec<f32>)]| {
            let mut checksum = Checksum::new();
            for (hash, vector) in rows {
                checksum.row(hash, vector);
            }
            checksum.value()
        };
        let rows = vec![([1; 32], vec![0.5, -1.0]), ([2; 32], vec![0.25, 2.0])];
        let value = sum(&rows);
        assert!(
            value.starts_with("xxh3-64:") && value.len() == 8 + 16,
            "{value}"
        );
        assert_eq!(sum(&rows), value);
        let mut flipped = rows.clone();
        flipped[1].1[0] = f32::from_bits(flipped[1].1[0].to_bits() ^ 1);
        assert_ne!(sum(&flipped), value);
        let mut rehashed = rows.clone();
        rehashed[0].0[31] ^= 0x80;
        assert_ne!(sum(&rehashed), value);
        let swapped = vec![rows[1].clone(), rows[0].clone()];
        assert_ne!(sum(&swapped), value);
    }
}
