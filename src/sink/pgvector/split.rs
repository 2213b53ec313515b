//! One table written by the shards of a job (`--shard I/N`).
//!
//! Each shard holds the rows of its own documents, which the database finds
//! by the same hash of `doc_id` the shard chooses its documents by
//! ([`rows_of`]). The metadata table is shared: a shard's keys carry its
//! name (`part-00001-of-00004:embedjob.usage.prompt_tokens`), a run of the
//! whole job's do not, so that each run records its own usage and its own
//! generation, and shards finishing at once do not undo each other.
//!
//! Each shard also records the whole input it read (`embedjob.input`). A
//! document renamed between two shards' runs moves to another shard: until
//! the shard that held it runs again on the new input (and removes it as
//! one of its gone documents), the table holds it under both names. Shards
//! whose inputs differ are named when a shard finishes and when the table is
//! searched ([`Namespaces::inputs_after`]), and nothing is refused: an
//! incremental re-run after the input changed starts with exactly that.

use std::collections::BTreeMap;

use crate::contract::{FINGERPRINT_KEY, GENERATION_KEY, INPUT_KEY, JOB_KEY, METADATA_COLUMNS_KEY};
use crate::job::Shard;

/// Whose keys: a shard's, or (`None`) a run of the whole job's.
pub(crate) type Owner = Option<Shard>;

/// The metadata table's keys, by the run that wrote them.
#[derive(Debug, Clone, Default)]
pub(crate) struct Namespaces(BTreeMap<Owner, BTreeMap<String, String>>);

impl Namespaces {
    pub fn new(all: BTreeMap<String, String>) -> Namespaces {
        let mut spaces: BTreeMap<Owner, BTreeMap<String, String>> = BTreeMap::new();
        for (key, value) in all {
            let (owner, key) = match key.split_once(':') {
                Some((name, rest)) => match Shard::from_file_name(&format!("{name}.parquet")) {
                    Some(shard) => (Some(shard), rest.to_string()),
                    None => (None, key),
                },
                None => (None, key),
            };
            spaces.entry(owner).or_default().insert(key, value);
        }
        Namespaces(spaces)
    }

    /// `key` as `owner` stores it.
    pub fn key(owner: Owner, key: &str) -> String {
        match owner {
            Some(shard) => format!("{}:{key}", shard.name()),
            None => key.to_string(),
        }
    }

    /// The generation a run of `owner` finishing now writes: one past the
    /// last it wrote.
    pub fn next_generation(&self, owner: Owner) -> u64 {
        self.of(owner)
            .and_then(|keys| keys.get(GENERATION_KEY))
            .and_then(|g| g.parse::<u64>().ok())
            .unwrap_or(0)
            + 1
    }

    /// What `owner` recorded, when it recorded anything.
    pub fn of(&self, owner: Owner) -> Option<&BTreeMap<String, String>> {
        self.0.get(&owner)
    }

    /// The keys of the run that made the table's rows: `owner`'s own, or,
    /// before its first run, those of another run of the job, for their
    /// fingerprint and metadata columns (the rows of the owner's documents
    /// are still reusable).
    pub fn basis_for(&self, owner: Owner) -> BTreeMap<String, String> {
        if let Some(own) = self.of(owner) {
            return own.clone();
        }
        let Some(other) = self
            .0
            .values()
            .find(|keys| keys.contains_key(FINGERPRINT_KEY))
        else {
            return BTreeMap::new();
        };
        [FINGERPRINT_KEY, METADATA_COLUMNS_KEY]
            .into_iter()
            .filter_map(|key| other.get(key).map(|v| (key.to_string(), v.clone())))
            .collect()
    }

    /// The job, other than `job`, that a run on the table recorded (`embedjob.job`).
    pub fn other_job(&self, job: &str) -> Option<&str> {
        self.0
            .values()
            .filter_map(|keys| keys.get(JOB_KEY))
            .map(String::as_str)
            .find(|owner| *owner != job)
    }

    /// Every run's keys, by the run.
    pub fn all(&self) -> impl Iterator<Item = (Owner, &BTreeMap<String, String>)> {
        self.0.iter().map(|(o, keys)| (*o, keys))
    }

    /// The metadata of the table as a whole, for a search: the whole job's
    /// run's keys, else a shard's (shards share one configuration).
    pub fn table_view(&self) -> BTreeMap<String, String> {
        self.of(None)
            .or_else(|| self.0.values().next())
            .cloned()
            .unwrap_or_default()
    }

