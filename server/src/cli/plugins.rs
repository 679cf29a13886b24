//! `dspark plugins list|validate|new|build`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Subcommand;
use dspark_host::plugin::registry::Registry;
use dspark_host::plugin::{LoadedPlugin, PluginRuntime};

use super::RuntimeArgs;
use super::authoring;

#[derive(Debug, Subcommand)]
pub enum PluginsCommand {
    /// List the plugins of a registry directory: name, version, kinds, status.
    List {
        #[command(flatten)]
        runtime: RuntimeArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Check one plugin folder (manifest, sha256, component, kinds) and initialise it with
    /// real vocabularies, reporting its memory against its limit; exit 0 if it loads.
    Validate {
        /// The plugin's folder (holding plugin.toml and plugin.wasm).
        dir: PathBuf,
        /// Where compiled components are cached (default: a scratch directory, so that the
        /// check's failures never count against the plugin where a server runs it).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// A tokenizer.json to initialise the plugin with (repeatable). Default: every
        /// assets/tokenizers/*/tokenizer.json under the working directory.
        #[arg(long)]
        tokenizer: Vec<PathBuf>,
    },
    /// Lift the quarantine of a plugin: it serves again, here and (within a second) in a
    /// running server that shares the state directory.
    Unquarantine {
        /// The plugin's name in the registry.
        name: String,
        #[command(flatten)]
        runtime: RuntimeArgs,
    },
    /// Write a new plugin crate (SDK included, plugin profile and toolchain pinned, a
    /// recogniser skeleton with tests) that builds in any folder.
    New {
        /// The plugin's name (a-z, 0-9, `-`, `_`): the crate's folder and the registry entry.
        name: String,
        /// The constraint kind it serves (requests name it in `response_format.kind`).
        #[arg(long)]
        kind: String,
        /// The folder to create the crate in.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Use the guest SDK in this folder instead of copying it into the crate.
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Build a plugin crate for wasm32-wasip2 with its plugin profile, write its manifest with
    /// the component's sha256, check it as the server loads it, and optionally install it.
    Build {
        /// The plugin crate (holding Cargo.toml and plugin.toml).
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// Copy the built plugin into this registry directory (a running server picks it up).
        #[arg(long, value_name = "REGISTRY")]
        install: Option<PathBuf>,
        /// Where compiled components are cached (default: a scratch directory).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// A tokenizer.json to initialise the plugin with (repeatable). Default: every
        /// assets/tokenizers/*/tokenizer.json under the working directory.
        #[arg(long)]
        tokenizer: Vec<PathBuf>,
    },
}

pub fn run(cmd: PluginsCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        PluginsCommand::List { runtime, json } => {
            let registry = Registry::new(&runtime.plugins_dir, runtime.runtime()?)?;
            registry.scan();
            let list = registry.list();
            if json {
                let rows: Vec<serde_json::Value> = list
                    .iter()
                    .map(|p| {
                        serde_json::json!({
                            "name": p.name, "version": p.version, "kinds": p.kinds,
                            "status": p.status, "strikes": p.strikes, "update_error": p.update_error,
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else if list.is_empty() {
                println!("no plugins in {}", registry.dir().display());
            } else {
                println!("{:<16} {:<10} {:<32} STATUS", "NAME", "VERSION", "KINDS");
                for p in &list {
                    println!("{:<16} {:<10} {:<32} {}", p.name, p.version, p.kinds.join(","), p.status);
                    if let Some(why) = &p.update_error {
                        println!("{:<16} the files on disk were refused, this version keeps serving: {why}", "");
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        PluginsCommand::Validate { dir, state_dir, tokenizer } => {
            let (runtime, _scratch) = runtime(&dir, state_dir)?;
            Ok(validate(&runtime, &dir, &tokenizer))
        }
        PluginsCommand::Unquarantine { name, runtime } => {
            let wasm = runtime.plugins_dir.join(&name).join("plugin.wasm");
            let bytes =
                std::fs::read(&wasm).with_context(|| format!("no plugin `{name}`: cannot read {}", wasm.display()))?;
            let sha = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
            if runtime.runtime()?.unquarantine(&sha)? {
                println!(
                    "lifted the quarantine of {name} (sha256 {sha}); a running server sharing this state directory serves it again at its next registry scan"
                );
            } else {
                println!("{name} (sha256 {sha}) is not quarantined");
            }
            Ok(ExitCode::SUCCESS)
        }
        PluginsCommand::New { name, kind, dir, sdk } => {
            let made = authoring::new_plugin(&name, &kind, &dir, sdk.as_deref())?;
            println!("wrote {}: a plugin serving `{kind}`", made.display());
            println!("next: cd {} && cargo test && dspark plugins build --install REGISTRY", made.display());
            Ok(ExitCode::SUCCESS)
        }
        PluginsCommand::Build { dir, install, state_dir, tokenizer } => {
            let built = authoring::build_plugin(&dir)?;
            println!("built {} (sha256 {})", built.folder.display(), built.manifest.sha256);
            let (runtime, _scratch) = runtime(&built.folder, state_dir)?;
            if validate(&runtime, &built.folder, &tokenizer) != ExitCode::SUCCESS {
                return Ok(ExitCode::from(1));
            }
            if let Some(registry) = install {
                let dest = authoring::install(&built.folder, &built.manifest.name, &registry)?;
                println!("installed {}", dest.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A plugin runtime for checking a plugin, with `state_dir` as its cache, or by default a
/// scratch directory (returned, removed when dropped): the failures a check provokes (an init
/// over its memory limit) must not count against the plugin where a server runs it.
fn runtime(
    plugin_dir: &Path,
    state_dir: Option<PathBuf>,
) -> anyhow::Result<(Arc<PluginRuntime>, Option<tempfile::TempDir>)> {
    let scratch = match state_dir {
        Some(_) => None,
        None => Some(tempfile::tempdir().context("cannot create a scratch state directory")?),
    };
    let state_dir = state_dir.or_else(|| scratch.as_ref().map(|d| d.path().to_path_buf()));
    let args = RuntimeArgs { plugins_dir: plugin_dir.parent().map(PathBuf::from).unwrap_or_default(), state_dir };
    Ok((args.runtime()?, scratch))
}

/// Loads `dir` as the server would and initialises it with each tokenizer (the defaults when
/// none is given), printing what it found. Success only if every step passed.
fn validate(runtime: &Arc<PluginRuntime>, dir: &Path, tokenizers: &[PathBuf]) -> ExitCode {
    let plugin: Arc<LoadedPlugin> = match runtime.load(dir) {
        Ok(p) => p,
        Err(e) => {
            println!("invalid: {e:#}");
            return ExitCode::from(1);
        }
    };
    println!(
        "ok: {} {} serves {} (sha256 {}, status {})",
        plugin.manifest.name,
        plugin.manifest.version,
        plugin.manifest.kinds.join(", "),
        plugin.sha256,
        plugin.status().as_str()
    );
    let tokenizers = if tokenizers.is_empty() { authoring::default_tokenizers() } else { tokenizers.to_vec() };
    if tokenizers.is_empty() {
        println!(
            "memory not checked against a real vocabulary: no --tokenizer given and none under \
             ./assets/tokenizers; pass --tokenizer PATH/tokenizer.json"
        );
    }
    let mut ok = true;
    for tokenizer in &tokenizers {
        match authoring::check_init(&plugin, tokenizer) {
            Ok(line) => println!("ok: {line}"),
            Err(e) => {
                println!("invalid: {e:#}");
                ok = false;
            }
        }
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
}
