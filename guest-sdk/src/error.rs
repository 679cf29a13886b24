//! Errors as values: what a plugin answers when a source, options or a call cannot be served
//! ([`ConstraintError`] with its [`ErrorCode`]), the parts it only approximates ([`Warning`]),
//! and the checks every plugin makes of its kind and options.

use std::fmt;

/// Why a call failed; mirrors the contract's `error-code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The kind is not one this plugin serves.
    InvalidKind,
    /// The constraint source does not parse or is not valid for the kind.
    InvalidSource,
    /// The options string is not valid.
    InvalidOptions,
    /// The source is valid but uses something this plugin cannot enforce.
    Unsupported,
    /// The source or its compiled form exceeds a size limit.
    TooLarge,
    /// A committed token is not allowed in the current state.
    RejectedToken,
    /// The call does not make sense in the current state.
    InvalidState,
    /// A plugin bug, reported as a value instead of a trap.
    Internal,
}

/// An error value returned to the host: never a trap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConstraintError {
    /// What kind of failure.
    pub code: ErrorCode,
    /// A message for the user, saying what is wrong and, where possible, what to do.
    pub message: String,
    /// A JSON pointer, `line:column` or byte offset into the source, where known.
    pub location: Option<String>,
}

impl ConstraintError {
    /// An error with a code and message and no location.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), location: None }
    }

    /// Adds the location in the source the error applies to.
    pub fn at(mut self, location: impl Into<String>) -> Self {
        self.location = Some(location.into());
        self
    }
}

impl fmt::Display for ConstraintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.code, self.message)?;
        if let Some(loc) = &self.location {
            write!(f, " (at {loc})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConstraintError {}

/// An error's message followed by its causes (`outer: cause: root cause`). Library errors
/// often say only what failed at the top ("error building NFA") and why further down.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text
}

/// Checks that `kind` is one of the kinds a plugin serves, with the error every plugin gives.
pub fn check_kind(kind: &str, served: &[&str]) -> Result<(), ConstraintError> {
    if served.contains(&kind) {
        return Ok(());
    }
    let list: Vec<String> = served.iter().map(|k| format!("`{k}`")).collect();
    Err(ConstraintError::new(
        ErrorCode::InvalidKind,
        format!("unknown kind `{kind}`; this plugin serves {}", list.join(", ")),
    ))
}

/// Checks the options of a plugin that defines none: empty, or an empty JSON object.
pub fn no_options(options: &str) -> Result<(), ConstraintError> {
    let compact: String = options.chars().filter(|c| !c.is_whitespace()).collect();
    if compact.is_empty() || compact == "{}" {
        return Ok(());
    }
    Err(ConstraintError::new(ErrorCode::InvalidOptions, format!("this plugin takes no options; got {options}")))
}

/// A part of the source that the compiled constraint can only approximate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    /// A JSON pointer, `line:column` or byte offset into the source.
    pub location: String,
    /// What is approximated and how.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_kind_names_the_served_kinds() {
        assert!(check_kind("a", &["a", "b"]).is_ok());
        let e = check_kind("c", &["a", "b"]).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidKind);
        assert_eq!(e.message, "unknown kind `c`; this plugin serves `a`, `b`");
    }

    #[test]
    fn no_options_accepts_only_nothing() {
        assert!(no_options("").is_ok() && no_options(" { } ").is_ok());
        let e = no_options(r#"{"x": 1}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidOptions);
        assert_eq!(e.message, r#"this plugin takes no options; got {"x": 1}"#);
    }
}
