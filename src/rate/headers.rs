//! The headers a service paces its clients by: `x-ratelimit-*` with every
//! response (OpenAI and many compatible services: what is left of each quota
//! and when it is full again), and `Retry-After` / `retry-after-ms` with a
//! refusal.

use std::time::{Duration, SystemTime};

use reqwest::header::HeaderMap;

/// The longest delay a server may ask for; a longer `Retry-After` is taken
/// as this. It is also the most the retry policy waits on a server's word.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(120);

/// The longest reset taken as it is; a longer one (or a number too large
/// for a `Duration`) is read as this.
pub(super) const MAX_RESET: Duration = Duration::from_secs(24 * 3600);

/// One quota as a response describes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QuotaHeader {
    /// `x-ratelimit-limit-*`: the allowance per minute.
    pub limit: f64,
    /// `x-ratelimit-remaining-*`: what is left now.
    pub remaining: f64,
    /// `x-ratelimit-reset-*`: the time until the quota is whole again.
    pub reset: Option<Duration>,
}

/// The request and token quotas a response describes; either may be absent.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RateLimitHeaders {
    pub requests: Option<QuotaHeader>,
    pub tokens: Option<QuotaHeader>,
}

impl RateLimitHeaders {
    /// Reads the headers; `None` when neither quota is described. A header
    /// that is not a number or a duration is left out, never an error.
    pub fn parse(headers: &HeaderMap) -> Option<RateLimitHeaders> {
        let found = RateLimitHeaders {
            requests: quota(headers, "requests"),
            tokens: quota(headers, "tokens"),
        };
        (found.requests.is_some() || found.tokens.is_some()).then_some(found)
    }

    /// Whether the headers say a request of `tokens` fits now, with room to
    /// spare (twice its tokens, for a count that differs from the
    /// service's): on a 429, they contradict the refusal.
    pub fn covers(&self, tokens: f64) -> bool {
        self.requests.is_none_or(|q| q.remaining >= 1.0)
            && self
                .tokens
                .is_none_or(|q| q.remaining >= 2.0 * tokens.max(1.0))
    }
}

fn quota(headers: &HeaderMap, name: &str) -> Option<QuotaHeader> {
    let header = |what: &str| {
        headers
            .get(format!("x-ratelimit-{what}-{name}"))
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    let number = |what: &str| {
        header(what)
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|n| n.is_finite() && *n >= 0.0)
    };
    let limit = number("limit").filter(|&n| n > 0.0)?;
    let remaining = number("remaining")?.min(limit);
    Some(QuotaHeader {
        limit,
        remaining,
        reset: header("reset").and_then(parse_reset),
    })
}

/// A reset as services write it: a Go-style duration (`6m0s`, `1m30.5s`,
/// `1.5s`, `120ms`, `250us`) or a bare number of seconds. Capped at a day.
pub fn parse_reset(text: &str) -> Option<Duration> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if let Ok(seconds) = text.parse::<f64>() {
        return capped(seconds);
    }
    let mut total = 0.0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * scale;
    }
    capped(total)
}

fn capped(seconds: f64) -> Option<Duration> {
    if !(seconds.is_finite() && seconds >= 0.0) {
        return None;
    }
    Some(Duration::try_from_secs_f64(seconds).map_or(MAX_RESET, |d| d.min(MAX_RESET)))
}

/// The delay the server asked for: `retry-after-ms`, else `Retry-After` in
/// seconds (fractions allowed) or as an HTTP date; at most [`MAX_RETRY_AFTER`].
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.parse::<f64>().ok()) {
        if let Some(delay) = capped_seconds(ms / 1000.0) {
            return Some(delay);
        }
    }
    let value = header("retry-after")?;
    if let Ok(seconds) = value.parse::<f64>() {
        return capped_seconds(seconds);
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(
        when.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    )
}

