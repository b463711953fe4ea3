//! Who may read what: bearer tokens, each granted a set of datasets.
//!
//! A server started with `--auth-tokens FILE` answers only requests that carry
//! `authorization: Bearer <token>` with a token of the file; each token reads the datasets
//! its line grants and no other. A dataset outside the grant is refused (`PermissionDenied`,
//! whether or not it exists, so a token cannot probe for names) and is never listed for it.
//! A server started without the file serves everyone everything (a trusted network).
//!
//! The file holds one token per line: the token, then the datasets it may read, separated by
//! spaces or commas, or `*` for all of them; `#` starts a comment:
//!
//! ```text
//! # team-a's training jobs
//! 3f9c0e…  images, clicks
//! # the platform's own tools
//! 81d2aa…  *
//! ```
//!
//! Tokens are kept only as SHA-256 digests and compared in constant time against every
//! entry; neither a token nor its digest is ever logged. A request is known in logs and
//! metrics by the token's line (`token@3`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use base64::Engine as _;
use subtle::ConstantTimeEq;

use crate::catalog::Dataset;
use crate::error::{Result, ServerError};

/// What one caller may read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// Every dataset (a server without tokens, or a `*` token).
    All,
    /// These datasets only.
    Datasets(BTreeSet<String>),
}

impl Grant {
    pub fn allows(&self, dataset: &str) -> bool {
        match self {
            Grant::All => true,
            Grant::Datasets(names) => names.contains(dataset),
        }
    }

    /// `PermissionDenied` unless `spelling`, as a query writes it, may name a granted dataset:
    /// the name itself, or one equal to it ignoring case (SQL folds `MyPets` to `mypets`).
    /// The dataset it resolves to is checked by [`Self::check`] once the catalog is known.
    pub fn check_spelling(&self, spelling: &str) -> Result<()> {
        match self {
            Grant::Datasets(names) if !names.iter().any(|n| n.eq_ignore_ascii_case(spelling)) => {
                self.check(spelling)
            }
            _ => Ok(()),
        }
    }

    /// `PermissionDenied` unless `dataset` is granted; said the same way whether or not the
    /// dataset exists.
    pub fn check(&self, dataset: &str) -> Result<()> {
        if self.allows(dataset) {
            Ok(())
        } else {
            Err(ServerError::PermissionDenied(format!(
                "this token may not read `{dataset}`"
            )))
        }
    }

    /// The datasets of `all` this grant may read.
    pub fn visible(&self, all: &BTreeMap<String, Arc<Dataset>>) -> BTreeMap<String, Arc<Dataset>> {
        match self {
            Grant::All => all.clone(),
            Grant::Datasets(names) => all
                .iter()
                .filter(|(name, _)| names.contains(*name))
                .map(|(name, d)| (name.clone(), Arc::clone(d)))
                .collect(),
        }
    }
}

/// A caller that passed authentication: what it may read and how logs name it.
#[derive(Debug, Clone)]
pub struct Caller {
    pub grant: Arc<Grant>,
    /// `token@LINE`, or `anonymous` on a server without tokens.
    pub principal: Arc<str>,
}

impl Caller {
    pub fn anonymous() -> Self {
        Self {
            grant: Arc::new(Grant::All),
            principal: Arc::from("anonymous"),
        }
    }
}

struct Entry {
    digest: [u8; 32],
    caller: Caller,
}

/// The tokens a server accepts, replaceable while it serves ([`Tokens::replace`]: a reload
/// on SIGHUP). Its `Debug` shows how many, never a token.
pub struct Tokens {
    entries: parking_lot::RwLock<Arc<Vec<Entry>>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens").field("count", &self.len()).finish()
    }
}

/// Why a tokens file was refused: the file, the line, never the token.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    #[error("reading {}: {cause}", path.display())]
    Read {
        path: std::path::PathBuf,
        cause: std::io::Error,
    },
    #[error("{}line {line}: {reason}", file_prefix(file))]
    Line {
        file: Option<std::path::PathBuf>,
        line: usize,
        reason: String,
    },
    #[error(
        "{}the file holds no token (a server with tokens must accept one)",
        file_prefix(file)
    )]
    Empty { file: Option<std::path::PathBuf> },
}

impl TokensError {
    fn line(line: usize, reason: String) -> Self {
        TokensError::Line {
            file: None,
            line,
            reason,
        }
    }

    /// The error as `path`'s.
    fn in_file(self, path: &std::path::Path) -> Self {
        match self {
            TokensError::Line { line, reason, .. } => TokensError::Line {
                file: Some(path.to_owned()),
                line,
                reason,
            },
            TokensError::Empty { .. } => TokensError::Empty {
                file: Some(path.to_owned()),
            },
            read => read,
        }
    }
}

/// `FILE: ` where the error is a file's.
fn file_prefix(file: &Option<std::path::PathBuf>) -> String {
    file.as_ref()
        .map(|p| format!("{}: ", p.display()))
        .unwrap_or_default()
}