    /// The generations a run of `owner` must find unchanged when it
    /// finishes: its own and the whole job's runs' (a run of the whole job
    /// changes every shard's rows); for a run of the whole job, every one.
    pub fn watched(&self, owner: Owner, generation_key: &str) -> BTreeMap<Owner, String> {
        self.0
            .iter()
            .filter(|(o, _)| owner.is_none() || o.is_none() || **o == owner)
            .filter_map(|(o, keys)| keys.get(generation_key).map(|g| (*o, g.clone())))
            .collect()
    }

    /// The other runs whose rows were made under another configuration
    /// than `fingerprint`.
    pub fn conflicts(&self, owner: Owner, fingerprint: Option<&String>) -> Vec<Owner> {
        self.0
            .iter()
            .filter(|(o, keys)| **o != owner && keys.get(FINGERPRINT_KEY) != fingerprint)
            .map(|(o, _)| *o)
            .collect()
    }

    /// The runs whose keys a run of `owner` replaces besides its own: for
    /// a run of the whole job, every shard's (it now holds all their rows).
    pub fn superseded(&self, owner: Owner) -> Vec<Owner> {
        match owner {
            Some(_) => Vec::new(),
            None => self.0.keys().filter(|o| o.is_some()).copied().collect(),
        }
    }

    /// The keys, as stored, of the runs in `owners`.
    pub fn stored_keys(&self, owners: &[Owner]) -> Vec<String> {
        owners
            .iter()
            .filter_map(|o| self.0.get(o).map(|keys| (o, keys)))
            .flat_map(|(o, keys)| keys.keys().map(|k| Namespaces::key(*o, k)))
            .collect()
    }

    /// The inputs the shards of the table recorded, each with the shards
    /// that read it: those in `kept`, with `ran` (a shard that just read
    /// `input`) counted as having read it.
    fn inputs<'a>(
        &'a self,
        kept: &[Owner],
        ran: Option<(Shard, &'a str)>,
    ) -> BTreeMap<&'a str, Vec<Shard>> {
        let mut inputs: BTreeMap<&str, Vec<Shard>> = BTreeMap::new();
        for (owner, keys) in &self.0 {
            let Some(shard) = *owner else { continue };
            if !kept.contains(owner) || ran.is_some_and(|(s, _)| s == shard) {
                continue;
            }
            if let Some(input) = keys.get(INPUT_KEY) {
                inputs.entry(input.as_str()).or_default().push(shard);
            }
        }
        if let Some((shard, input)) = ran {
            inputs.entry(input).or_default().push(shard);
        }
        inputs
    }

    /// A warning when the shards whose rows the table holds (those of
    /// `kept`, and the shard of `ran` with the input it just read) did not
    /// all read the same input: a document renamed, removed or added
    /// between their runs may be held twice or be missing until they run
    /// again on one input. Shards that recorded no input are not compared.
    fn input_warning(
        &self,
        table: &str,
        kept: &[Owner],
        ran: Option<(Shard, &str)>,
    ) -> Option<String> {
        let inputs = self.inputs(kept, ran);
        if inputs.len() < 2 {
            return None;
        }
        let read: Vec<String> = inputs
            .iter()
            .map(|(input, shards)| format!("{} read {input}", named(shards)))
            .collect();
        let again = match ran {
            Some((shard, input)) => {
                let behind: Vec<Shard> = inputs
                    .iter()
                    .filter(|(other, _)| **other != input)
                    .flat_map(|(_, shards)| shards.iter().copied())
                    .collect();
                let verb = if behind.len() == 1 { "runs" } else { "run" };
                format!(
                    "{} {verb} again on the input shard {shard} read",
                    named(&behind)
                )
            }
            None => "every shard runs again on the same input".to_string(),
        };
        Some(format!(
            "table {table}: its shards read different inputs ({}), so a document renamed, \
             removed or added between their runs may be held twice or be missing until {again}",
            read.join("; ")
        ))
    }

    /// [`Namespaces::input_warning`] as a run of `owner` that recorded
    /// `extra` finishes, replacing the rows of `conflicts`; none for a run
    /// of the whole job, which replaces every shard's rows.
    pub fn inputs_after(
        &self,
        table: &str,
        owner: Owner,
        extra: &BTreeMap<String, String>,
        conflicts: &[Owner],
    ) -> Option<String> {
        let ran = owner.zip(extra.get(INPUT_KEY))?;
        let kept = self.keepers(owner, conflicts);
        self.input_warning(table, &kept, Some((ran.0, ran.1.as_str())))
    }

    /// [`Namespaces::input_warning`] for a search: every shard's input is compared.
    pub fn inputs_searched(&self, table: &str) -> Vec<String> {
        let every: Vec<Owner> = self.0.keys().copied().collect();
        self.input_warning(table, &every, None)
            .into_iter()
            .collect()
    }

    /// The other runs whose rows stay when `conflicts` go.
    pub fn keepers(&self, owner: Owner, conflicts: &[Owner]) -> Vec<Owner> {
        self.0
            .keys()
            .filter(|o| **o != owner && !conflicts.contains(o))
            .copied()
            .collect()
    }
}

