//! Shards: one run of a job as one of N parts of its input, so that a
//! scheduler (a Kubernetes Indexed Job, a Slurm job array, `xargs -P`) can
//! start the N parts at once and their outputs make one dataset.
//!
//! A document belongs to shard `I` of `N` when the first four bytes of the
//! SHA-256 of its id, read as a big-endian number, are `I` modulo `N`. The
//! hash is the same on every machine and in every version, so a document
//! stays in its shard from one run to the next: each shard's incremental
//! re-runs and its deletions stay within the shard. PostgreSQL computes the
//! same number (see `sink::pgvector`), so a shard finds its rows in a shared
//! table.

use std::fmt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The most shards a job may be split into.
pub const MAX_SHARDS: u32 = 65_536;

/// Environment variables the shard's index and count may come from.
pub const KUBERNETES_INDEX: &str = "JOB_COMPLETION_INDEX";
pub const SLURM_INDEX: &str = "SLURM_ARRAY_TASK_ID";
pub const SLURM_COUNT: &str = "SLURM_ARRAY_TASK_COUNT";
const SLURM_MIN: &str = "SLURM_ARRAY_TASK_MIN";
const SLURM_STEP: &str = "SLURM_ARRAY_TASK_STEP";

/// Shard `index` (from 0) of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// As it is written everywhere: `I/N`.
impl serde::Serialize for Shard {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl Shard {
    /// Shard `index` of `count`, when both are in range.
    pub fn new(index: u32, count: u32) -> Result<Shard, String> {
        if !(1..=MAX_SHARDS).contains(&count) {
            return Err(format!(
                "the number of shards must be between 1 and {MAX_SHARDS}, not {count}"
            ));
        }
        if index >= count {
            return Err(format!(
                "shard {index} is out of range for {count} shards (0 to {})",
                count - 1
            ));
        }
        Ok(Shard { index, count })
    }

    /// The shard of `count` that the document with id `doc_id` belongs to.
    pub fn of(doc_id: &str, count: u32) -> u32 {
        let digest = Sha256::digest(doc_id.as_bytes());
        let head = u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]);
        head % count.max(1)
    }

    /// Whether the document with id `doc_id` belongs to this shard.
    pub fn holds(&self, doc_id: &str) -> bool {
        Shard::of(doc_id, self.count) == self.index
    }

    /// `part-00001-of-00004`: the name of the shard's output and state.
    pub fn name(&self) -> String {
        format!("part-{:05}-of-{:05}", self.index, self.count)
    }

    /// `part-00001-of-00004.parquet`: the shard's file in the output directory.
    pub fn file_name(&self) -> String {
        format!("{}.parquet", self.name())
    }

    /// The shard a file named by [`Shard::file_name`] holds.
    pub fn from_file_name(name: &str) -> Option<Shard> {
        let rest = name.strip_prefix("part-")?.strip_suffix(".parquet")?;
        let (index, count) = rest.split_once("-of-")?;
        let number = |text: &str| {
            (text.len() == 5 && text.bytes().all(|b| b.is_ascii_digit()))
                .then(|| text.parse::<u32>().ok())
                .flatten()
        };
        Shard::new(number(index)?, number(count)?).ok()
    }

    /// Where the state of the shards whose output directory is `dir` lives:
    /// beside it, `<dir>.embedjob`, so that the directory holds nothing but
    /// the shards' files for the readers that read it whole.
    pub fn state_dir(dir: &Path) -> PathBuf {
        crate::fsio::with_suffix(dir, ".embedjob")
    }

    /// Claims `dir` for a split into this shard's count, before any work: a
    /// file `split` in its state directory, made whole in one step (linked
    /// into place, never overwritten), holds the count, so that of splits
    /// started at once into one directory only the first runs. Returns the
    /// count already claimed when it is another.
    pub fn claim(&self, dir: &Path) -> Result<(), String> {
        let state = Shard::state_dir(dir);
        let marker = state.join("split");
        let io = |e: std::io::Error, path: &Path| format!("{}: {e}", path.display());
        std::fs::create_dir_all(&state).map_err(|e| io(e, &state))?;
        // A name no other claim uses, in this process or another: a draft
        // shared by two claims could be linked holding the other's count.
        static CLAIMS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let claim = CLAIMS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let draft = state.join(format!("split.{}.{claim}.tmp", std::process::id()));
        std::fs::write(&draft, format!("{}\n", self.count)).map_err(|e| io(e, &draft))?;
        let linked = std::fs::hard_link(&draft, &marker);
        let _ = std::fs::remove_file(&draft);
        match linked {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io(e, &marker)),
        }
        let held = std::fs::read_to_string(&marker).map_err(|e| io(e, &marker))?;
        match held.trim().parse::<u32>() {
            Ok(count) if count == self.count => Ok(()),
            Ok(count) => Err(format!(
                "`output.path` {} is claimed by the job split into {count} shards ({}), not \
                 {}: a directory holds one split, or its shards hold the same documents \
                 twice; run --shard I/{count}, or remove the directory and {} to split it \
                 anew, or give the job another `output.path`",
                dir.display(),
                marker.display(),
                self.count,
                state.display()
            )),
            Err(_) => Err(format!(
                "{}: not a split count ({:?}); embedjob writes the number of shards there",
                marker.display(),
                held.chars().take(40).collect::<String>()
            )),
        }
    }

    /// The shards' files in `dir`, in name order, each with its shard; none
    /// when `dir` does not exist.
    fn files_in(dir: &Path) -> std::io::Result<Vec<(PathBuf, Shard)>> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry?;
            if let Some(shard) = entry.file_name().to_str().and_then(Shard::from_file_name) {
                files.push((entry.path(), shard));
            }
        }
        files.sort();
        Ok(files)
    }

    /// The number of shards whose files are in `dir`, when it holds some;
    /// an error when they are of splits into different numbers.
    pub fn count_in(dir: &Path) -> Result<Option<u32>, String> {
        let files = Shard::files_in(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let counts: std::collections::BTreeSet<u32> = files.iter().map(|(_, s)| s.count).collect();
        match counts.len() {
            0 => Ok(None),
            1 => Ok(counts.first().copied()),
            _ => Err(format!(
                "{} holds the files of splits into different numbers of shards ({}): keep \
                 the files of one split only",
                dir.display(),
                counts
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(" and ")
            )),
        }
    }

    /// The files in `dir` that are shards of another count than this one's:
    /// left by runs split another way, they would hold the same documents
    /// twice.
    pub fn foreign_files(&self, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
        Ok(Shard::files_in(dir)?
            .into_iter()
            .filter(|(_, other)| other.count != self.count)
            .map(|(path, _)| path)
            .collect())
    }
}

