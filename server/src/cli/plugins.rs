//! `dspark plugins list|validate`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;
use dspark_host::plugin::registry::Registry;

use super::RuntimeArgs;

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
    /// Check one plugin folder (manifest, sha256, component, kinds); exit 0 if it loads.
    Validate {
        /// The plugin's folder (holding plugin.toml and plugin.wasm).
        dir: PathBuf,
        /// Where compiled components are cached.
        #[arg(long)]
        state_dir: Option<PathBuf>,
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
        PluginsCommand::Validate { dir, state_dir } => {
            let args = RuntimeArgs { plugins_dir: dir.parent().map(PathBuf::from).unwrap_or_default(), state_dir };
            match args.runtime()?.load(&dir) {
                Ok(p) => {
                    println!(
                        "ok: {} {} serves {} (sha256 {}, status {})",
                        p.manifest.name,
                        p.manifest.version,
                        p.manifest.kinds.join(", "),
                        p.sha256,
                        p.status().as_str()
                    );
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    println!("invalid: {e:#}");
                    Ok(ExitCode::from(1))
                }
            }
        }
    }
}
