//! The human form of a report, and the line that ends a failed inspection.

use std::fmt::Write as _;

use super::{FileReport, Report};
use crate::display::counted;

/// The human form of a report.
pub fn text(report: &Report) -> String {
    let mut out = String::new();
    for file in &report.files {
        file_text(&mut out, file);
    }
    for p in &report.problems {
        let _ = writeln!(out, "{}: {}", p.check.name(), p.message);
    }
    if report.files.len() > 1 {
        let t = &report.totals;
        let _ = write!(
            out,
            "total: {}, {}, {} prompt tokens, {}",
            counted(t.files, "file"),
            counted(t.rows, "row"),
            t.prompt_tokens,
            counted(t.requests, "request")
        );
        if let Some(cost) = t.cost {
            let _ = write!(out, ", cost {cost:.6}");
        }
        let _ = writeln!(out, "; {}", verdict(t.problem_count));
    }
    out
}

fn verdict(problems: u64) -> String {
    match problems {
        0 => "all checks passed".to_string(),
        n => counted(n, "problem"),
    }
}

fn file_text(out: &mut String, f: &FileReport) {
    let unknown = || "?".to_string();
    let _ = writeln!(out, "{}", f.path.display());
    if f.schema_version.is_none() && f.model.is_none() && f.row_groups == 0 {
        // Nothing could be read: the problems say why.
        let _ = writeln!(out, "  bytes       {}", f.bytes);
        problems_text(out, f);
        return;
    }
    let _ = writeln!(
        out,
        "  rows        {} ({}, {} bytes)",
        f.rows,
        counted(f.row_groups, "row group"),
        f.bytes
    );
    if let Some(job) = &f.job {
        match f.shard {
            Some(shard) => writeln!(out, "  job         {job}, shard {shard}"),
            None => writeln!(out, "  job         {job}"),
        }
        .ok();
    }
    let _ = writeln!(
        out,
        "  model       {} ({} backend), {} dimensions",
        f.model.clone().unwrap_or_else(unknown),
        f.backend.clone().unwrap_or_else(unknown),
        f.dimensions.map_or_else(unknown, |d| d.to_string())
    );
    let _ = writeln!(
        out,
        "  schema      version {}, text {}, written by embedjob {}",
        f.schema_version.clone().unwrap_or_else(unknown),
        if f.include_text {
            "included"
        } else {
            "not included"
        },
        f.written_by.clone().unwrap_or_else(unknown)
    );
    if !f.metadata_columns.is_empty() {
        let _ = writeln!(out, "  metadata    {}", f.metadata_columns.join(", "));
    }
    let number = |n: Option<u64>| n.map_or_else(unknown, |n| n.to_string());
    if f.backend.as_deref() == Some("local") {
        let _ = writeln!(
            out,
            "  usage       {} tokens, {} (the local model bills nothing)",
            number(f.prompt_tokens),
            f.requests
                .map_or_else(|| "? requests".to_string(), |n| counted(n, "request"))
        );
    } else {
        let _ = writeln!(
            out,
            "  usage       {} prompt tokens, {} total, {}",
            number(f.prompt_tokens),
            number(f.total_tokens),
            f.requests
                .map_or_else(|| "? requests".to_string(), |n| counted(n, "request"))
        );
        match (f.cost, f.batch_input_per_1k) {
            (Some(cost), Some(price)) => {
                let _ = writeln!(
                    out,
                    "  cost        {cost:.6} (batch mode, {price} per 1k tokens)"
                );
            }
            (Some(cost), None) => {
                let _ = writeln!(out, "  cost        {cost:.6}");
            }
            _ => {}
        }
    }
    problems_text(out, f);
}

fn problems_text(out: &mut String, f: &FileReport) {
    let _ = writeln!(out, "  checks      {}", verdict(f.problem_count));
    for p in &f.problems {
        let mut place = String::new();
        if let Some(row) = p.row {
            let _ = write!(place, "row {row}");
        }
        if let Some(id) = &p.id {
            let _ = write!(
                place,
                "{}id {id:?}",
                if place.is_empty() { "" } else { ", " }
            );
        }
        if !place.is_empty() {
            place = format!(" ({place})");
        }
        let _ = writeln!(out, "    - {}{place}: {}", p.check.name(), p.message);
    }
    let listed = f.problems.len() as u64;
    if f.problem_count > listed {
        let _ = writeln!(out, "    … and {} more", f.problem_count - listed);
    }
}

/// One line naming the first problem, for the error that ends a failed inspection.
pub fn first_problem(report: &Report) -> Option<String> {
    if let Some(p) = report.problems.first() {
        return Some(format!("{}: {}", p.check.name(), p.message));
    }
    report.files.iter().find_map(|f| {
        f.problems.first().map(|p| {
            let file = f.path.display().to_string();
            // Messages about reading the file already start with its name.
            let message = p
                .message
                .strip_prefix(&format!("{file}: "))
                .unwrap_or(&p.message);
            match p.row {
                Some(row) => format!("{file} row {row}: {}: {message}", p.check.name()),
                None => format!("{file}: {}: {message}", p.check.name()),
            }
        })
    })
}