/// A condition on a row's `doc_id` that holds for the rows of `shard`: the
/// first four bytes of the SHA-256 of the id, as a number, modulo the count
/// (as [`Shard::of`] computes it). Public so that a test can hold it to
/// [`Shard::of`] in a real database.
pub fn rows_of(shard: Shard) -> String {
    format!(
        "(('x' || left(encode(sha256(convert_to(doc_id, 'UTF8')), 'hex'), 8))::bit(32)::bigint \
         % {}) = {}",
        shard.count, shard.index
    )
}

/// A condition for the rows `owner`'s runs hold (all of them for a run of
/// the whole job).
pub(crate) fn rows_of_owner(owner: Owner) -> String {
    owner.map_or_else(|| "TRUE".to_string(), rows_of)
}

/// A condition for the rows of `gone` that none of `kept` holds.
pub(crate) fn rows_only_of(gone: Owner, kept: &[Owner]) -> String {
    if kept.is_empty() {
        return rows_of_owner(gone);
    }
    let kept: Vec<String> = kept.iter().map(|o| rows_of_owner(*o)).collect();
    format!("{} AND NOT ({})", rows_of_owner(gone), kept.join(" OR "))
}

/// Shards for messages: `shard 1/4`, `shards 0/4, 2/4`, and how many more past a few.
fn named(shards: &[Shard]) -> String {
    const NAMED: usize = 8;
    let shown: Vec<String> = shards.iter().take(NAMED).map(Shard::to_string).collect();
    let word = if shards.len() == 1 { "shard" } else { "shards" };
    format!(
        "{word} {}",
        crate::display::listed(&shown, shards.len() as u64)
    )
}

