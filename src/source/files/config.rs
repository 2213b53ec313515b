//! `kind = "files"`: its parameters, their checks, and how it opens.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::FilesSource;
use crate::job::{KindTable, SourceParams};
use crate::source::{params_of, Source, SourceError, SourceKind};

/// `kind = "files"`: text files found by globs, directories or names.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct FilesParams {
    /// Globs, directories or files.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Globs a file's id (its path below the directory or glob root that
    /// found it) must match; empty: every file.
    #[serde(default)]
    pub include: Vec<String>,
    /// Globs of files to leave out, matched like `include`.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// What to do with a file found by a directory or glob that is not
    /// UTF-8 text. A file named on its own is always an error.
    #[serde(default)]
    pub on_invalid: OnInvalid,
}

/// `source.on_invalid`: files that are not UTF-8 text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnInvalid {
    /// Pass them over, counted and named in the summary.
    #[default]
    Skip,
    /// Stop the job with an error naming the file.
    Error,
}

pub struct Kind;

impl crate::job::Kind<dyn SourceParams> for Kind {
    fn name(&self) -> &'static str {
        "files"
    }

    fn keys(&self) -> &'static [&'static str] {
        &["paths", "include", "exclude", "on_invalid"]
    }

    fn parse(&self, table: &mut KindTable<'_>) -> Option<Box<dyn SourceParams>> {
        let params: FilesParams = table.deserialize()?;
        Some(Box::new(params))
    }
}

impl SourceKind for Kind {
    fn open(&self, params: &dyn SourceParams) -> Result<Box<dyn Source>, SourceError> {
        Ok(Box::new(FilesSource::open(params_of(params)?)?))
    }
}

impl SourceParams for FilesParams {
    fn kind(&self) -> &'static str {
        "files"
    }

    fn clone_box(&self) -> Box<dyn SourceParams> {
        Box::new(self.clone())
    }

    fn resolve_paths(&mut self, base: &Path) {
        for pattern in &mut self.paths {
            *pattern = crate::job::paths::pattern_relative_to(base, pattern);
        }
    }

    fn problems(&self, p: &mut Vec<String>) {
        if self.paths.is_empty() {
            p.push(
                "`source.paths` must list at least one glob or directory for kind \"files\""
                    .to_string(),
            );
        }
        for (key, patterns) in [("include", &self.include), ("exclude", &self.exclude)] {
            for pattern in patterns {
                // As the files source compiles them.
                let compiled = globset::GlobBuilder::new(pattern)
                    .backslash_escape(false)
                    .build();
                if let Err(e) = compiled {
                    p.push(format!(
                        "`source.{key}`: {pattern:?} is not a valid glob: {}",
                        e.kind()
                    ));
                }
            }
        }
    }

    fn describe(&self) -> String {
        self.paths.join(", ")
    }
}