/// The shortest token accepted: 16 characters (a guessable token is a configuration error).
pub const MIN_TOKEN_LEN: usize = 16;

fn digest(token: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

impl Tokens {
    /// Parses a tokens file (see the module docs). Errors name the line, never its token.
    pub fn parse(text: &str) -> Result<Self, TokensError> {
        let mut entries: Vec<Entry> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let content = line.split('#').next().unwrap_or("").trim();
            if content.is_empty() {
                continue;
            }
            let mut words = content
                .split(|c: char| c.is_whitespace() || c == ',')
                .filter(|w| !w.is_empty());
            let token = words.next().unwrap_or_default();
            if token.len() < MIN_TOKEN_LEN {
                return Err(TokensError::line(
                    line_no,
                    format!("a token has at least {MIN_TOKEN_LEN} characters"),
                ));
            }
            let names: Vec<&str> = words.collect();
            let grant = match names.as_slice() {
                [] => {
                    return Err(TokensError::line(
                        line_no,
                        "the token grants no dataset (name datasets, or `*` for all)".into(),
                    ));
                }
                ["*"] => Grant::All,
                names if names.contains(&"*") => {
                    return Err(TokensError::line(line_no, "`*` stands alone".into()));
                }
                names => {
                    if let Some(bad) = names.iter().find(|n| !crate::catalog::is_dataset_name(n)) {
                        return Err(TokensError::line(
                            line_no,
                            format!("`{bad}` is not a dataset name"),
                        ));
                    }
                    Grant::Datasets(names.iter().map(|n| (*n).to_owned()).collect())
                }
            };
            let digest = digest(token.as_bytes());
            if entries.iter().any(|e| bool::from(e.digest.ct_eq(&digest))) {
                return Err(TokensError::line(line_no, "the same token appears twice".into()));
            }
            entries.push(Entry {
                digest,
                caller: Caller {
                    grant: Arc::new(grant),
                    principal: Arc::from(format!("token@{line_no}")),
                },
            });
        }
        if entries.is_empty() {
            return Err(TokensError::Empty { file: None });
        }
        Ok(Self {
            entries: parking_lot::RwLock::new(Arc::new(entries)),
        })
    }

    /// The entries now (a reload swaps them whole: a request sees the old set or the new).
    fn entries(&self) -> Arc<Vec<Entry>> {
        Arc::clone(&self.entries.read())
    }

    /// Accepts `other`'s tokens from now on, in place of these: requests already
    /// authenticated keep their grant; the next ones are checked against the new set.
    pub fn replace(&self, other: Tokens) {
        let new = other.entries();
        *self.entries.write() = new;
    }

    /// Reads and parses a tokens file.
    pub fn load(path: &std::path::Path) -> Result<Self, TokensError> {
        let text = std::fs::read_to_string(path).map_err(|cause| TokensError::Read {
            path: path.to_owned(),
            cause,
        })?;
        Self::parse(&text).map_err(|e| e.in_file(path))
    }

    pub fn len(&self) -> usize {
        self.entries().len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries().is_empty()
    }

    /// The caller holding `token`, if any. Every entry is compared, in constant time: how
    /// long this takes says nothing about which entry (or how much of one) matched.
    pub fn caller(&self, token: &[u8]) -> Option<Caller> {
        let presented = digest(token);
        let mut found = None;
        for entry in self.entries().iter() {
            if bool::from(entry.digest.ct_eq(&presented)) {
                found = Some(entry.caller.clone());
            }
        }
        found
    }

    /// The caller a request's `authorization` header (its value, if it has one) names:
    /// `Bearer <token>`.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Caller> {
        let token = bearer(authorization)?.ok_or_else(|| {
            ServerError::Unauthenticated(
                "this server needs a token: send `authorization: Bearer <token>`".into(),
            )
        })?;
        self.caller(token.as_bytes())
            .ok_or_else(|| ServerError::Unauthenticated("the token is not valid for this server".into()))
    }

    /// Flight's `Handshake`: the caller of a `Basic` header (the password is the token;
    /// pyarrow's `authenticate_basic_token`), a `Bearer` header, or the request's payload.
    /// Returns the caller and its token, which the reply hands back for later calls.
    pub fn handshake(&self, authorization: Option<&str>, payload: &[u8]) -> Result<(Caller, String)> {
        let token = match basic_password(authorization)? {
            Some(password) => password,
            None => match bearer(authorization)? {
                Some(token) => token,
                None => String::from_utf8(payload.to_vec()).map_err(|_| {
                    ServerError::Unauthenticated("the handshake payload is not a token".into())
                })?,
            },
        };
        let caller = self
            .caller(token.as_bytes())
            .ok_or_else(|| ServerError::Unauthenticated("the token is not valid for this server".into()))?;
        Ok((caller, token))
    }
}

/// The token of an `authorization: Bearer <token>` header.
fn bearer(authorization: Option<&str>) -> Result<Option<String>> {
    let Some(value) = authorization else {
        return Ok(None);
    };
    match split_scheme(value, "bearer") {
        Some(token) => Ok(Some(token.to_owned())),
        None => Err(ServerError::Unauthenticated(
            "the authorization header must be `Bearer <token>`".into(),
        )),
    }
}

