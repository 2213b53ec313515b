//! How numbers read on the screen: a count with its noun in the right
//! number, and a duration people read at a glance.

/// `1 chunk`, `2 chunks`: `n` with `one` or `many`.
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `n` with `noun`, made plural with an `s`.
pub fn counted(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// `a, b, c and 7 more`: the names `shown` of `total`.
pub fn listed(shown: &[String], total: u64) -> String {
    let more = total.saturating_sub(shown.len() as u64);
    let mut text = shown.join(", ");
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

/// A duration for people: `4.2s`, `3m 05s`, `2h 10m`.
pub fn duration(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "?".to_string();
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let whole = seconds.ceil() as u64;
    match whole {
        0..=59 => format!("{seconds:.1}s"),
        60..=3599 => format!("{}m {:02}s", whole / 60, whole % 60),
        _ => format!("{}h {:02}m", whole / 3600, (whole % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_is_singular_and_the_rest_plural() {
        assert_eq!(counted(1, "chunk"), "1 chunk");
        assert_eq!(counted(0, "chunk"), "0 chunks");
        assert_eq!(counted(2, "document"), "2 documents");
        assert_eq!(count(1, "retry", "retries"), "1 retry");
        assert_eq!(count(3, "retry", "retries"), "3 retries");
    }

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(duration(4.21), "4.2s");
        assert_eq!(duration(185.0), "3m 05s");
        assert_eq!(duration(7_800.0), "2h 10m");
        assert_eq!(duration(f64::INFINITY), "?");
    }
}
