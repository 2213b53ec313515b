//! A directory of a split job's files (`run --shard`) is one dataset when
//! every shard is there, once, and all were split the same way.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::{Check, Dataset, FileReport, Problem};
use crate::job::Shard;

/// Shards named per problem; the rest are counted.
const NAMED: usize = 10;

/// The problems of each dataset whose files are shards: a shard missing or
/// in two files, files split another way, or a file of the whole job among
/// them.
pub(super) fn problems(datasets: &[Dataset], reports: &[FileReport]) -> Vec<Problem> {
    // A file whose metadata could not be read is taken for the shard its
    // name says (its own problems are reported with it), not for a file of
    // the whole job.
    let shard_of: BTreeMap<&PathBuf, Option<Shard>> = reports
        .iter()
        .map(|r| {
            let unread = r.problems.iter().any(|p| p.check == Check::Readable);
            let named = || {
                r.path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .and_then(Shard::from_file_name)
            };
            (&r.path, r.shard.or_else(|| unread.then(named).flatten()))
        })
        .collect();
    let mut problems = Vec::new();
    for dataset in datasets {
        let files: Vec<(&PathBuf, Option<Shard>)> = dataset
            .files
            .iter()
            .map(|f| (f, shard_of.get(f).copied().flatten()))
            .collect();
        if files.iter().all(|(_, shard)| shard.is_none()) {
            continue;
        }
        let mut report = |message: String| {
            problems.push(Problem {
                check: Check::Shards,
                row: None,
                id: None,
                message,
            });
        };
        let whole: Vec<String> = files
            .iter()
            .filter(|(_, shard)| shard.is_none())
            .map(|(f, _)| name(f))
            .collect();
        if !whole.is_empty() {
            report(format!(
                "{} of the whole job sit among the shards' files, and hold their documents \
                 again: {}",
                if whole.len() == 1 { "a file" } else { "files" },
                whole.join(", ")
            ));
        }
        let mut by_count: BTreeMap<u32, BTreeMap<u32, Vec<String>>> = BTreeMap::new();
        for (file, shard) in &files {
            if let Some(shard) = shard {
                by_count
                    .entry(shard.count)
                    .or_default()
                    .entry(shard.index)
                    .or_default()
                    .push(name(file));
            }
        }
        if by_count.len() > 1 {
            let ways: Vec<String> = by_count
                .iter()
                .map(|(count, shards)| {
                    let files: Vec<String> = shards.values().flatten().cloned().collect();
                    format!("into {count} ({})", listed(&files))
                })
                .collect();
            report(format!(
                "the files were split different ways, so documents may be in two of them: {}; \
                 keep the files of one split only",
                ways.join("; ")
            ));
            continue;
        }
        let Some((&count, shards)) = by_count.iter().next() else {
            continue;
        };
        if let Some(problem) = different_inputs(&files, reports) {
            report(problem);
        }
        for (index, files) in shards.iter().filter(|(_, files)| files.len() > 1) {
            report(format!(
                "shard {index}/{count} is in more than one file: {}",
                files.join(", ")
            ));
        }
        let missing: Vec<String> = (0..count)
            .filter(|i| !shards.contains_key(i))
            .map(|index| Shard { index, count }.file_name())
            .collect();
        if !missing.is_empty() {
            report(format!(
                "{} of {count} shards {} missing: {}; run them (embedjob run JOB --shard I/{count})",
                missing.len(),
                if missing.len() == 1 { "is" } else { "are" },
                listed(&missing)
            ));
        }
    }
    problems
}

/// Shards that read different inputs (`embedjob.input`): a document renamed
/// between their runs moved to another shard, and the one that held it may
/// not have run since. Files that do not record their input are not compared.
fn different_inputs(files: &[(&PathBuf, Option<Shard>)], reports: &[FileReport]) -> Option<String> {
    let input_of: BTreeMap<&PathBuf, &String> = reports
        .iter()
        .filter_map(|r| r.input.as_ref().map(|i| (&r.path, i)))
        .collect();
    let mut by_input: BTreeMap<&String, Vec<String>> = BTreeMap::new();
    for (file, _) in files.iter().filter(|(_, shard)| shard.is_some()) {
        if let Some(input) = input_of.get(file) {
            by_input.entry(input).or_default().push(name(file));
        }
    }
    let inputs: Vec<String> = by_input
        .iter()
        .map(|(input, files)| format!("{input} ({})", listed(files)))
        .collect();
    (inputs.len() > 1).then(|| {
        format!(
            "the shards read different inputs, so a document renamed or removed between \
             their runs may be held twice or still be held, and one added may be missing: \
             {}; run every shard again on the same input",
            inputs.join("; ")
        )
    })
}

fn name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// The first [`NAMED`] names, and how many more.
fn listed(names: &[String]) -> String {
    crate::display::listed(&names[..names.len().min(NAMED)], names.len() as u64)
}