/// The password of an `authorization: Basic base64(user:password)` header.
fn basic_password(authorization: Option<&str>) -> Result<Option<String>> {
    let Some(value) = authorization else {
        return Ok(None);
    };
    let Some(encoded) = split_scheme(value, "basic") else {
        return Ok(None);
    };
    let bad = || ServerError::Unauthenticated("malformed Basic credentials".into());
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| bad())?;
    let text = String::from_utf8(decoded).map_err(|_| bad())?;
    let (_user, password) = text.split_once(':').ok_or_else(bad)?;
    Ok(Some(password.to_owned()))
}

/// `value`'s credentials when its scheme is `scheme` (case-insensitive).
fn split_scheme<'a>(value: &'a str, scheme: &str) -> Option<&'a str> {
    let (given, rest) = value.trim().split_once(' ')?;
    given.eq_ignore_ascii_case(scheme).then(|| rest.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaa-team-a";
    const ALL: &str = "zzzzzzzzzzzzzzzz-platform";

    fn tokens() -> Tokens {
        Tokens::parse(&format!(
            "# comment\n{A}  images, clicks\n\n{ALL} *  # everything\n"
        ))
        .expect("parse")
    }

    #[test]
    fn tokens_grant_their_datasets() {
        let t = tokens();
        assert_eq!(t.len(), 2);
        let a = t.authenticate(Some(&format!("Bearer {A}"))).expect("a");
        assert_eq!(&*a.principal, "token@2");
        assert!(a.grant.allows("images") && a.grant.allows("clicks"));
        assert!(!a.grant.allows("text"));
        assert!(matches!(
            a.grant.check("text"),
            Err(ServerError::PermissionDenied(_))
        ));
        let all = t.authenticate(Some(&format!("bearer   {ALL}"))).expect("all");
        assert_eq!(*all.grant, Grant::All);
    }

    #[test]
    fn replaced_tokens_take_effect_for_the_next_request() {
        let t = tokens();
        let before = t.authenticate(Some(&format!("Bearer {A}"))).expect("a");
        t.replace(Tokens::parse(&format!("{ALL} images\n")).expect("parse"));
        assert_eq!(t.len(), 1);
        assert!(
            t.authenticate(Some(&format!("Bearer {A}"))).is_err(),
            "A is revoked"
        );
        let all = t.authenticate(Some(&format!("Bearer {ALL}"))).expect("all");
        assert!(
            all.grant.allows("images") && !all.grant.allows("clicks"),
            "the new grant"
        );
        assert!(
            before.grant.allows("clicks"),
            "an authenticated caller keeps its grant"
        );
    }

    #[test]
    fn missing_wrong_and_malformed_credentials_are_unauthenticated() {
        let t = tokens();
        let token_a = format!("Token {A}");
        for header in [
            None,
            Some("Bearer aaaaaaaaaaaaaaaa-team-b"),
            Some(token_a.as_str()),
            Some("Bearer"),
        ] {
            let err = t.authenticate(header).expect_err("refused");
            assert!(matches!(err, ServerError::Unauthenticated(_)), "{err}");
            assert!(!err.to_string().contains(A), "never echoes a token: {err}");
        }
    }

    #[test]
    fn handshake_takes_basic_bearer_or_payload() {
        let t = tokens();
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("anyone:{A}"));
        let (c, token) = t.handshake(Some(&format!("Basic {basic}")), b"").expect("basic");
        assert_eq!((&*c.principal, token.as_str()), ("token@2", A));
        let (c, _) = t.handshake(None, ALL.as_bytes()).expect("payload");
        assert_eq!(&*c.principal, "token@4");
        assert!(t.handshake(Some("Basic !!!"), b"").is_err());
        assert!(t.handshake(None, b"nope").is_err());
    }

    #[test]
    fn bad_files_name_the_line_and_never_the_token() {
        for (text, expected) in [
            ("short images", "line 1: a token has at least 16"),
            ("aaaaaaaaaaaaaaaaaaaa", "line 1: the token grants no dataset"),
            ("\naaaaaaaaaaaaaaaaaaaa images *", "line 2: `*` stands alone"),
            (
                "aaaaaaaaaaaaaaaaaaaa ../etc",
                "line 1: `../etc` is not a dataset name",
            ),
            (
                "aaaaaaaaaaaaaaaaaaaa a\naaaaaaaaaaaaaaaaaaaa b",
                "line 2: the same token",
            ),
            ("# nothing\n", "holds no token"),
        ] {
            let err = Tokens::parse(text).expect_err(text).to_string();
            assert!(err.contains(expected), "{text:?}: {err}");
            assert!(!err.contains("aaaaaaaaaaaaaaaa"), "{err}");
        }
        assert_eq!(format!("{:?}", tokens()), "Tokens { count: 2 }");
    }
}