/// A run's name for messages: `shard 1/4`, or `the whole job`.
pub(crate) fn describe(owner: Owner) -> String {
    owner.map_or_else(
        || "a run of the whole job".to_string(),
        |s| format!("shard {s}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(index: u32, count: u32) -> Owner {
        Some(Shard::new(index, count).unwrap())
    }

    fn spaces(pairs: &[(&str, &str)]) -> Namespaces {
        Namespaces::new(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        )
    }

    #[test]
    fn keys_are_sorted_by_the_run_that_wrote_them() {
        let s = spaces(&[
            ("embedjob.fingerprint", "A"),
            ("part-00001-of-00004:embedjob.fingerprint", "B"),
            ("part-00001-of-00004:embedjob.generation", "3"),
            ("odd:key", "kept whole"),
        ]);
        assert_eq!(s.of(None).unwrap()["odd:key"], "kept whole");
        assert_eq!(s.of(shard(1, 4)).unwrap()["embedjob.generation"], "3");
        assert_eq!(
            Namespaces::key(shard(1, 4), "embedjob.generation"),
            "part-00001-of-00004:embedjob.generation"
        );
        // Another shard's first run takes the fingerprint of the rows already there.
        assert_eq!(s.basis_for(shard(2, 4))[FINGERPRINT_KEY], "A");
        assert_eq!(s.basis_for(shard(1, 4))["embedjob.generation"], "3");
        assert!(Namespaces::default().basis_for(None).is_empty());
    }

    #[test]
    fn a_shards_first_run_takes_the_metadata_columns_with_the_fingerprint() {
        let s = spaces(&[
            ("embedjob.fingerprint", "A"),
            ("embedjob.metadata_columns", r#"[["lang","text"]]"#),
            ("embedjob.generation", "2"),
        ]);
        let basis = s.basis_for(shard(0, 2));
        assert_eq!(basis.len(), 2, "{basis:?}");
        assert_eq!(basis[METADATA_COLUMNS_KEY], r#"[["lang","text"]]"#);
        let owners: Vec<Owner> = s.all().map(|(o, _)| o).collect();
        assert_eq!(owners, [None]);
    }

    #[test]
    fn a_shard_watches_its_own_generation_and_the_whole_jobs() {
        let s = spaces(&[
            ("embedjob.generation", "1"),
            ("part-00000-of-00002:embedjob.generation", "5"),
            ("part-00001-of-00002:embedjob.generation", "7"),
        ]);
        let watched = s.watched(shard(0, 2), "embedjob.generation");
        assert_eq!(watched.len(), 2);
        assert_eq!(watched[&shard(0, 2)], "5");
        assert_eq!(s.watched(None, "embedjob.generation").len(), 3);
    }

    #[test]
    fn runs_under_another_configuration_conflict() {
        let a = "A".to_string();
        let s = spaces(&[
            ("part-00000-of-00002:embedjob.fingerprint", "A"),
            ("part-00001-of-00002:embedjob.fingerprint", "B"),
        ]);
        assert_eq!(s.conflicts(shard(0, 2), Some(&a)), [shard(1, 2)]);
        assert_eq!(s.keepers(shard(0, 2), &[shard(1, 2)]), []);
        assert_eq!(s.conflicts(None, Some(&a)), [shard(1, 2)]);
        // A run of the whole job takes every shard's rows over.
        assert_eq!(s.superseded(None), [shard(0, 2), shard(1, 2)]);
        assert_eq!(s.superseded(shard(0, 2)), []);
        assert_eq!(
            s.stored_keys(&[shard(1, 2)]),
            ["part-00001-of-00002:embedjob.fingerprint"]
        );
    }

    #[test]
    fn shards_that_read_another_input_are_named_and_those_that_agree_are_not() {
        let s = spaces(&[
            ("part-00000-of-00004:embedjob.input", "3 documents, ids a"),
            ("part-00001-of-00004:embedjob.input", "3 documents, ids a"),
            ("part-00002-of-00004:embedjob.input", "3 documents, ids b"),
            ("part-00003-of-00004:embedjob.fingerprint", "F"),
        ]);
        let all: Vec<Owner> = s.all().map(|(o, _)| o).collect();
        let two = Shard::new(2, 4).unwrap();
        let zero = Shard::new(0, 4).unwrap();
        // Shard 2 runs again on input a: all that recorded one now agree.
        assert_eq!(
            s.input_warning("t", &all, Some((two, "3 documents, ids a"))),
            None
        );
        // Shard 0 runs on a new input c: 1/4 and 2/4 are behind it.
        let warning = s
            .input_warning("t", &all, Some((zero, "4 documents, ids c")))
            .unwrap();
        assert_eq!(
            warning,
            "table t: its shards read different inputs (shard 1/4 read 3 documents, ids a; \
             shard 2/4 read 3 documents, ids b; shard 0/4 read 4 documents, ids c), so a \
             document renamed, removed or added between their runs may be held twice or be \
             missing until shards 1/4, 2/4 run again on the input shard 0/4 read"
        );
        // A shard whose rows go (another configuration's) is not compared.
        let kept = [shard(0, 4), shard(1, 4)];
        assert_eq!(
            s.input_warning("t", &kept, Some((zero, "3 documents, ids a"))),
            None
        );
        // A search names them all.
        let found = s.inputs_searched("t").concat();
        assert!(
            found.ends_with("until every shard runs again on the same input"),
            "{found}"
        );
        assert!(
            found.contains("shards 0/4, 1/4 read 3 documents, ids a"),
            "{found}"
        );
        assert_eq!(spaces(&[]).input_warning("t", &[], None), None);
        // As a run finishes: a shard's compares, a run of the whole job's replaces them all.
        let extra: BTreeMap<String, String> =
            [(INPUT_KEY.to_string(), "4 documents, ids c".to_string())].into();
        let after = s
            .inputs_after("t", shard(0, 4), &extra, &[shard(2, 4)])
            .unwrap();
        assert!(after.ends_with("until shard 1/4 runs again on the input shard 0/4 read"));
        assert_eq!(s.inputs_after("t", None, &extra, &[]), None);
        assert_eq!(
            s.inputs_after("t", shard(0, 4), &BTreeMap::new(), &[]),
            None
        );
    }

    #[test]
    fn many_shards_are_named_up_to_a_few() {
        let shards: Vec<Shard> = (0..20).map(|i| Shard::new(i, 20).unwrap()).collect();
        assert_eq!(
            named(&shards),
            "shards 0/20, 1/20, 2/20, 3/20, 4/20, 5/20, 6/20, 7/20 and 12 more"
        );
        assert_eq!(named(&shards[..1]), "shard 0/20");
    }

    /// What the condition selects is held to [`Shard::of`] in a real
    /// database (`tests/it/pgvector.rs`); here, how conditions combine.
    #[test]
    fn the_rows_of_a_run_are_told_by_condition() {
        let s = Shard::new(1, 4).unwrap();
        assert_eq!(rows_only_of(None, &[]), "TRUE");
        assert_eq!(
            rows_only_of(None, &[Some(s)]),
            format!("TRUE AND NOT ({})", rows_of(s))
        );
    }
}