/// Reads `--shard`: `I/N` (shard `I`, from 0, of `N`); `N`, with the index
/// from the scheduler's environment (`JOB_COMPLETION_INDEX` of a Kubernetes
/// Indexed Job, or `SLURM_ARRAY_TASK_ID` of a Slurm job array); or `auto`,
/// index and count from a Slurm job array. `env` looks a variable up.
pub fn parse(spec: &str, env: impl Fn(&str) -> Option<String>) -> Result<Shard, String> {
    let spec = spec.trim();
    let fail = |message: String| format!("--shard {spec}: {message}");
    if let Some((index, count)) = spec.split_once('/') {
        let index = number(index, "the shard index").map_err(fail)?;
        let count = number(count, "the number of shards").map_err(fail)?;
        return Shard::new(index, count).map_err(fail);
    }
    if spec == "auto" {
        let Some(count) = env(SLURM_COUNT) else {
            let hint = if env(KUBERNETES_INDEX).is_some() {
                format!(
                    "{KUBERNETES_INDEX} gives the index only; give the count, \
                     e.g. --shard N with N the Job's completions"
                )
            } else {
                format!(
                    "{SLURM_COUNT} is not set (not a Slurm job array); give --shard I/N, \
                     or --shard N in a Kubernetes Indexed Job"
                )
            };
            return Err(fail(hint));
        };
        let count = env_number(SLURM_COUNT, &count).map_err(fail)?;
        let index = slurm_index(&env).map_err(fail)?;
        return Shard::new(index, count).map_err(fail);
    }
    let count = number(spec, "the number of shards")
        .map_err(|_| fail("expected I/N (e.g. 0/4), N or auto".to_string()))?;
    let index = if let Some(index) = env(KUBERNETES_INDEX) {
        env_number(KUBERNETES_INDEX, &index).map_err(fail)?
    } else if env(SLURM_INDEX).is_some() {
        if let Some(slurm) = env(SLURM_COUNT) {
            let slurm = env_number(SLURM_COUNT, &slurm).map_err(fail)?;
            if slurm != count {
                return Err(fail(format!(
                    "the Slurm job array has {slurm} tasks ({SLURM_COUNT}), not {count}"
                )));
            }
        }
        slurm_index(&env).map_err(fail)?
    } else {
        return Err(fail(format!(
            "the shard's index is taken from {KUBERNETES_INDEX} (a Kubernetes Indexed Job) \
             or {SLURM_INDEX} (a Slurm job array), and neither is set; give it as \
             --shard I/{count}"
        )));
    };
    Shard::new(index, count).map_err(fail)
}

