//! `init`: writes a commented job file for a folder or a file of documents,
//! ready to run with the local model, and checked by the job parser before
//! it is left in place.
//!
//! For records (JSON Lines, CSV, Parquet) the text and id fields are
//! guessed from the field names and the first record; the other plain
//! fields are offered, commented out, as metadata columns.

use std::io::{BufRead, Write};
use std::path::{Component, Path, PathBuf};

use anyhow::Context;
use arrow::datatypes::DataType;
use serde_json::Value;

use super::Outcome;
use crate::cli::InitArgs;
use crate::exit::{Exit, Failure};
use crate::source::input;

/// Field names taken for the text, best first.
const TEXT_NAMES: &[&str] = &[
    "text",
    "content",
    "body",
    "document",
    "page_content",
    "passage",
    "chunk",
    "abstract",
    "description",
];
/// Field names taken for the id, best first.
const ID_NAMES: &[&str] = &["id", "_id", "doc_id", "document_id", "uuid", "key"];
/// Metadata fields offered at most.
const METADATA_OFFERED: usize = 8;

/// What a record field holds, as far as the first record tells.
#[derive(Debug, Clone, PartialEq)]
struct FieldGuess {
    name: String,
    /// A string: a candidate for the text (with its length) or the id.
    text_len: Option<usize>,
    /// An integer: a candidate for the id.
    integer: bool,
    /// A plain value a metadata column can carry.
    plain: bool,
}

/// The fields a job file names for records.
#[derive(Debug, Clone, PartialEq)]
struct Fields {
    text: String,
    id: Option<String>,
    metadata: Vec<String>,
}

pub fn init(args: &InitArgs) -> Outcome {
    let target = &args.path;
    let metadata = std::fs::metadata(target)
        .map_err(|e| Failure::usage(anyhow::anyhow!("{}: {e}", target.display())))?;
    let kind = if metadata.is_dir() {
        SourceKind::Files
    } else {
        kind_of(target)
    };
    let name = job_name(target);
    let job_path = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("{name}.toml")));
    if job_path.exists() && !args.force {
        return Err(Failure::usage(anyhow::anyhow!(
            "{} already exists; give --force to overwrite it, or -o to write elsewhere",
            job_path.display()
        )));
    }
    let cwd = std::env::current_dir()
        .context("cannot find the current directory")
        .map_err(Failure::failed)?;
    let job_dir = absolute(&cwd, job_path.parent().unwrap_or(Path::new("")));
    let source_path = relative_path(&job_dir, &absolute(&cwd, target));
    let fields = match kind {
        SourceKind::Files => None,
        SourceKind::Jsonl => Some(jsonl_fields(target)?),
        SourceKind::Csv => Some(csv_fields(target)?),
        SourceKind::Parquet => Some(parquet_fields(target)?),
    };
    let file_name = job_path.file_name().map_or_else(
        || format!("{name}.toml"),
        |n| n.to_string_lossy().into_owned(),
    );
    let text = job_text(&name, &file_name, kind, &source_path, fields.as_ref());
    write_checked(&job_path, &text)?;
    let output = relative_path(&cwd, &job_dir.join("out").join(format!("{name}.parquet")));
    let shown = job_path.display();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "wrote {shown}: {} with the local model into {}\nnext:\n  embedjob estimate {shown}\n  \
         embedjob run {shown}\n  embedjob inspect {}",
        match kind {
            SourceKind::Files => format!("the text files of {}", target.display()),
            other => format!("the {other} records of {}", target.display()),
        },
        output.display(),
        output.display()
    )
    .map_err(|e| Failure::failed(anyhow::Error::from(e).context("writing to stdout")))?;
    Ok(Exit::Success)
}

/// Writes the job file, then reads it back as `run` would; a file that does
/// not read back is removed.
fn write_checked(path: &Path, text: &str) -> Result<(), Failure> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create {}", dir.display()))
            .map_err(Failure::failed)?;
    }
    std::fs::write(path, text)
        .with_context(|| format!("cannot write {}", path.display()))
        .map_err(Failure::failed)?;
    if let Err(errors) = crate::kinds::load(path, &[]) {
        let _ = std::fs::remove_file(path);
        return Err(Failure::failed(anyhow::anyhow!(
            "the job file written does not read back: {errors}"
        )));
    }
    Ok(())
}

