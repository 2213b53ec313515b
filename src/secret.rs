//! Keeping the secrets the process holds out of everything it writes: the
//! API key, the database password read from the environment, and any
//! credential found inside a URL it was given (which is then refused).
//!
//! A server may echo a secret it was sent, and not always as sent: URL-encoded,
//! JSON-escaped, in base64 (alone or as `Bearer <key>`), in hex, or cut off by
//! a length limit. A [`Scrubber`] finds the key in any of these forms, and any
//! piece of 8 or more characters of one, and replaces it with `[REDACTED]`.
//! Percent-escapes (`%2F`, `%2f`) and JSON escapes (`\/`, `\u002F`) are
//! decoded before matching, so any mixture of escaped and plain characters is
//! found too.
//!
//! The keys the process holds are registered once ([`register`]); every
//! place that writes text for people or files ([`scrub`]) runs it through all
//! of them.

use std::borrow::Cow;
use std::collections::HashSet;
use std::sync::{PoisonError, RwLock};

use base64::Engine as _;

/// A piece of the key this long, or longer, is scrubbed wherever it appears.
pub const MIN_FRAGMENT: usize = 8;

const REDACTED: &str = "[REDACTED]";

/// Finds one secret in every form a server could echo it.
#[derive(Clone)]
pub struct Scrubber {
    /// Every window of [`MIN_FRAGMENT`] bytes of every form of the secret.
    windows: HashSet<Vec<u8>>,
    /// A secret shorter than [`MIN_FRAGMENT`], matched whole. Its encoded
    /// forms that are as short are not matched: the hex or base64 of a
    /// character or two is in any text.
    whole: Option<Vec<u8>>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scrubber")
            .field("windows", &self.windows.len())
            .finish_non_exhaustive()
    }
}

impl Scrubber {
    /// A scrubber for `secret`; `None` for an empty one.
    pub fn new(secret: &str) -> Option<Scrubber> {
        let secret = secret.trim();
        if secret.is_empty() {
            return None;
        }
        let mut windows = HashSet::new();
        for form in forms(secret) {
            for window in form.as_bytes().windows(MIN_FRAGMENT) {
                windows.insert(window.to_vec());
            }
        }
        let whole = (secret.len() < MIN_FRAGMENT).then(|| secret.as_bytes().to_vec());
        Some(Scrubber { windows, whole })
    }

    /// `text` with every form of the secret, and every piece of one at least
    /// [`MIN_FRAGMENT`] characters long, replaced by `[REDACTED]`.
    pub fn scrub<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut covered = Vec::new();
        self.mark(text.as_bytes(), None, &mut covered);
        let decoded = Decoded::of(text);
        if decoded.changed {
            self.mark(&decoded.bytes, Some(&decoded.spans), &mut covered);
        }
        if covered.is_empty() {
            return Cow::Borrowed(text);
        }
        covered.sort_unstable();
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        let mut iter = covered.into_iter().peekable();
        while let Some((start, mut end)) = iter.next() {
            while let Some(&(next_start, next_end)) = iter.peek() {
                if next_start > end {
                    break;
                }
                end = end.max(next_end);
                iter.next();
            }
            let (start, end) = (floor_char(text, start.max(at)), ceil_char(text, end));
            if start >= end {
                continue;
            }
            out.push_str(&text[at..start]);
            out.push_str(REDACTED);
            at = end;
        }
        out.push_str(&text[at..]);
        Cow::Owned(out)
    }

    /// Adds to `covered` the spans of `text` (of the original, through
    /// `spans` when `bytes` is a decoded view) that hold a window of the secret.
    fn mark(
        &self,
        bytes: &[u8],
        spans: Option<&[(usize, usize)]>,
        covered: &mut Vec<(usize, usize)>,
    ) {
        for start in 0..bytes.len() {
            let width = if self.windows.contains(bytes_at(bytes, start, MIN_FRAGMENT)) {
                MIN_FRAGMENT
            } else {
                match &self.whole {
                    Some(whole)
                        if bytes_at(bytes, start, whole.len()) == whole.as_slice()
                            && stands_alone(bytes, start, whole.len()) =>
                    {
                        whole.len()
                    }
                    _ => continue,
                }
            };
            let end = start + width;
            let span = match spans {
                Some(spans) => (spans[start].0, spans[end - 1].1),
                None => (start, end),
            };
            match covered.last_mut() {
                Some(last) if span.0 <= last.1 && span.0 >= last.0 => last.1 = last.1.max(span.1),
                _ => covered.push(span),
            }
        }
    }
}