fn number(text: &str, what: &str) -> Result<u32, String> {
    let text = text.trim();
    text.parse::<u32>()
        .map_err(|_| format!("{what} {text:?} is not a whole number"))
}

fn env_number(name: &str, value: &str) -> Result<u32, String> {
    value
        .trim()
        .parse::<u32>()
        .map_err(|_| format!("{name} is {value:?}, not a whole number"))
}

/// The task's place in a Slurm job array, from 0: arrays may start at 1
/// (`--array=1-4`) or step (`--array=0-6:2`).
fn slurm_index(env: &impl Fn(&str) -> Option<String>) -> Result<u32, String> {
    let read = |name: &str| env(name).map(|value| env_number(name, &value)).transpose();
    let id = read(SLURM_INDEX)?.ok_or_else(|| format!("{SLURM_INDEX} is not set"))?;
    let min = read(SLURM_MIN)?.unwrap_or(0);
    let step = read(SLURM_STEP)?.unwrap_or(1).max(1);
    let offset = id
        .checked_sub(min)
        .ok_or_else(|| format!("{SLURM_INDEX} {id} is below {SLURM_MIN} {min}"))?;
    if offset % step != 0 {
        return Err(format!(
            "{SLURM_INDEX} {id} is not on the array's steps ({SLURM_MIN} {min}, {SLURM_STEP} {step})"
        ));
    }
    Ok(offset / step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn of_splits_claiming_one_directory_at_once_one_count_wins() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        // Eight claimants of four splits, two shards of each, all at once.
        let results: Vec<(u32, Result<(), String>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8u32)
                .map(|i| {
                    let shard = Shard::new(i % 2, 2 + i / 2).unwrap();
                    let out = &out;
                    scope.spawn(move || (shard.count, shard.claim(out)))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let won: BTreeSet<u32> = results
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(c, _)| *c)
            .collect();
        assert_eq!(won.len(), 1, "{results:?}");
        let kept = *won.first().unwrap();
        for (count, result) in &results {
            if *count != kept {
                let message = result.as_ref().unwrap_err();
                assert!(
                    message.contains(&format!("into {kept} shards")),
                    "{message}"
                );
            }
        }
        let marker = Shard::state_dir(&out).join("split");
        assert_eq!(
            std::fs::read_to_string(marker).unwrap().trim(),
            kept.to_string()
        );
        let left: Vec<_> = std::fs::read_dir(Shard::state_dir(&out)).unwrap().collect();
        assert_eq!(left.len(), 1, "no drafts left behind");
    }

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_string())
        }
    }

    #[test]
    fn membership_is_the_sha256_of_the_id_and_does_not_change() {
        // SHA-256("a") begins ca978112: 3398926610.
        assert_eq!(Shard::of("a", 4), 3_398_926_610 % 4);
        assert_eq!(Shard::of("a", 7), 3_398_926_610 % 7);
        // SHA-256("") begins e3b0c442.
        assert_eq!(Shard::of("", 1000), 0xe3b0_c442 % 1000);
        assert_eq!(Shard::of("anything", 1), 0);
    }

    #[test]
    fn documents_spread_over_the_shards() {
        let mut counts = [0u32; 4];
        for i in 0..4000 {
            counts[Shard::of(&format!("docs/page-{i}.md"), 4) as usize] += 1;
        }
        for count in counts {
            assert!((850..=1150).contains(&count), "{counts:?}");
        }
    }

    #[test]
    fn a_shard_is_given_as_index_and_count() {
        let none = env(&[]);
        assert_eq!(parse("1/4", &none), Ok(Shard { index: 1, count: 4 }));
        assert_eq!(parse(" 0/1 ", &none), Ok(Shard { index: 0, count: 1 }));
        for (spec, expected) in [
            ("4/4", "shard 4 is out of range for 4 shards (0 to 3)"),
            ("0/0", "between 1 and 65536, not 0"),
            ("0/65537", "between 1 and 65536"),
            ("-1/4", "\"-1\" is not a whole number"),
            ("a/4", "the shard index \"a\""),
            ("1/", "the number of shards \"\""),
            ("99999999999/4", "not a whole number"),
            ("x", "expected I/N (e.g. 0/4), N or auto"),
            ("", "expected I/N"),
        ] {
            let error = parse(spec, &none).unwrap_err();
            assert!(error.contains(expected), "{spec}: {error}");
            assert!(error.starts_with("--shard"), "{error}");
        }
    }

    #[test]
    fn the_index_comes_from_kubernetes_or_slurm() {
        let k8s = [("JOB_COMPLETION_INDEX", "3")];
        assert_eq!(parse("4", env(&k8s)), Ok(Shard { index: 3, count: 4 }));
        let error = parse("3", env(&k8s)).unwrap_err();
        assert!(error.contains("out of range"), "{error}");
        let error = parse("auto", env(&k8s)).unwrap_err();
        assert!(error.contains("gives the index only"), "{error}");
        let bad = [("JOB_COMPLETION_INDEX", "three")];
        let error = parse("4", env(&bad)).unwrap_err();
        assert!(
            error.contains("JOB_COMPLETION_INDEX is \"three\""),
            "{error}"
        );

        // --array=1-4: ids 1 to 4, from 0 here.
        let slurm = [
            ("SLURM_ARRAY_TASK_ID", "4"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ];
        assert_eq!(parse("auto", env(&slurm)), Ok(Shard { index: 3, count: 4 }));
        assert_eq!(parse("4", env(&slurm)), Ok(Shard { index: 3, count: 4 }));
        let error = parse("8", env(&slurm)).unwrap_err();
        assert!(error.contains("has 4 tasks"), "{error}");
        // --array=0-6:2: ids 0, 2, 4, 6.
        let stepped = [
            ("SLURM_ARRAY_TASK_ID", "4"),
            ("SLURM_ARRAY_TASK_MIN", "0"),
            ("SLURM_ARRAY_TASK_STEP", "2"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ];
        assert_eq!(
            parse("auto", env(&stepped)),
            Ok(Shard { index: 2, count: 4 })
        );
        let off = [
            ("SLURM_ARRAY_TASK_ID", "3"),
            ("SLURM_ARRAY_TASK_STEP", "2"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
        ];
        assert!(parse("auto", env(&off)).unwrap_err().contains("steps"));
        // --array=1,3,9: sparse, the id is past the count.
        let sparse = [
            ("SLURM_ARRAY_TASK_ID", "9"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_COUNT", "3"),
        ];
        assert!(parse("auto", env(&sparse))
            .unwrap_err()
            .contains("out of range"));

        let error = parse("4", env(&[])).unwrap_err();
        assert!(error.contains("neither is set"), "{error}");
        assert!(error.contains("--shard I/4"), "{error}");
        let error = parse("auto", env(&[])).unwrap_err();
        assert!(error.contains("not a Slurm job array"), "{error}");
    }

    #[test]
    fn a_shards_file_is_named_by_index_and_count() {
        let shard = Shard::new(1, 4).unwrap();
        assert_eq!(shard.file_name(), "part-00001-of-00004.parquet");
        assert_eq!(Shard::from_file_name(&shard.file_name()), Some(shard));
        for name in [
            "part-00004-of-00004.parquet",
            "part-1-of-4.parquet",
            "part-00001-of-00004.parquet.tmp-12",
            ".part-00001-of-00004.parquet",
            "docs.parquet",
        ] {
            assert_eq!(Shard::from_file_name(name), None, "{name}");
        }
        assert_eq!(
            Shard::state_dir(Path::new("out/docs")),
            Path::new("out/docs.embedjob")
        );
    }

    #[test]
    fn files_of_another_split_are_found() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "part-00000-of-00004.parquet",
            "part-00001-of-00002.parquet",
            "notes.txt",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let shard = Shard::new(2, 4).unwrap();
        assert_eq!(
            shard.foreign_files(dir.path()).unwrap(),
            [dir.path().join("part-00001-of-00002.parquet")]
        );
        assert!(shard
            .foreign_files(&dir.path().join("missing"))
            .unwrap()
            .is_empty());
        let error = Shard::count_in(dir.path()).unwrap_err();
        assert!(
            error.contains("different numbers of shards (2 and 4)"),
            "{error}"
        );
        std::fs::remove_file(dir.path().join("part-00001-of-00002.parquet")).unwrap();
        assert_eq!(Shard::count_in(dir.path()), Ok(Some(4)));
        std::fs::remove_file(dir.path().join("part-00000-of-00004.parquet")).unwrap();
        assert_eq!(Shard::count_in(dir.path()), Ok(None));
    }

    proptest! {
        #[test]
        fn every_document_is_in_exactly_one_shard(id in ".{0,40}", count in 1u32..=64) {
            let holders = (0..count)
                .filter(|&i| Shard { index: i, count }.holds(&id))
                .count();
            prop_assert_eq!(holders, 1);
        }

        #[test]
        fn any_spec_is_read_or_refused_without_panic(spec in ".{0,24}") {
            let _ = parse(&spec, |_| Some("7".to_string()));
            let _ = parse(&spec, |_| None);
        }
    }
}