/// The source kind a job for the target reads with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SourceKind {
    Files,
    Jsonl,
    Csv,
    Parquet,
}

impl std::fmt::Display for SourceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SourceKind::Files => "files",
            SourceKind::Jsonl => "jsonl",
            SourceKind::Csv => "csv",
            SourceKind::Parquet => "parquet",
        })
    }
}

/// The kind of records a file holds, by its name (less `.gz` or `.zst`).
fn kind_of(path: &Path) -> SourceKind {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    let name = name
        .strip_suffix(".gz")
        .or_else(|| name.strip_suffix(".zst"))
        .unwrap_or(&name);
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("jsonl" | "ndjson") => SourceKind::Jsonl,
        Some("csv") => SourceKind::Csv,
        Some("parquet") => SourceKind::Parquet,
        _ => SourceKind::Files,
    }
}

/// A job name from the folder's or file's name: `data/pages.jsonl.gz` → `pages`.
fn job_name(path: &Path) -> String {
    let absolute = std::env::current_dir().map_or_else(|_| path.to_path_buf(), |d| d.join(path));
    let base = tidy(&absolute)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = base.split('.').next().unwrap_or_default();
    let name: String = stem
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    if name.trim_matches('-').is_empty() {
        "job".to_string()
    } else {
        name
    }
}

fn absolute(cwd: &Path, path: &Path) -> PathBuf {
    tidy(&cwd.join(path))
}

/// `.` dropped and `dir/..` taken out, lexically.
fn tidy(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other),
        }
    }
    out
}

