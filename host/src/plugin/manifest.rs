//! `plugin.toml`: what a plugin says about itself, and what it asks of the host.

use std::path::Path;

use anyhow::{Context, bail};
use serde::Deserialize;

/// The WIT package versions this host has bindings for.
pub const SUPPORTED_WIT: &[&str] = &["dspark:constraint@0.1.0"];

/// A plugin's manifest, `plugins/<name>/plugin.toml`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The plugin's name: lowercase letters, digits, `-` and `_`; equal to its folder's name.
    pub name: String,
    /// The plugin's own version.
    pub version: String,
    /// The contract it implements, e.g. `dspark:constraint@0.1.0`.
    pub wit: String,
    /// The constraint kinds it serves; must equal what the component's `kinds` returns.
    pub kinds: Vec<String>,
    /// One line for `plugins list`.
    #[serde(default)]
    pub description: String,
    /// The sha256 of `plugin.wasm`, lowercase hex. The host refuses a component that differs.
    pub sha256: String,
    /// Resource limits the plugin asks for (clamped by the host's maxima).
    #[serde(default)]
    pub limits: Limits,
    /// WASI capabilities the plugin asks for; none by default.
    #[serde(default)]
    pub capabilities: Capabilities,
}

/// Resource limits a plugin asks for. Unset fields take the host's defaults; every field is
/// clamped to the host's maximum.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Linear memory per instance, MiB.
    pub memory_mib: Option<u64>,
    /// Deadline of one matcher call (mask, commit, ...), milliseconds of CPU time.
    pub mask_ms: Option<u64>,
    /// Deadline of one compile, milliseconds of CPU time.
    pub compile_ms: Option<u64>,
}

/// WASI capabilities. Everything not listed here (filesystem, network, environment,
/// arguments, stdin) is never granted. Randomness is not a capability: `wasi:random` is
/// available (it reaches nothing outside the sandbox), but a plugin that uses it must still
/// keep the state-key promise. Stdout and stderr go to a 4 KiB buffer the host reads only to
/// explain a trap (a panic message).
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    /// Real wall and monotonic clocks. Without it both clocks read zero.
    #[serde(default)]
    pub clock: bool,
}

impl Manifest {
    /// Reads and checks `path`.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let manifest: Manifest =
            toml::from_str(&text).with_context(|| format!("invalid manifest {}", path.display()))?;
        manifest.check()?;
        Ok(manifest)
    }

    /// Checks the fields' shapes (not the component).
    pub fn check(&self) -> anyhow::Result<()> {
        let valid_name = !self.name.is_empty()
            && self.name.len() <= 64
            && self.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !valid_name {
            bail!("plugin name `{}` must be 1-64 characters of a-z, 0-9, `-`, `_`", self.name);
        }
        if !SUPPORTED_WIT.contains(&self.wit.as_str()) {
            bail!("plugin `{}` targets `{}`; this host supports {}", self.name, self.wit, SUPPORTED_WIT.join(", "));
        }
        if self.kinds.is_empty() {
            bail!("plugin `{}` declares no kinds", self.name);
        }
        if self.sha256.len() != 64 || !self.sha256.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()) {
            bail!("plugin `{}`: sha256 must be 64 lowercase hex digits", self.name);
        }
        Ok(())
    }
}
