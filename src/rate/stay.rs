//! How long a use stays in a sliding window whose reset tells when its
//! oldest use leaves, from that reset and this process's own sends.
//!
//! An answer to a request sent at `sent_at` whose reset is `reset` says the
//! oldest use the window counts leaves `reset` after the request was taken
//! in. When that oldest use is one of this process's, sent at `s`, the
//! window is `sent_at + reset - s` long: the service takes each request in
//! about the same time after its send, and that time drops out. A process
//! does not know which answers those are, so each of its paced sends gives
//! a length; the window's is the one that comes back answer after answer
//! (about as often as the process's part of the window), where the others'
//! uses give lengths scattered over the window. A length stands where no
//! answer rules it out: none of the process's uses would have been in the
//! window and older than the oldest the answer told of.
//!
//! Lengths a period of the process's own pace apart come back about as
//! often while the pace holds, and stand too; but a process's share, and
//! its pace with it, moves with every answer, and they move with it while
//! the window's length does not: of the lengths that stand, the one with
//! the most hits is taken (the shorter of two alike), and one taken holds
//! while it stands with half the hits of the best. No window is shorter
//! than a reset it gave ([`super::share::Refill`] keeps the longest), and
//! the length is read afresh from the latest answers every eighth of the
//! longest reset, so a wrong one does not last. The same oldest use told by
//! several answers counts once; a process alone, which sends in bursts,
//! reads nothing; and where the round trips differ by more than a
//! sixteenth of the longest reset, no length is read.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

/// Answers remembered.
const ANSWERS: usize = 128;

/// The lengths one answer gives, at most.
const MAX_LENGTHS: usize = 512;

/// A length is taken once this many answers gave it (within the tolerance).
const MIN_HITS: usize = 4;

/// A length stands once this many answers could have ruled it out and none did.
const MIN_ANSWERS: usize = 8;

/// A length told before holds while it has at least 1 / this of the
/// most hits of any.
const HOLD_PARTS: usize = 2;

/// Lengths looked at, the most hits first.
const MAX_EXAMINED: usize = 64;

/// A length is read where the tolerance is at most this part of the
/// longest reset: round trips that differ by more blur every length.
const COARSEST: u32 = 16;

/// The answers are read for the length this many times in the longest reset.
const READS: u32 = 8;

/// The answers of the latest windows, and the length they tell.
#[derive(Debug, Clone, Default)]
pub(super) struct Stays {
    answers: VecDeque<Answer>,
    /// How many of the answers gave each length.
    counts: BTreeMap<i64, usize>,
    /// The length the answers told when last read, where they told one.
    length: Option<Duration>,
    /// When they were last read.
    read_at: Option<Instant>,
}