/// `to` as seen from directory `from` (both absolute and tidy).
fn relative_path(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<Component> = from.components().collect();
    let to: Vec<Component> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    if common == 0 {
        return to.iter().collect();
    }
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for component in &to[common..] {
        out.push(component);
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    out
}

fn usage(path: &Path, message: impl std::fmt::Display) -> Failure {
    Failure::usage(anyhow::anyhow!("{}: {message}", path.display()))
}

/// The fields of the first JSON object in the file.
fn jsonl_fields(path: &Path) -> Result<Fields, Failure> {
    let reader = input::open(path).map_err(Failure::usage)?;
    for line in reader.lines() {
        let line = line.map_err(|e| usage(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let Ok(Value::Object(object)) = serde_json::from_str::<Value>(&line) else {
            return Err(usage(path, "the first line is not a JSON object"));
        };
        let guesses = object
            .iter()
            .map(|(name, value)| FieldGuess {
                name: name.clone(),
                text_len: value.as_str().map(str::len),
                integer: value.is_i64() || value.is_u64(),
                plain: !value.is_object() && !value.is_array() && !value.is_null(),
            })
            .collect::<Vec<_>>();
        return choose(path, &guesses);
    }
    Err(usage(path, "no records"))
}

/// The columns of the header row, sized by the first record.
fn csv_fields(path: &Path) -> Result<Fields, Failure> {
    let reader = input::open(path).map_err(Failure::usage)?;
    let mut csv = ::csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(reader);
    let headers = csv.headers().map_err(|e| usage(path, e))?.clone();
    let mut first = ::csv::StringRecord::new();
    let has_row = csv.read_record(&mut first).map_err(|e| usage(path, e))?;
    let guesses = headers
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let cell = if has_row { first.get(i) } else { None };
            FieldGuess {
                name: name.to_string(),
                text_len: Some(cell.map_or(0, str::len)),
                integer: cell.is_some_and(|c| c.parse::<i64>().is_ok()),
                plain: true,
            }
        })
        .collect::<Vec<_>>();
    choose(path, &guesses)
}

/// The columns of the file (or of the first file of a directory).
fn parquet_fields(path: &Path) -> Result<Fields, Failure> {
    let builder = crate::parquet_io::open_reader(path).map_err(Failure::usage)?;
    let guesses = builder
        .schema()
        .fields()
        .iter()
        .map(|field| {
            let data_type = field.data_type();
            let string = matches!(
                data_type,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            ) || matches!(data_type, DataType::Dictionary(_, v) if matches!(**v, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View));
            FieldGuess {
                name: field.name().clone(),
                text_len: string.then_some(0),
                integer: data_type.is_integer(),
                plain: string
                    || data_type.is_numeric()
                    || matches!(
                        data_type,
                        DataType::Boolean
                            | DataType::Date32
                            | DataType::Date64
                            | DataType::Timestamp(_, _)
                    ),
            }
        })
        .collect::<Vec<_>>();
    choose(path, &guesses)
}

/// The text field (by name, else the longest string), the id field (by
/// name) and the plain fields left, offered as metadata.
fn choose(path: &Path, guesses: &[FieldGuess]) -> Result<Fields, Failure> {
    let by_name = |names: &[&str], fits: &dyn Fn(&FieldGuess) -> bool| {
        names.iter().find_map(|wanted| {
            guesses
                .iter()
                .find(|g| g.name.eq_ignore_ascii_case(wanted) && fits(g))
                .map(|g| g.name.clone())
        })
    };
    let text = by_name(TEXT_NAMES, &|g| g.text_len.is_some())
        .or_else(|| {
            guesses
                .iter()
                .filter_map(|g| g.text_len.map(|len| (len, g)))
                .max_by_key(|(len, _)| *len)
                .map(|(_, g)| g.name.clone())
        })
        .ok_or_else(|| usage(path, "no field holds text"))?;
    let id = by_name(ID_NAMES, &|g| {
        g.name != text && (g.integer || g.text_len.is_some())
    });
    let mut metadata: Vec<String> = Vec::new();
    for name in guesses
        .iter()
        .filter(|g| g.plain && g.name != text && Some(&g.name) != id.as_ref())
        .filter(|g| !g.name.is_empty() && !g.name.contains('.'))
        .map(|g| g.name.clone())
    {
        if metadata.len() == METADATA_OFFERED {
            break;
        }
        // Names the output already has, or that clash with one offered
        // already (as `Lang` does with `lang`), are left out.
        let mut offered = metadata.clone();
        offered.push(name);
        let mut problems = Vec::new();
        crate::contract::metadata_problems(&offered, &mut problems);
        if problems.is_empty() {
            metadata = offered;
        }
    }
    Ok(Fields { text, id, metadata })
}

/// `text` as a TOML basic string.
fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

fn job_text(
    name: &str,
    file_name: &str,
    kind: SourceKind,
    source: &Path,
    fields: Option<&Fields>,
) -> String {
    let source_text = source.to_string_lossy();
    let mut out = format!(
        "# Written by `embedjob init`. Paths are taken from this file's directory, so the job\n\
         # runs the same from anywhere (cron included).\n\
         #   embedjob estimate {file_name}    what a run will send, before it sends anything\n\
         #   embedjob run {file_name}         embed; run it again to embed only what changed\n\
         #   embedjob inspect out/{name}.parquet\n\
         name = {}\n\n[source]\nkind = \"{kind}\"\n",
        toml_string(name)
    );
    match fields {
        None => {
            out.push_str(&format!(
                "paths = [{}]                  # globs, directories or files\n\
                 # include = [\"*.md\", \"*.txt\"]      # only files whose path below it matches\n\
                 # exclude = [\"drafts/**\"]\n\
                 # on_invalid = \"error\"             # default \"skip\": files that are not UTF-8 text\n\
                 #                                  # are passed over and named in the summary\n",
                toml_string(&source_text)
            ));
        }
        Some(fields) => {
            out.push_str(&format!(
                "path = {}        # \"-\" reads stdin (jsonl, csv); .gz and .zst are read as they are\n\
                 text_field = {}\n",
                toml_string(&source_text),
                toml_string(&fields.text)
            ));
            match &fields.id {
                Some(id) => out.push_str(&format!("id_field = {}\n", toml_string(id))),
                None => {
                    out.push_str("# id_field = \"id\"                # default: the row number\n")
                }
            }
            if !fields.metadata.is_empty() {
                let listed: Vec<String> = fields.metadata.iter().map(|f| toml_string(f)).collect();
                out.push_str(&format!(
                    "# Fields carried into the output as columns of their own, typed as in the input:\n\
                     # metadata_fields = [{}]\n",
                    listed.join(", ")
                ));
            }
        }
    }
    out.push_str(&format!(
        "\n[chunking]\n\
         # max_tokens = 254                 # default: what the model sees whole (254 tokens of\n\
         #                                  # text for the local model; up to 512 for a service)\n\
         # overlap_tokens = 25              # default: 50 per 512\n\n\
         [backend]\n\
         kind = \"local\"                     # the embedded all-MiniLM-L6-v2: 384 dimensions, no key\n\
         # threads = 2                      # default: every core\n\
         # For a model service instead of the local model:\n\
         # kind = \"api\"\n\
         # base_url = \"http://127.0.0.1:9000\"\n\
         # model = \"svc-embed-1\"\n\
         # api_key_env = \"EMBEDJOB_API_KEY\"  # the variable holding the key (never the key itself)\n\
         # concurrency = \"auto\"               # or a fixed number of requests in flight\n\n\
         [output]\n\
         path = {}\n\
         include_text = true\n",
        toml_string(&format!("out/{name}.parquet"))
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guess(name: &str, text_len: Option<usize>, integer: bool) -> FieldGuess {
        FieldGuess {
            name: name.into(),
            text_len,
            integer,
            plain: true,
        }
    }

    #[test]
    fn the_text_and_id_are_found_by_name_then_by_length() {
        let path = Path::new("x.jsonl");
        let fields = choose(
            path,
            &[
                guess("url", Some(20), false),
                guess("Body", Some(5), false),
                guess("id", None, true),
                guess("lang", Some(2), false),
            ],
        )
        .unwrap();
        assert_eq!(fields.text, "Body");
        assert_eq!(fields.id.as_deref(), Some("id"));
        assert_eq!(fields.metadata, ["url", "lang"]);
        let fields = choose(
            path,
            &[
                guess("title", Some(10), false),
                guess("abstr", Some(400), false),
            ],
        )
        .unwrap();
        assert_eq!(fields.text, "abstr");
        assert_eq!(fields.id, None);
        // A field named like an output column is not offered.
        let fields = choose(
            path,
            &[
                guess("text", Some(1), false),
                guess("source", Some(1), false),
            ],
        )
        .unwrap();
        assert!(fields.metadata.is_empty(), "{fields:?}");
        assert!(choose(path, &[guess("n", None, true)]).is_err());
    }

    /// `init` offered fields differing only in case from an output column
    /// or from each other, which the job it wrote then refused.
    #[test]
    fn regression_init_offered_metadata_fields_that_clash_but_for_case() {
        let fields = choose(
            Path::new("x.jsonl"),
            &[
                guess("body", Some(50), false),
                guess("Embedding", Some(1), false),
                guess("Lang", Some(2), false),
                guess("lang", Some(2), false),
                guess("Content_Hash", Some(2), false),
            ],
        )
        .unwrap();
        assert_eq!(fields.metadata, ["Lang"]);
    }

    #[test]
    fn paths_are_written_as_seen_from_the_job_file() {
        let from = Path::new("/srv/jobs");
        assert_eq!(
            relative_path(from, Path::new("/srv/data/x.jsonl")),
            Path::new("../data/x.jsonl")
        );
        assert_eq!(
            relative_path(from, Path::new("/srv/jobs/docs")),
            Path::new("docs")
        );
        assert_eq!(relative_path(from, Path::new("/srv/jobs")), Path::new("."));
        assert_eq!(job_name(Path::new("data/pages.jsonl.gz")), "pages");
        assert_eq!(job_name(Path::new("my docs/")), "my-docs");
        assert_eq!(kind_of(Path::new("a/b.CSV.zst")), SourceKind::Csv);
        assert_eq!(kind_of(Path::new("b.ndjson")), SourceKind::Jsonl);
        assert_eq!(kind_of(Path::new("notes.md")), SourceKind::Files);
    }
}