/// Whether the `len` bytes of `bytes` at `start` stand apart from the
/// letters and digits around them. A short secret is scrubbed only so: a
/// dummy key such as `1` or `x`, as servers that take any key are given,
/// is in `cl100k_base` and `max_tokens` by chance, and scrubbed there it
/// garbled every text.
fn stands_alone(bytes: &[u8], start: usize, len: usize) -> bool {
    let word = |byte: Option<&u8>| byte.is_some_and(u8::is_ascii_alphanumeric);
    !word(start.checked_sub(1).and_then(|before| bytes.get(before)))
        && !word(bytes.get(start + len))
}

/// The `len` bytes of `bytes` from `start`, or fewer at its end.
fn bytes_at(bytes: &[u8], start: usize, len: usize) -> &[u8] {
    &bytes[start..bytes.len().min(start + len)]
}

/// The forms a server could echo the secret in. Percent- and JSON-escaped
/// forms need no entry: they are matched after decoding.
fn forms(secret: &str) -> Vec<String> {
    let mut forms = vec![secret.to_string()];
    let bearer = format!("Bearer {secret}");
    let engines = [
        &base64::engine::general_purpose::STANDARD,
        &base64::engine::general_purpose::URL_SAFE,
    ];
    for engine in engines {
        forms.push(engine.encode(&bearer));
        // Inside a longer encoded text the secret can start at any of the
        // three positions of a base64 group: keep the characters that depend
        // on the secret alone.
        for offset in 0..3usize {
            let mut bytes = vec![b'\0'; offset];
            bytes.extend_from_slice(secret.as_bytes());
            let encoded = engine.encode(&bytes);
            let first = (8 * offset).div_ceil(6);
            let last = (8 * bytes.len()) / 6;
            if first < last && last <= encoded.len() {
                forms.push(encoded[first..last].to_string());
            }
        }
    }
    for text in [secret, bearer.as_str()] {
        let lower = hex::encode(text);
        forms.push(lower.to_ascii_uppercase());
        forms.push(lower);
    }
    forms
}

/// `text` with percent-escapes and JSON escapes decoded, each decoded byte
/// remembering the span of `text` it came from.
struct Decoded {
    bytes: Vec<u8>,
    spans: Vec<(usize, usize)>,
    changed: bool,
}

impl Decoded {
    fn of(text: &str) -> Decoded {
        let raw = text.as_bytes();
        let mut decoded = Decoded {
            bytes: Vec::with_capacity(raw.len()),
            spans: Vec::with_capacity(raw.len()),
            changed: false,
        };
        let mut at = 0;
        while at < raw.len() {
            let (bytes, used) = escape_at(raw, at);
            if used > 1 {
                decoded.changed = true;
            }
            for byte in bytes.as_slice() {
                decoded.bytes.push(*byte);
                decoded.spans.push((at, at + used));
            }
            at += used;
        }
        decoded
    }
}

/// The bytes an escape at `at` stands for and its length in `raw`; a plain
/// byte stands for itself.
fn escape_at(raw: &[u8], at: usize) -> (SmallBytes, usize) {
    let hex = |from: usize, len: usize| -> Option<u32> {
        let digits = raw.get(from..from + len)?;
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
        let text = std::str::from_utf8(digits).ok()?;
        u32::from_str_radix(text, 16).ok()
    };
    match raw[at] {
        b'%' => {
            if let Some(value) = hex(at + 1, 2) {
                return (SmallBytes::one(value as u8), 3);
            }
        }
        b'\\' => {
            // A run of backslashes is one escape: text escaped twice (a JSON
            // string printed with its escapes escaped) is decoded too.
            let slashes = raw[at..].iter().take_while(|&&b| b == b'\\').count();
            let next = at + slashes;
            match raw.get(next) {
                Some(b'u') => {
                    if let Some(c) = hex(next + 1, 4).and_then(char::from_u32) {
                        return (SmallBytes::char(c), slashes + 5);
                    }
                }
                Some(&c @ (b'/' | b'"' | b'\'')) => return (SmallBytes::one(c), slashes + 1),
                _ => {}
            }
        }
        _ => {}
    }
    (SmallBytes::one(raw[at]), 1)
}

/// Up to four bytes, the UTF-8 of one character at most.
struct SmallBytes {
    bytes: [u8; 4],
    len: usize,
}

impl SmallBytes {
    fn one(byte: u8) -> Self {
        SmallBytes {
            bytes: [byte, 0, 0, 0],
            len: 1,
        }
    }

