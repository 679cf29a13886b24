//! Errors of the plugin runtime: what the plugin said (a value), and what the host saw (a
//! trap, an invalid answer, a quarantine).

use std::fmt;

use super::health::TrapCause;

/// The contract's error codes, host side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// The kind is not one the plugin serves.
    InvalidKind,
    /// The constraint source does not parse or is invalid for the kind.
    InvalidSource,
    /// The options are invalid.
    InvalidOptions,
    /// The source uses something the plugin cannot enforce.
    Unsupported,
    /// The source or its compiled form is too large.
    TooLarge,
    /// A committed token is not allowed.
    RejectedToken,
    /// The call does not fit the matcher's state.
    InvalidState,
    /// A plugin bug reported as a value.
    Internal,
}

impl ErrorCode {
    /// The code as the contract spells it (`invalid-source`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidKind => "invalid-kind",
            ErrorCode::InvalidSource => "invalid-source",
            ErrorCode::InvalidOptions => "invalid-options",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::TooLarge => "too-large",
            ErrorCode::RejectedToken => "rejected-token",
            ErrorCode::InvalidState => "invalid-state",
            ErrorCode::Internal => "internal",
        }
    }

    /// Whether the error is the request's fault (a 400 for an HTTP client) rather than the
    /// plugin's.
    pub fn is_user_error(self) -> bool {
        !matches!(self, ErrorCode::Internal)
    }
}

/// An error value a plugin returned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConstraintError {
    /// What kind of failure.
    pub code: ErrorCode,
    /// The plugin's message.
    pub message: String,
    /// Where in the source, if known.
    pub location: Option<String>,
}

impl fmt::Display for ConstraintError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code.as_str(), self.message)?;
        if let Some(loc) = &self.location {
            write!(f, " (at {loc})")?;
        }
        Ok(())
    }
}

/// Why a plugin call did not produce a usable answer.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The plugin answered with an error value (usually the request's fault).
    #[error("plugin `{plugin}` refused: {error}")]
    Constraint {
        /// The plugin's name.
        plugin: String,
        /// What it said.
        error: ConstraintError,
    },
    /// The plugin trapped: deadline, memory, panic, stack overflow. Its instance restarts.
    #[error("plugin `{plugin}` failed in `{call}`: {message}")]
    Trap {
        /// The plugin's name.
        plugin: String,
        /// The contract function that was running.
        call: &'static str,
        /// What happened, for the user and the log.
        message: String,
        /// What stopped it: an exhausted resource (the input's cost) or a fault.
        cause: TrapCause,
    },
    /// The constraint exhausted the plugin's resources a short while ago and is refused
    /// without entering the plugin.
    #[error(
        "plugin `{plugin}` refuses this constraint for another {} s: it {reason}",
        left.as_secs().max(1)
    )]
    Refused {
        /// The plugin's name.
        plugin: String,
        /// What the constraint did (`exceeded its time limit of ...`).
        reason: String,
        /// How much longer it is refused.
        left: std::time::Duration,
    },
    /// The plugin answered something the contract forbids (wrong mask length, unknown token
    /// id, a forced span over the cap).
    #[error("plugin `{plugin}` returned an invalid answer from `{call}`: {message}")]
    InvalidOutput {
        /// The plugin's name.
        plugin: String,
        /// The contract function.
        call: &'static str,
        /// What was wrong.
        message: String,
    },
    /// The plugin kept failing and is quarantined until its file changes or an operator lifts
    /// the quarantine.
    #[error(
        "plugin `{plugin}` is quarantined after failing under {strikes} different constraints; fix or replace it \
         in the plugin directory, or lift the quarantine with `dspark plugins unquarantine {plugin}`"
    )]
    Quarantined {
        /// The plugin's name.
        plugin: String,
        /// Strikes counted.
        strikes: u32,
    },
    /// The handle was made by an instance that has since restarted after a trap.
    #[error("plugin `{plugin}`: this {what} belonged to an instance that restarted after a failure; compile again")]
    Stale {
        /// The plugin's name.
        plugin: String,
        /// `matcher` or `compiled constraint`.
        what: &'static str,
    },
    /// The host could not set the plugin up (instantiate, link, init).
    #[error("plugin `{plugin}`: {message}")]
    Setup {
        /// The plugin's name.
        plugin: String,
        /// What failed.
        message: String,
    },
}

impl PluginError {
    /// Whether the error is the request's fault rather than the plugin's or the host's: an
    /// error value the plugin returned for it, or a constraint that exhausted the plugin's
    /// resources (now or a short while ago).
    pub fn is_user_error(&self) -> bool {
        match self {
            PluginError::Constraint { error, .. } => error.code.is_user_error(),
            PluginError::Trap { cause, .. } => cause.is_resource(),
            PluginError::Refused { .. } => true,
            _ => false,
        }
    }
}