/// An answer, and the lengths in milliseconds its reset gives with the
/// process's paced sends before it.
#[derive(Debug, Clone)]
struct Answer {
    sent_at: Instant,
    reset: Duration,
    lengths: Vec<i64>,
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Stays {
    /// The range of lengths worth reading, in milliseconds, where the
    /// longest reset told is `known`: none is shorter, and none more than
    /// twice the length told so far (it grows in steps).
    fn range(&self, known: Duration, tolerance: Duration) -> (i64, i64) {
        let least = millis(known.saturating_sub(tolerance));
        let told = self.length.unwrap_or(known).max(known);
        (
            least,
            millis(told.saturating_mul(2).saturating_add(tolerance)),
        )
    }

    /// Takes in an answer to a request sent at `sent_at` whose reset was
    /// `reset`, where the process's paced sends before it (the newest
    /// first) were `paced`, the longest reset so far being `known` and the
    /// service taking requests in `tolerance` sooner or later.
    pub(super) fn answered(
        &mut self,
        (sent_at, reset): (Instant, Duration),
        paced: impl Iterator<Item = Instant>,
        known: Duration,
        tolerance: Duration,
    ) {
        let (least, most) = self.range(known, tolerance);
        // The same oldest use told again gives the same lengths again:
        // they count once.
        let leaves = sent_at.checked_add(reset);
        let told = self.answers.iter().any(|a| {
            a.sent_at
                .checked_add(a.reset)
                .zip(leaves)
                .is_some_and(|(a, b)| {
                    millis(
                        a.saturating_duration_since(b)
                            .max(b.saturating_duration_since(a)),
                    ) <= millis(tolerance).max(1)
                })
        });
        let lengths = if told {
            Vec::new()
        } else {
            paced
                .filter(|s| *s < sent_at)
                .map(|s| millis(sent_at.saturating_duration_since(s).saturating_add(reset)))
                .skip_while(|length| *length < least)
                .take_while(|length| *length <= most)
                .take(MAX_LENGTHS)
                .collect()
        };
        for length in &lengths {
            *self.counts.entry(*length).or_default() += 1;
        }
        if self.answers.len() >= ANSWERS {
            if let Some(old) = self.answers.pop_front() {
                for length in old.lengths {
                    if let Some(count) = self.counts.get_mut(&length) {
                        *count -= 1;
                        if *count == 0 {
                            self.counts.remove(&length);
                        }
                    }
                }
            }
        }
        self.answers.push_back(Answer {
            sent_at,
            reset,
            lengths,
        });
    }

    /// Whether the answers are due to be read again as of an answer to a
    /// request sent at `sent_at`, the longest reset being `known`.
    pub(super) fn due(&self, sent_at: Instant, known: Duration) -> bool {
        self.read_at
            .is_none_or(|at| sent_at.saturating_duration_since(at) >= known / READS)
    }

    /// The length the answers were last read to tell, where they told one.
    pub(super) fn length(&self) -> Option<Duration> {
        self.length
    }

    /// Reads the answers as of one to a request sent at `sent_at`, with
    /// the process's sends (`sends`, in the order they went) for what they
    /// rule out: the window's length where they tell one longer than
    /// `known` by more than `tolerance`.
    pub(super) fn read(
        &mut self,
        sent_at: Instant,
        sends: &[Instant],
        known: Duration,
        tolerance: Duration,
    ) -> Option<Duration> {
        self.read_at = Some(sent_at);
        if tolerance.saturating_mul(COARSEST) > known {
            // Round trips that differ by as much as the window tell no length.
            self.length = None;
            return None;
        }
        let (least, most) = self.range(known, tolerance);
        let slack = millis(tolerance).max(1);
        // Each length's hits: the lengths within the slack of it.
        let counts: Vec<(i64, usize)> = self
            .counts
            .range(least.saturating_sub(slack)..=most.saturating_add(slack))
            .map(|(length, count)| (*length, *count))
            .collect();
        let mut scored: Vec<(usize, i64)> = Vec::new();
        let (mut low, mut high, mut hits) = (0, 0, 0);
        for &(length, _) in &counts {
            while high < counts.len() && counts[high].0 <= length.saturating_add(slack) {
                hits += counts[high].1;
                high += 1;
            }
            while counts[low].0 < length - slack {
                hits -= counts[low].1;
                low += 1;
            }
            if hits >= MIN_HITS && (least..=most).contains(&length) {
                scored.push((hits, length));
            }
        }
        // The most hits first, the shorter of two alike.
        scored.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let Some(earliest) = sends.first().copied() else {
            self.length = None;
            return None;
        };
        let best = scored
            .into_iter()
            .take(MAX_EXAMINED)
            .find(|(_, length)| self.stands(*length, sends, earliest, slack));
        // The length told before holds while it stands with half the hits
        // of the best: the true one always stands, and the others come and
        // go with the pace.
        let held = self.length.map(millis).filter(|length| {
            let hits: usize = self
                .counts
                .range(length.saturating_sub(slack)..=length.saturating_add(slack))
                .map(|(_, count)| *count)
                .sum();
            best.is_none_or(|(most, _)| hits * HOLD_PARTS >= most)
                && self.stands(*length, sends, earliest, slack)
        });
        self.length = held
            .or(best.map(|(_, length)| length))
            .filter(|length| *length > millis(known.saturating_add(tolerance)))
            .and_then(|length| u64::try_from(length).ok())
            .map(Duration::from_millis);
        self.length
    }

    /// Whether a window of `length` ms stands against the answers: none
    /// rules it out, and enough of them could have, the process having
    /// sent (since `earliest`, its oldest send remembered) where a use of
    /// its would have had to be.
    fn stands(&self, length: i64, sends: &[Instant], earliest: Instant, slack: i64) -> bool {
        let mut could = 0;
        for answer in &self.answers {
            let Some(oldest) = u64::try_from(length - slack)
                .ok()
                .and_then(|age| answer.sent_at.checked_sub(Duration::from_millis(age)))
            else {
                continue;
            };
            if oldest < earliest {
                continue;
            }
            could += 1;
            if Stays::rules_out(answer, length, sends, slack) {
                return false;
            }
        }
        could >= MIN_ANSWERS
    }

    /// Whether `answer` rules out a window of `length` ms: one of the
    /// process's uses, sent before the answered request, would have been
    /// in the window and left it before the oldest the answer told of.
    fn rules_out(answer: &Answer, length: i64, sends: &[Instant], slack: i64) -> bool {
        let reset = millis(answer.reset);
        if reset <= 2 * slack {
            return false;
        }
        // A send aged within (length - reset + slack, length - slack) at
        // the answered request's send.
        let oldest = u64::try_from(length - slack).unwrap_or(0);
        let youngest = u64::try_from(length - reset + slack).unwrap_or(0);
        let (Some(from), Some(to)) = (
            answer.sent_at.checked_sub(Duration::from_millis(oldest)),
            answer.sent_at.checked_sub(Duration::from_millis(youngest)),
        ) else {
            return false;
        };
        let first = sends.partition_point(|s| *s <= from);
        sends.get(first).is_some_and(|s| *s < to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A process pacing its sends 35 to 45 ms apart (its share moving) on
    /// a sliding window of `window` ms whose resets tell when its oldest
    /// use leaves, the others keeping it busy: at each answer the oldest use
    /// is the process's own oldest one still in the window one time in
    /// three, and else another's, older. The length the process reads,
    /// knowing `known` ms.
    fn read(window: u64, known: u64) -> Option<Duration> {
        let start = Instant::now();
        let mut seed: u64 = 11;
        let mut random = move |below: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % below
        };
        let known = ms(known);
        let (mut stays, mut own) = (Stays::default(), Vec::new());
        let mut at = 0;
        for _ in 0..500 {
            // The share moves with every answer, and the pace with it.
            at += 35 + random(11);
            let sent_at = start + ms(at);
            // The process's uses still in the window, the oldest's age.
            let age = own
                .iter()
                .map(|s: &Instant| sent_at.duration_since(*s))
                .filter(|age| *age < ms(window))
                .max();
            own.push(sent_at);
            let Some(age) = age else { continue };
            let reset = if random(3) == 0 {
                ms(window) - age
            } else {
                // Another's use, older than the process's oldest.
                let gap = ms(window) - age;
                gap.mul_f64(random(1000) as f64 / 1000.0)
            };
            // To the millisecond, as headers write it.
            let reset = ms(reset.as_millis() as u64).max(ms(1));
            stays.answered((sent_at, reset), own.iter().rev().copied(), known, ms(1));
            if stays.due(sent_at, known) {
                stays.read(sent_at, &own, known, ms(1));
            }
        }
        stays.length()
    }

    #[test]
    fn a_process_that_came_to_a_busy_window_reads_its_length_from_its_own_uses() {
        // The longest reset the process saw was 1.1 s: the others kept the
        // window near full, its oldest use always about to leave.
        let length = read(2000, 1100).expect("a length");
        assert!(
            length >= ms(1998) && length <= ms(2001),
            "{length:?} for a window of 2 s"
        );
        let length = read(3000, 1800).expect("a length");
        assert!(length >= ms(2998) && length <= ms(3001), "{length:?}");
    }

    #[test]
    fn a_window_whose_length_is_known_is_not_lengthened() {
        assert_eq!(read(2000, 2000), None);
    }

    #[test]
    fn the_same_oldest_use_told_again_counts_once() {
        let start = Instant::now();
        let own: Vec<Instant> = (0..40).map(|i| start + ms(i * 50)).collect();
        let mut stays = Stays::default();
        // Ten answers, all telling of the same oldest use (leaving at 2.5 s).
        for i in 30..40 {
            let sent_at = start + ms(i * 50);
            let reset = (start + ms(2500)).duration_since(sent_at);
            stays.answered(
                (sent_at, reset),
                own[..i as usize].iter().rev().copied(),
                ms(1000),
                ms(1),
            );
        }
        let given: usize = stays
            .answers
            .iter()
            .filter(|a| !a.lengths.is_empty())
            .count();
        assert_eq!(given, 1);
    }
}