    fn char(c: char) -> Self {
        let mut bytes = [0; 4];
        let len = c.encode_utf8(&mut bytes).len();
        SmallBytes { bytes, len }
    }

    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The last character boundary of `text` at or before byte `at` (at most its length).
pub(crate) fn floor_char(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

/// The first character boundary of `text` at or after byte `at` (at most its length).
pub(crate) fn ceil_char(text: &str, mut at: usize) -> usize {
    at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

static REGISTERED: RwLock<Vec<Scrubber>> = RwLock::new(Vec::new());

/// Makes [`scrub`] remove `secret` from everything it is given from now on.
pub fn register(secret: &str) {
    let Some(scrubber) = Scrubber::new(secret) else {
        return;
    };
    let mut registered = REGISTERED.write().unwrap_or_else(PoisonError::into_inner);
    if !registered
        .iter()
        .any(|s| s.windows == scrubber.windows && s.whole == scrubber.whole)
    {
        registered.push(scrubber);
    }
}

/// `text` without any registered secret, in any form.
pub fn scrub(text: &str) -> Cow<'_, str> {
    let registered = REGISTERED.read().unwrap_or_else(PoisonError::into_inner);
    let mut text = Cow::Borrowed(text);
    for scrubber in registered.iter() {
        if let Cow::Owned(clean) = scrubber.scrub(&text) {
            text = Cow::Owned(clean);
        }
    }
    text
}

/// `value` with every registered secret scrubbed from its strings (see
/// [`scrub`]); its numbers, names and shape as they are. Scrubbed as text, a
/// short secret (a dummy key `1`) was taken out of the numbers, and the
/// summary was no JSON: the run failed after its vectors were paid for.
#[must_use]
pub fn scrub_json(value: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(text) => Value::String(scrub(text).into_owned()),
        Value::Array(items) => Value::Array(items.iter().map(scrub_json).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(name, item)| (name.clone(), scrub_json(item)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// The query parameters that carry a credential, as services name them
/// (compared without case, `-` taken as `_`).
const CREDENTIAL_PARAMETERS: &[&str] = &[
    "access_token",
    "api_key",
    "apikey",
    "auth",
    "auth_token",
    "authorization",
    "client_secret",
    "code",
    "key",
    "pass",
    "passwd",
    "password",
    "pwd",
    "secret",
    "session",
    "sig",
    "signature",
    "subscription_key",
    "token",
    "x_api_key",
];

/// The credentials a URL carries, found without parsing it (so that a URL
/// too broken to parse is covered too). Holds the values only to register
/// them; a message names [`UrlCredentials::places`], never the values.
#[derive(Default)]
pub struct UrlCredentials {
    user: Option<String>,
    password: Option<String>,
    /// `(name, value)` of each credential query parameter.
    parameters: Vec<(String, String)>,
}

impl std::fmt::Debug for UrlCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.places())
    }
}

impl UrlCredentials {
    /// Reads the user name, the password and the credential query
    /// parameters of `url`, percent-decoded.
    pub fn of(url: &str) -> UrlCredentials {
        let url = url.trim();
        let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
        let (before_fragment, _) = after_scheme.split_once('#').unwrap_or((after_scheme, ""));
        let (authority_and_path, query) = before_fragment
            .split_once('?')
            .unwrap_or((before_fragment, ""));
        let authority = authority_and_path
            .split(['/', '\\'])
            .next()
            .unwrap_or_default();
        let mut found = UrlCredentials::default();
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            let (user, password) = match userinfo.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (userinfo, None),
            };
            found.user = Some(percent_decoded(user)).filter(|u| !u.is_empty());
            found.password = password.map(percent_decoded).filter(|p| !p.is_empty());
        }
        for pair in query.split(['&', ';']) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = percent_decoded(name).to_ascii_lowercase().replace('-', "_");
            if CREDENTIAL_PARAMETERS.contains(&name.as_str()) {
                found.parameters.push((name, percent_decoded(value)));
            }
        }
        found
    }

    /// Whether the URL carries a password or a credential query parameter;
    /// with `user_is_secret`, a user name too (a key given as the user).
    pub fn any(&self, user_is_secret: bool) -> bool {
        (user_is_secret && self.user.is_some())
            || self.password.is_some()
            || !self.parameters.is_empty()
    }

    /// Registers every value found (see [`register`]); the user name only
    /// with `user_is_secret`.
    pub fn register(&self, user_is_secret: bool) {
        let user = self.user.as_deref().filter(|_| user_is_secret);
        for value in user
            .into_iter()
            .chain(self.password.as_deref())
            .chain(self.parameters.iter().map(|(_, v)| v.as_str()))
        {
            register(value);
        }
    }

    /// Where the credentials are, for a message: `the user name and
    /// password, the query parameter api_key`.
    pub fn places(&self) -> String {
        let mut places = Vec::new();
        match (&self.user, &self.password) {
            (Some(_), Some(_)) => places.push("the user name and password".to_string()),
            (Some(_), None) => places.push("the user name".to_string()),
            (None, Some(_)) => places.push("the password".to_string()),
            (None, None) => {}
        }
        for (name, _) in &self.parameters {
            places.push(format!("the query parameter {name}"));
        }
        places.join(", ")
    }
}