/// A server's delay in seconds, capped; `None` for a negative or non-number.
fn capped_seconds(seconds: f64) -> Option<Duration> {
    if !(seconds.is_finite() && seconds >= 0.0) {
        return None;
    }
    Some(Duration::from_secs_f64(
        seconds.min(MAX_RETRY_AFTER.as_secs_f64()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn resets_are_read_as_services_write_them() {
        let ms = Duration::from_millis;
        assert_eq!(parse_reset("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(parse_reset("1m30.5s"), Some(ms(90_500)));
        assert_eq!(parse_reset("1.5s"), Some(ms(1500)));
        assert_eq!(parse_reset("120ms"), Some(ms(120)));
        assert_eq!(parse_reset("1h0m0s"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_reset("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_reset("0s"), Some(Duration::ZERO));
        assert_eq!(parse_reset("1e300"), Some(MAX_RESET));
        assert_eq!(parse_reset("99999999999999999999h"), Some(MAX_RESET));
        for bad in ["", "soon", "5x", "-1s", "ms", "1..2s", "NaN"] {
            assert_eq!(parse_reset(bad), None, "{bad}");
        }
    }

    #[test]
    fn headers_describe_each_quota_or_nothing() {
        let mut headers = HeaderMap::new();
        assert_eq!(RateLimitHeaders::parse(&headers), None);
        for (name, value) in [
            ("x-ratelimit-limit-tokens", "1000000"),
            ("x-ratelimit-remaining-tokens", "999000"),
            ("x-ratelimit-reset-tokens", "60ms"),
            ("x-ratelimit-limit-requests", "not a number"),
            ("x-ratelimit-remaining-requests", "3"),
        ] {
            headers.insert(name, HeaderValue::from_static(value));
        }
        let parsed = RateLimitHeaders::parse(&headers).unwrap();
        assert_eq!(parsed.requests, None, "a limit that is not a number");
        assert_eq!(
            parsed.tokens,
            Some(QuotaHeader {
                limit: 1e6,
                remaining: 999_000.0,
                reset: Some(Duration::from_millis(60)),
            })
        );
    }

    #[test]
    fn headers_cover_a_request_only_with_room_in_every_quota_they_describe() {
        let quota = |limit: f64, remaining: f64| QuotaHeader {
            limit,
            remaining,
            reset: None,
        };
        let both = |requests: f64, tokens: f64| RateLimitHeaders {
            requests: Some(quota(100.0, requests)),
            tokens: Some(quota(10_000.0, tokens)),
        };
        assert!(both(100.0, 10_000.0).covers(500.0), "a whole quota");
        assert!(!both(0.0, 10_000.0).covers(500.0), "no request left");
        assert!(
            !both(100.0, 900.0).covers(500.0),
            "less than twice the tokens"
        );
        let tokens_only = RateLimitHeaders {
            requests: None,
            tokens: Some(quota(10_000.0, 1000.0)),
        };
        assert!(tokens_only.covers(500.0));
    }

    #[test]
    fn retry_after_seconds_date_and_ms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            retry_after(&headers(&[("retry-after", "7")]), now),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            retry_after(&headers(&[("retry-after", "1.5")]), now),
            Some(Duration::from_millis(1500))
        );
        let date = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            retry_after(&headers(&[("retry-after", &date)]), now),
            Some(Duration::from_secs(30))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(
            retry_after(&headers(&[("retry-after", &past)]), now),
            Some(Duration::ZERO)
        );
        assert_eq!(
            retry_after(
                &headers(&[("retry-after", "9"), ("retry-after-ms", "250")]),
                now
            ),
            Some(Duration::from_millis(250)),
            "retry-after-ms is the more precise of the two"
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "soon")]), now), None);
        for huge in [
            ("retry-after", "99999999999"),
            ("retry-after", "1e300"),
            ("retry-after-ms", "99999999999"),
            ("retry-after-ms", "1e300"),
        ] {
            assert_eq!(
                retry_after(&headers(&[huge]), now),
                Some(MAX_RETRY_AFTER),
                "{huge:?}"
            );
        }
        let far = httpdate::fmt_http_date(now + Duration::from_secs(100_000_000));
        assert_eq!(
            retry_after(&headers(&[("retry-after", &far)]), now),
            Some(MAX_RETRY_AFTER)
        );
        assert_eq!(retry_after(&headers(&[("retry-after", "-3")]), now), None);
        assert_eq!(retry_after(&HeaderMap::new(), now), None);
    }
}
