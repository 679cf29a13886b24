//! API keys: who may use the model routes.
//!
//! Keys come from `--api-key` (repeatable, or `DSPARK_API_KEY`) and `--api-key-file` (one key
//! per line; blank lines and `#` comments ignored), so that keys can be rotated by adding the
//! new one before removing the old. Only their sha256 digests are kept, and a presented key is
//! compared with every digest in time that does not depend on where they differ (no early
//! exit), so response times say nothing about a key. The scheme is matched as HTTP says,
//! without regard to case (`Bearer`, `bearer`).

use std::path::Path;

use anyhow::Context;
use sha2::{Digest, Sha256};

/// The accepted keys, as digests.
#[derive(Clone, Debug, Default)]
pub struct ApiKeys {
    digests: Vec<[u8; 32]>,
}

/// What an `Authorization` header amounts to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No key is required, or the key is one of them.
    Allowed,
    /// A key is required and none was sent (or not as `Bearer`).
    Missing,
    /// The key sent is not one of them.
    Wrong,
}

impl ApiKeys {
    /// The keys given on the command line and in `file`. Empty keys are ignored.
    pub fn new(keys: &[String], file: Option<&Path>) -> anyhow::Result<Self> {
        let mut all: Vec<String> = keys.to_vec();
        if let Some(file) = file {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read the API key file {}", file.display()))?;
            all.extend(
                text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_string),
            );
        }
        let digests = all.iter().map(|k| k.trim()).filter(|k| !k.is_empty()).map(digest).collect();
        Ok(Self { digests })
    }

    /// Whether any key is required.
    pub fn required(&self) -> bool {
        !self.digests.is_empty()
    }

    /// How many keys are accepted.
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Whether no key is configured.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// Judges an `Authorization` header value.
    pub fn check(&self, authorization: Option<&str>) -> Verdict {
        if !self.required() {
            return Verdict::Allowed;
        }
        let Some((scheme, key)) = authorization.map(str::trim).and_then(|v| v.split_once(char::is_whitespace)) else {
            return Verdict::Missing;
        };
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Verdict::Missing;
        }
        let given = digest(key.trim());
        // Every digest is compared, each without an early exit.
        let matched = self.digests.iter().fold(false, |found, d| found | same(d, &given));
        if matched { Verdict::Allowed } else { Verdict::Wrong }
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Equality of two digests in time independent of where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_from_flags_and_a_file_any_case_of_bearer() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("keys");
        std::fs::write(&file, "# rotated monthly\nold-key\n\n  new-key  \n").unwrap();
        let keys = ApiKeys::new(&["flag-key".into(), "".into()], Some(&file)).unwrap();
        assert_eq!(keys.len(), 3);
        for header in ["Bearer flag-key", "bearer old-key", "BEARER  new-key ", "Bearer\tnew-key"] {
            assert_eq!(keys.check(Some(header)), Verdict::Allowed, "{header}");
        }
        assert_eq!(keys.check(Some("Bearer nope")), Verdict::Wrong);
        assert_eq!(keys.check(Some("Bearer")), Verdict::Missing);
        assert_eq!(keys.check(Some("Basic b2xkLWtleQ==")), Verdict::Missing);
        assert_eq!(keys.check(None), Verdict::Missing);
        assert_eq!(ApiKeys::new(&[], None).unwrap().check(None), Verdict::Allowed);
        let e = ApiKeys::new(&[], Some(&dir.path().join("absent"))).unwrap_err();
        assert!(format!("{e:#}").starts_with("cannot read the API key file"), "{e:#}");
    }
}