/// `text` with its percent-escapes decoded (`+` kept: it is a plus in a
/// URL's user info, and a secret holding one is registered in both forms
/// through the scrubber's decoding).
fn percent_decoded(text: &str) -> String {
    let raw = text.as_bytes();
    let mut out = Vec::with_capacity(raw.len());
    let mut at = 0;
    while at < raw.len() {
        if raw[at] == b'%' {
            if let Some(byte) = raw
                .get(at + 1..at + 3)
                .and_then(|d| std::str::from_utf8(d).ok())
                .and_then(|d| u8::from_str_radix(d, 16).ok())
            {
                out.push(byte);
                at += 3;
                continue;
            }
        }
        out.push(raw[at]);
        at += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `url` as a message may show it: the scheme, host and path, without the
/// user info, the query or the fragment.
pub fn shown_url(url: &str) -> String {
    let url = url.trim();
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    let cut = rest.find(['?', '#']).unwrap_or(rest.len());
    let (before, after) = rest.split_at(cut);
    let (authority, path) = before.split_at(before.find(['/', '\\']).unwrap_or(before.len()));
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let elided = if after.is_empty() { "" } else { "?…" };
    format!("{scheme}{host}{path}{elided}")
}

/// Cuts `text` to at most `max` characters, marking the cut with `…`.
pub fn truncate_chars(text: &mut String, max: usize) {
    if let Some((cut, _)) = text.char_indices().nth(max) {
        text.truncate(cut);
        text.push('…');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-live/Ab+Cd=ef_0123456789";

    fn clean(text: &str) -> String {
        Scrubber::new(KEY).unwrap().scrub(text).into_owned()
    }

    fn assert_scrubbed(echo: &str) {
        let text = format!("invalid key: {echo} (see the docs)");
        let out = clean(&text);
        assert!(out.contains(REDACTED), "{echo:?} was not found in {out:?}");
        assert!(out.starts_with("invalid key: "), "{out}");
        assert!(out.ends_with(" (see the docs)"), "{out}");
        for form in forms(KEY) {
            for window in form.as_bytes().windows(MIN_FRAGMENT) {
                let window = std::str::from_utf8(window).unwrap();
                assert!(
                    !out.contains(window),
                    "{window:?} of {form:?} left in {out:?}"
                );
            }
        }
    }

    #[test]
    fn every_encoding_is_scrubbed() {
        let percent_upper: String = KEY.bytes().map(|b| format!("%{b:02X}")).collect();
        let percent_lower: String = KEY.bytes().map(|b| format!("%{b:02x}")).collect();
        let json_u: String = KEY
            .chars()
            .map(|c| format!("\\u{:04x}", c as u32))
            .collect();
        let json_u_upper: String = KEY
            .chars()
            .map(|c| format!("\\u{:04X}", c as u32))
            .collect();
        let b64 = base64::engine::general_purpose::STANDARD;
        for echo in [
            KEY.to_string(),
            KEY.replace('/', "%2F")
                .replace('+', "%2B")
                .replace('=', "%3D"),
            KEY.replace('/', "%2f")
                .replace('+', "%2b")
                .replace('=', "%3d"),
            percent_upper,
            percent_lower,
            KEY.replace('/', "\\/"),
            KEY.replace('/', "\\\\/"),
            json_u.replace('\\', "\\\\"),
            json_u,
            json_u_upper,
            b64.encode(KEY),
            b64.encode(format!("Bearer {KEY}")),
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(KEY),
            b64.encode(format!("{{\"authorization\":\"Bearer {KEY}\"}}")),
            hex::encode(KEY),
            hex::encode(KEY).to_uppercase(),
            KEY[..10].to_string(),
            KEY[KEY.len() - 9..].to_string(),
        ] {
            assert_scrubbed(&echo);
        }
    }

    #[test]
    fn text_without_the_key_is_kept_as_it_is() {
        let text = "rate limited: try again in 3s; caf\u{e9} %ZZ \\u12 \\";
        assert!(matches!(
            Scrubber::new(KEY).unwrap().scrub(text),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            clean("sk-live"),
            "sk-live",
            "7 characters are not a piece of the key"
        );
        assert!(Scrubber::new("  ").is_none());
    }

    #[test]
    fn a_short_key_is_scrubbed_whole() {
        let scrubber = Scrubber::new("abc").unwrap();
        assert_eq!(scrubber.scrub("key abc refused"), "key [REDACTED] refused");
        assert_eq!(scrubber.scrub("key %61%62%63"), "key [REDACTED]");
        assert_eq!(scrubber.scrub("hex 616263 b64 YWJj"), "hex 616263 b64 YWJj");
    }

    /// A key of a character or two scrubbed every character of its encoded
    /// forms: with the key `x`, `{"chunks":133}` came out as
    /// `{"[REDACTED]unks":[REDACTED]33}`.
    #[test]
    fn regression_a_short_key_scrubbed_every_character_of_its_encodings() {
        let text = r#"{"chunks":133,"cost":0.02,"model":"svc-embed-1","job":"shape-one-line"}"#;
        for key in ["x", "7", "bench"] {
            assert_eq!(Scrubber::new(key).unwrap().scrub(text), text, "key {key:?}");
        }
    }

    /// A dummy key of a character, as servers that take any key are given:
    /// scrubbed where it stands alone, not out of the words and numbers it
    /// is part of.
    #[test]
    fn a_short_key_is_scrubbed_only_where_it_stands_alone() {
        let scrubber = Scrubber::new("1").unwrap();
        assert_eq!(
            scrubber.scrub("cl100k_base 1024 0.1 svc-embed-1 key=1"),
            "cl100k_base 1024 0.[REDACTED] svc-embed-[REDACTED] key=[REDACTED]"
        );
        let scrubber = Scrubber::new("abc").unwrap();
        assert_eq!(scrubber.scrub("abcd xabc abc."), "abcd xabc [REDACTED].");
    }

    /// Scrubbed as JSON, a summary's strings lose the key and its numbers
    /// and names stay: scrubbed as text, the dummy key `1` was taken out of
    /// `"chunks":1` and the summary was no JSON.
    #[test]
    fn regression_a_summary_scrubbed_as_text_was_no_json() {
        register("Zq9");
        let value = serde_json::json!({
            "chunks": 1,
            "Zq9": ["echo Zq9", 2.5, null],
            "error": {"message": "key Zq9 refused"},
        });
        assert_eq!(
            scrub_json(&value),
            serde_json::json!({
                "chunks": 1,
                "Zq9": ["echo [REDACTED]", 2.5, null],
                "error": {"message": "key [REDACTED] refused"},
            })
        );
    }

    #[test]
    fn a_key_inside_non_ascii_text_leaves_valid_text() {
        let out = clean(&format!("é{KEY}日本"));
        assert_eq!(out, "é[REDACTED]日本");
    }

    #[test]
    fn credentials_are_found_in_every_part_of_a_url() {
        let found = UrlCredentials::of("https://me:p%40ss-w0rd@host:1/v1?x=1&API-Key=k%2F1#f");
        assert_eq!(
            found.places(),
            "the user name and password, the query parameter api_key"
        );
        assert_eq!(found.password.as_deref(), Some("p@ss-w0rd"));
        assert_eq!(found.parameters[0].1, "k/1");
        assert!(found.any(false) && found.any(true));
        let user_only =
            UrlCredentials::of("postgresql://postgres@127.0.0.1:5432/db?sslmode=disable");
        assert!(!user_only.any(false) && user_only.any(true));
        assert!(!UrlCredentials::of("http://127.0.0.1:9/v1?model=x").any(true));
        // Too broken to parse, and still read.
        assert!(UrlCredentials::of("http://u:sk-1@host:port:x/?token=t").any(false));
    }

    #[test]
    fn a_shown_url_has_no_user_info_query_or_fragment() {
        assert_eq!(
            shown_url("https://me:pw@host:1/v1/?api_key=k#f"),
            "https://host:1/v1/?…"
        );
        assert_eq!(shown_url("http://127.0.0.1:9/v1"), "http://127.0.0.1:9/v1");
        assert_eq!(shown_url("sk-key@host"), "host");
    }

    #[test]
    fn registered_keys_are_scrubbed_everywhere() {
        register("sk-registered-7f3a9c");
        assert_eq!(scrub("echo sk-registered-7f3a9c"), "echo [REDACTED]");
    }
}
