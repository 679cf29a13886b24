//! `dspark constraint check`: walk a text through a real matcher, token by token.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, anyhow};
use clap::Subcommand;
use dspark_host::plugin::registry::{EntryState, Registry};
use dspark_host::plugin::{MatcherHandle, PluginError, PluginInstance, RuntimeConfig};
use dspark_host::tokenizer::{CanonicalTokenizer, HfTokenizer};

use super::RuntimeArgs;

#[derive(Debug, Subcommand)]
pub enum ConstraintCommand {
    /// The MaskBench method through a real plugin in wasmtime: compile time, mask time per
    /// token, acceptance of valid and rejection of invalid instances, fast-forward share.
    Maskbench {
        #[command(flatten)]
        runtime: RuntimeArgs,
        /// A Hugging Face tokenizer.json.
        #[arg(long)]
        tokenizer: PathBuf,
        /// A folder of `{schema, tests}` files (sub-folders included).
        #[arg(long)]
        data: PathBuf,
        /// Only the first N files (in sorted order).
        #[arg(long)]
        limit: Option<usize>,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
        /// The plugin to run.
        #[arg(long, default_value = "json-schema")]
        plugin: String,
        /// The kind to compile.
        #[arg(long, default_value = "json-schema")]
        kind: String,
        /// Options; instances keep their own key order, so properties may come in any order.
        #[arg(long, default_value = r#"{"property_order":"any"}"#)]
        options: String,
        /// Run each schema as the parameters of one tool through the `tool-call` plugin in
        /// this format (hermes, llama3, mistral, generic), `tool_choice: "required"`: each
        /// instance is walked as that tool's call. Overrides --plugin and --kind.
        #[arg(long, value_name = "FORMAT")]
        as_tools: Option<String>,
        /// How many of the slowest masks and compiles to list (text output).
        #[arg(long, default_value_t = 5)]
        slowest: usize,
    },
    /// Tokenise TEXT, walk it through a matcher of the constraint, print per token whether it
    /// was allowed and which forced spans were met; exit 0 only if the text is accepted.
    Check {
        #[command(flatten)]
        runtime: RuntimeArgs,
        /// The plugin's name in the registry.
        #[arg(long)]
        plugin: String,
        /// The constraint kind.
        #[arg(long)]
        kind: String,
        /// The constraint source (a regex, a JSON Schema, ...).
        #[arg(long, conflicts_with = "source_file", required_unless_present = "source_file")]
        source: Option<String>,
        /// Read the source from a file instead.
        #[arg(long)]
        source_file: Option<PathBuf>,
        /// Options, a JSON object.
        #[arg(long, default_value = "{}")]
        options: String,
        /// A Hugging Face tokenizer.json.
        #[arg(long)]
        tokenizer: PathBuf,
        /// The text to check.
        #[arg(long)]
        text: String,
    },
}

