//! Drawing faults, and the broken bodies some of them send.

use std::io;

use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::config::Faults;

/// A fault injected into one response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    RateLimited,
    Internal,
    Overloaded,
    Drop,
    Truncate,
    Slow,
    Shuffle,
    WrongDimensions,
    Nan,
    ErrorIn200,
    LyingRateLimited,
}

impl Fault {
    const DRAW_ORDER: [Fault; 11] = [
        Fault::RateLimited,
        Fault::Internal,
        Fault::Overloaded,
        Fault::Drop,
        Fault::Truncate,
        Fault::Slow,
        Fault::Shuffle,
        Fault::WrongDimensions,
        Fault::Nan,
        Fault::ErrorIn200,
        Fault::LyingRateLimited,
    ];

    /// The name the ledger records it under.
    pub fn name(self) -> &'static str {
        match self {
            Fault::RateLimited => "429",
            Fault::Internal => "500",
            Fault::Overloaded => "503",
            Fault::Drop => "drop",
            Fault::Truncate => "truncate",
            Fault::Slow => "slow",
            Fault::Shuffle => "shuffle",
            Fault::WrongDimensions => "wrong_dimensions",
            Fault::Nan => "nan",
            Fault::ErrorIn200 => "error_200",
            Fault::LyingRateLimited => "lying_429",
        }
    }

    /// Faults that only make sense for an embeddings response.
    fn embeddings_only(self) -> bool {
        matches!(
            self,
            Fault::Shuffle | Fault::WrongDimensions | Fault::Nan | Fault::LyingRateLimited
        )
    }
}

/// The seeded generator and the number of faults injected so far.
#[derive(Debug)]
pub(crate) struct FaultDice {
    rates: [(&'static str, f64); 11],
    limit: Option<u64>,
    rng: StdRng,
    injected: u64,
}

impl FaultDice {
    pub fn new(faults: &Faults) -> Self {
        FaultDice {
            rates: faults.rates(),
            limit: faults.limit,
            rng: StdRng::seed_from_u64(faults.seed),
            injected: 0,
        }
    }

    /// Draws once for one request. A chat request that draws an
    /// embeddings-only fault gets none.
    pub fn roll(&mut self, embeddings: bool) -> Option<Fault> {
        let draw: f64 = self.rng.random();
        if self.limit.is_some_and(|limit| self.injected >= limit) {
            return None;
        }
        let mut cumulative = 0.0;
        let mut drawn = None;
        for (fault, (_, rate)) in Fault::DRAW_ORDER.into_iter().zip(self.rates) {
            cumulative += rate;
            if draw < cumulative {
                drawn = Some(fault);
                break;
            }
        }
        let fault = drawn.filter(|f| embeddings || !f.embeddings_only())?;
        self.injected += 1;
        Some(fault)
    }

    /// A position in `0..len`, for the damaged item or value.
    pub fn pick(&mut self, len: usize) -> usize {
        if len == 0 {
            0
        } else {
            self.rng.random_range(0..len)
        }
    }

    /// A shuffled order of `0..len`, never the identity when `len > 1`.
    pub fn permutation(&mut self, len: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..len).collect();
        order.shuffle(&mut self.rng);
        if len > 1 && order.iter().enumerate().all(|(i, &j)| i == j) {
            order.swap(0, 1);
        }
        order
    }
}

/// A body that fails before its first byte: the connection is cut.
pub(crate) fn dropped_body() -> Body {
    Body::from_stream(futures::stream::once(async {
        Err::<Bytes, _>(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "simulated connection drop",
        ))
    }))
}

/// A body that sends about the first half of `full`, then fails.
pub(crate) fn truncated_body(full: Vec<u8>) -> Body {
    let mut half = full;
    half.truncate(half.len() / 2);
    let head = futures::stream::once(async move { Ok(Bytes::from(half)) });
    // Yielding first lets the server flush the half before the connection is cut.
    let cut = futures::stream::once(async {
        tokio::task::yield_now().await;
        Err(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "simulated truncated body",
        ))
    });
    Body::from_stream(head.chain(cut))
}