pub fn run(cmd: ConstraintCommand) -> anyhow::Result<ExitCode> {
    let (runtime, plugin, kind, source, source_file, options, tokenizer, text) = match cmd {
        ConstraintCommand::Maskbench {
            runtime,
            tokenizer,
            data,
            limit,
            json,
            plugin,
            kind,
            options,
            as_tools,
            slowest,
        } => {
            let as_tools = as_tools
                .map(|f| {
                    dspark_plugin_tool_call::Format::from_name(&f).ok_or_else(|| {
                        anyhow!("--as-tools: unknown format `{f}`; known: hermes, llama3, mistral, generic")
                    })
                })
                .transpose()?;
            let (plugin, kind) =
                if as_tools.is_some() { ("tool-call".into(), "tool-call".into()) } else { (plugin, kind) };
            return dspark_bench::maskbench::run(dspark_bench::maskbench::Args {
                plugins_dir: runtime.plugins_dir,
                state_dir: match runtime.state_dir {
                    Some(d) => d,
                    None => RuntimeConfig::default_state_dir()?,
                },
                plugin,
                kind,
                as_tools,
                options,
                tokenizer,
                data,
                limit,
                json,
                slowest,
            });
        }
        ConstraintCommand::Check { runtime, plugin, kind, source, source_file, options, tokenizer, text } => {
            (runtime, plugin, kind, source, source_file, options, tokenizer, text)
        }
    };
    let source = match (source, source_file) {
        (Some(s), _) => s,
        (None, Some(f)) => std::fs::read_to_string(&f).with_context(|| format!("cannot read {}", f.display()))?,
        (None, None) => unreachable!("clap requires one of --source and --source-file"),
    };
    let registry = Registry::new(&runtime.plugins_dir, runtime.runtime()?)?;
    registry.scan();
    let loaded = match registry.state(&plugin) {
        Some(EntryState::Loaded(p)) => p,
        Some(EntryState::Failed(why)) => return Err(anyhow!("plugin `{plugin}` failed to load: {why}")),
        None => {
            let names: Vec<String> = registry.list().into_iter().map(|p| p.name).collect();
            return Err(anyhow!(
                "no plugin `{plugin}` in {} (found: {})",
                registry.dir().display(),
                if names.is_empty() { "none".into() } else { names.join(", ") }
            ));
        }
    };
    let tok = Arc::new(HfTokenizer::from_file(&tokenizer, None)?);
    let table = tok.table().clone();
    let canonical: Arc<dyn CanonicalTokenizer> = tok.clone();
    let mut instance = loaded.instantiate(table.clone(), canonical.clone())?;
    let compiled = match instance.compile(&kind, &source, &options) {
        Ok(c) => c,
        Err(PluginError::Constraint { error, .. }) => {
            println!("compile error: {error}");
            return Ok(ExitCode::from(1));
        }
        Err(e) => return Err(e.into()),
    };
    for (loc, msg) in &compiled.warnings {
        println!("warning at {loc}: {msg}");
    }
    let matcher = instance.new_matcher(&compiled)?;
    let tokens = canonical.tokenize(text.as_bytes());
    let show = |t: u32| format!("{:?}", String::from_utf8_lossy(table.token_bytes(t)));
    println!("{} tokens, vocabulary {}", tokens.len(), table.vocab_size());
    // The span that is certain before anything is written (as the server forces it).
    let start = instance.commit(&matcher, &[])?;
    let mut i = meet_span(&mut instance, &matcher, &start.forced, &tokens, &show)?;
    let mut forced_total = i;
    while i < tokens.len() {
        let t = tokens[i];
        let mask = instance.compute_mask(&matcher)?;
        let allowed = mask.allows(t);
        let committed = instance.commit(&matcher, &[t]);
        match (&committed, allowed) {
            (Ok(_), true) => {
                println!("#{i:<4} {t:>7} {:<24} allowed ({} tokens allowed)", show(t), mask.count(table.vocab_size()))
            }
            (Err(e), _) => {
                println!("#{i:<4} {t:>7} {:<24} REJECTED: {e}", show(t));
                println!("result: rejected at token {i}");
                return Ok(ExitCode::from(1));
            }
            (Ok(_), false) => {
                println!(
                    "#{i:<4} {t:>7} {:<24} REJECTED by the mask (but the commit accepted it: plugin bug)",
                    show(t)
                );
                return Ok(ExitCode::from(1));
            }
        }
        i += 1;
        let outcome = committed?;
        let met = meet_span(&mut instance, &matcher, &outcome.forced, &tokens[i..], &show)?;
        i += met;
        forced_total += met;
        if outcome.stop && i < tokens.len() {
            println!("result: the constraint stopped the output at token {i}, but the text goes on");
            return Ok(ExitCode::from(1));
        }
    }
    let accepting = instance.is_accepting(&matcher)?;
    println!("forced tokens: {forced_total} of {}", tokens.len());
    if accepting {
        println!("result: accepted");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("result: not accepted (the text is an incomplete match)");
        Ok(ExitCode::from(1))
    }
}

/// Meets a forced span with the text's next tokens: consumes it where they are the same
/// (returning its length), else rolls it back (returning 0). Prints which.
fn meet_span(
    instance: &mut PluginInstance,
    matcher: &MatcherHandle,
    forced: &[u32],
    next: &[u32],
    show: &dyn Fn(u32) -> String,
) -> anyhow::Result<usize> {
    if forced.is_empty() {
        return Ok(0);
    }
    let span: Vec<String> = forced.iter().map(|&f| show(f)).collect();
    if next.starts_with(forced) {
        println!("      forced span of {} tokens matches the text: {}", forced.len(), span.join(" "));
        Ok(forced.len())
    } else {
        println!("      forced span {} differs from the text's tokens here; rolled back", span.join(" "));
        instance.rollback(matcher, forced.len() as u32)?;
        Ok(0)
    }
}
