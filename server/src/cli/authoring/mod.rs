//! `dspark plugins new` and `dspark plugins build`: a plugin crate from nothing to an installed
//! component, anywhere on disk.
//!
//! `new` writes a crate that builds outside this repository: the guest SDK this binary speaks
//! to is copied into it (`vendor/dspark-guest`, with the contract's WIT files beside it), its
//! dependency versions are pinned by a copy of this repository's `Cargo.lock`, the toolchain
//! and the `wasm32-wasip2` target by a `rust-toolchain.toml`, and the plugin profile
//! (`panic = "abort"`, `opt-level = 3`) is in its `Cargo.toml`. The SDK is copied rather than
//! taken from a registry because it is not published, and a copy matches the host exactly.
//!
//! `build` runs cargo with that profile and target, finds the component from cargo's own
//! artifact messages, writes the manifest with the component's sha256, checks the result
//! as the server would load it, and with `--install` copies it into a registry: the
//! component first, then the manifest, each by a rename, so a watching server never reads a
//! half-written file (and keeps the previous version serving if it sees the new component
//! before its manifest).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use dspark_host::plugin::{LoadedPlugin, Manifest};
use dspark_host::tokenizer::HfTokenizer;
use sha2::{Digest, Sha256};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded_sdk.rs"));
}

const WORKSPACE_MANIFEST: &str = include_str!("../../../../Cargo.toml");
const SDK_MANIFEST: &str = include_str!("../../../../guest-sdk/Cargo.toml");
const WORKSPACE_LOCK: &str = include_str!("../../../../Cargo.lock");
const TOOLCHAIN: &str = include_str!("../../../../rust-toolchain.toml");
const CARGO_TEMPLATE: &str = include_str!("template/Cargo.toml.tmpl");
const MANIFEST_TEMPLATE: &str = include_str!("template/plugin.toml.tmpl");
const LIB_TEMPLATE: &str = include_str!("template/lib.rs.tmpl");

/// The target every plugin is built for.
const TARGET: &str = "wasm32-wasip2";

/// Writes a new plugin crate `dir/name` serving `kind`. `sdk` takes the guest SDK from that
/// folder instead of copying it in (for work on the SDK itself).
pub fn new_plugin(name: &str, kind: &str, dir: &Path, sdk: Option<&Path>) -> anyhow::Result<PathBuf> {
    check_name(name)?;
    if kind.is_empty()
        || kind.len() > 64
        || !kind.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
    {
        bail!("kind `{kind}` must be 1-64 characters of a-z, 0-9, `-`, `_`, `.`");
    }
    let crate_dir = dir.join(name);
    if crate_dir.read_dir().is_ok_and(|mut d| d.next().is_some()) {
        bail!("{} exists and is not empty; choose another --dir or name", crate_dir.display());
    }
    let sdk_path = match sdk {
        Some(p) => std::fs::canonicalize(p).with_context(|| format!("--sdk {}", p.display()))?,
        None => PathBuf::from("vendor/dspark-guest"),
    };
    let fill = |template: &str| {
        template
            .replace("{{name}}", name)
            .replace("{{kind}}", kind)
            .replace("{{type}}", &type_name(name))
            .replace("{{sdk_path}}", &sdk_path.display().to_string().replace('\\', "/"))
            .replace("{{description}}", &format!("Constrains output to the `{kind}` language"))
    };
    let mut files: Vec<(PathBuf, String)> = vec![
        ("Cargo.toml".into(), fill(CARGO_TEMPLATE)),
        ("plugin.toml".into(), fill(MANIFEST_TEMPLATE)),
        ("src/lib.rs".into(), fill(LIB_TEMPLATE)),
        ("rust-toolchain.toml".into(), TOOLCHAIN.to_string()),
        ("Cargo.lock".into(), WORKSPACE_LOCK.to_string()),
        (".gitignore".into(), "/target\n".into()),
    ];
    if sdk.is_none() {
        files.push(("vendor/dspark-guest/Cargo.toml".into(), standalone_sdk_manifest()?));
        for (file, text) in embedded::SDK_SOURCES {
            files.push((Path::new("vendor/dspark-guest/src").join(file), text.to_string()));
        }
        for (file, text) in embedded::WIT_FILES {
            files.push((Path::new("vendor/wit/0.1.0").join(file), text.to_string()));
        }
    }
    for (path, text) in files {
        let path = crate_dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(crate_dir)
}

/// `iso-date` -> `IsoDate`: the prefix of the skeleton's type names.
fn type_name(name: &str) -> String {
    let mut out = String::new();
    for part in name.split(['-', '_']).filter(|p| !p.is_empty()) {
        let mut chars = part.chars();
        if let Some(first) = chars.next() {
            out.extend(first.to_uppercase());
            out.push_str(chars.as_str());
        }
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, 'P');
    }
    out
}

fn check_name(name: &str) -> anyhow::Result<()> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    if !valid {
        bail!("plugin name `{name}` must start with a-z and have 1-64 characters of a-z, 0-9, `-`, `_`");
    }
    Ok(())
}

/// The SDK's `Cargo.toml` with everything it inherits from this workspace written out: the
/// package fields and the dependency versions and features. Tests and lints are left out.
fn standalone_sdk_manifest() -> anyhow::Result<String> {
    let workspace: toml::Table = toml::from_str(WORKSPACE_MANIFEST).context("the workspace manifest")?;
    let mut sdk: toml::Table = toml::from_str(SDK_MANIFEST).context("the SDK manifest")?;
    let ws = workspace.get("workspace").and_then(|w| w.as_table()).ok_or_else(|| anyhow!("no [workspace]"))?;
    let inherited = |v: &toml::Value| v.as_table().is_some_and(|t| t.get("workspace") == Some(&true.into()));
    if let Some(package) = sdk.get_mut("package").and_then(|p| p.as_table_mut()) {
        let fields = ws.get("package").and_then(|p| p.as_table());
        for (key, value) in package.iter_mut() {
            if inherited(value) {
                *value = fields.and_then(|f| f.get(key)).cloned().ok_or_else(|| anyhow!("package.{key}"))?;
            }
        }
    }
    let ws_deps = ws.get("dependencies").and_then(|d| d.as_table()).cloned().unwrap_or_default();
    let resolve = |deps: &mut toml::Table| -> anyhow::Result<()> {
        for (name, dep) in deps.iter_mut() {
            if !inherited(dep) {
                continue;
            }
            let mut resolved = match ws_deps.get(name) {
                Some(toml::Value::String(version)) => {
                    toml::Table::from_iter([("version".into(), version.clone().into())])
                }
                Some(toml::Value::Table(t)) => t.clone(),
                _ => bail!("dependency `{name}` is not in [workspace.dependencies]"),
            };
            for (key, value) in dep.as_table().into_iter().flatten() {
                match (key.as_str(), value, resolved.get_mut("features")) {
                    ("workspace", ..) => {}
                    ("features", toml::Value::Array(extra), Some(toml::Value::Array(features))) => {
                        features.extend(extra.iter().cloned())
                    }
                    _ => {
                        resolved.insert(key.clone(), value.clone());
                    }
                }
            }
            *dep = toml::Value::Table(resolved);
        }
        Ok(())
    };
    if let Some(deps) = sdk.get_mut("dependencies").and_then(|d| d.as_table_mut()) {
        resolve(deps)?;
    }
    if let Some(targets) = sdk.get_mut("target").and_then(|t| t.as_table_mut()) {
        for (_, target) in targets.iter_mut() {
            if let Some(deps) = target.get_mut("dependencies").and_then(|d| d.as_table_mut()) {
                resolve(deps)?;
            }
        }
    }
    sdk.remove("lints");
    sdk.remove("dev-dependencies");
    Ok(format!("# The dspark guest SDK, copied by `dspark plugins new`.\n{}", toml::to_string(&sdk)?))
}

/// What `plugins build` produced.
pub struct BuiltPlugin {
    /// The plugin folder (`plugin.wasm` and `plugin.toml`), ready to copy into a registry.
    pub folder: PathBuf,
    /// Its manifest, with the component's sha256.
    pub manifest: Manifest,
}

/// Builds the plugin crate in `crate_dir` for wasm32-wasip2 with its `plugin` profile and lays
/// out its plugin folder beside the component.
pub fn build_plugin(crate_dir: &Path) -> anyhow::Result<BuiltPlugin> {
    let manifest_path = crate_dir.join("plugin.toml");
    let text =
        std::fs::read_to_string(&manifest_path).with_context(|| format!("cannot read {}", manifest_path.display()))?;
    let mut table: toml::Table =
        toml::from_str(&text).with_context(|| format!("invalid {}", manifest_path.display()))?;
    let name = table
        .get("name")
        .and_then(|n| n.as_str())
        .ok_or_else(|| anyhow!("{} has no `name`", manifest_path.display()))?
        .to_string();
    check_name(&name)?;
    ensure_target(crate_dir)?;
    let wasm = cargo_build(crate_dir)?;
    let bytes = std::fs::read(&wasm).with_context(|| format!("cannot read {}", wasm.display()))?;
    table.insert("sha256".into(), hex::encode(Sha256::digest(&bytes)).into());
    let manifest_text = toml::to_string(&table)?;
    let manifest: Manifest =
        toml::from_str(&manifest_text).with_context(|| format!("invalid {}", manifest_path.display()))?;
    manifest.check()?;
    let folder = wasm.parent().unwrap_or(Path::new(".")).join("dspark-plugins").join(&name);
    std::fs::create_dir_all(&folder).with_context(|| format!("cannot create {}", folder.display()))?;
    std::fs::write(folder.join("plugin.wasm"), &bytes)?;
    std::fs::write(folder.join("plugin.toml"), manifest_text)?;
    Ok(BuiltPlugin { folder, manifest })
}

/// Adds the wasm32-wasip2 target to the toolchain `crate_dir` builds with, when it lacks it
/// (rustup installs a toolchain file's targets only with the toolchain itself).
fn ensure_target(crate_dir: &Path) -> anyhow::Result<()> {
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .current_dir(crate_dir)
        .output()
        .context("cannot run rustc: install Rust with rustup (https://rustup.rs)")?;
    let sysroot = PathBuf::from(String::from_utf8_lossy(&sysroot.stdout).trim());
    if sysroot.join("lib/rustlib").join(TARGET).is_dir() {
        return Ok(());
    }
    eprintln!("adding the {TARGET} target with rustup");
    let status = Command::new("rustup")
        .args(["target", "add", TARGET])
        .current_dir(crate_dir)
        .status()
        .context("cannot run rustup to add the wasm32-wasip2 target")?;
    if !status.success() {
        bail!("`rustup target add {TARGET}` failed");
    }
    Ok(())
}

/// Runs cargo and returns the component it wrote, as its artifact message names it.
fn cargo_build(crate_dir: &Path) -> anyhow::Result<PathBuf> {
    let output = Command::new("cargo")
        .args(["build", "--profile", "plugin", "--target", TARGET, "--message-format", "json-render-diagnostics"])
        .current_dir(crate_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .context("cannot run cargo: install Rust with rustup (https://rustup.rs)")?;
    if !output.status.success() {
        bail!("cargo build failed in {} (its messages are above)", crate_dir.display());
    }
    let mut wasm = None;
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let is_cdylib = message["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "cdylib"));
        if message["reason"] == "compiler-artifact" && is_cdylib {
            let files = message["filenames"].as_array().into_iter().flatten();
            wasm = files.filter_map(|f| f.as_str()).find(|f| f.ends_with(".wasm")).map(PathBuf::from).or(wasm);
        }
    }
    wasm.ok_or_else(|| {
        anyhow!("cargo built no .wasm component in {}: is `crate-type = [\"cdylib\"]` in [lib]?", crate_dir.display())
    })
}

/// Copies a plugin folder into `registry/<name>`: the component, then the manifest, each
/// written aside and renamed into place.
pub fn install(folder: &Path, name: &str, registry: &Path) -> anyhow::Result<PathBuf> {
    let dest = registry.join(name);
    std::fs::create_dir_all(&dest).with_context(|| format!("cannot create {}", dest.display()))?;
    for file in ["plugin.wasm", "plugin.toml"] {
        let tmp = dest.join(format!(".{file}.tmp{}", std::process::id()));
        std::fs::copy(folder.join(file), &tmp).with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, dest.join(file)).with_context(|| format!("cannot install {}", dest.display()))?;
    }
    Ok(dest)
}

/// The tokenizers `plugins validate` initialises a plugin with when none is given: every
/// `assets/tokenizers/*/tokenizer.json` under the working directory (where `scripts/fetch-assets.sh`
/// puts Llama-3's, Qwen2.5's and DeepSeek-V3's), in name order.
pub fn default_tokenizers() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir("assets/tokenizers")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("tokenizer.json"))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found
}

/// Initialises `plugin` with the vocabulary of `tokenizer` as the server would, and says how
/// much linear memory the instance took against its limit.
pub fn check_init(plugin: &Arc<LoadedPlugin>, tokenizer: &Path) -> anyhow::Result<String> {
    let tok = Arc::new(HfTokenizer::from_file(tokenizer, None)?);
    let vocab = tok.table().vocab_size();
    let instance = plugin
        .instantiate(tok.table().clone(), tok.clone())
        .with_context(|| format!("init with {} ({vocab} tokens)", tokenizer.display()))?;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    Ok(format!(
        "init with {} ({vocab} tokens): {:.1} MiB of linear memory of its {:.0} MiB limit",
        tokenizer.display(),
        mib(instance.memory_peak()),
        mib(plugin.memory_limit())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names_are_camel_case() {
        assert_eq!(type_name("iso-date"), "IsoDate");
        assert_eq!(type_name("hex_colour2"), "HexColour2");
        assert_eq!(type_name("x"), "X");
    }

    #[test]
    fn the_sdk_manifest_stands_alone() {
        let text = standalone_sdk_manifest().unwrap();
        let table: toml::Table = toml::from_str(&text).unwrap();
        assert_eq!(table["package"]["name"].as_str(), Some("dspark-guest"));
        assert_eq!(table["package"]["edition"].as_str(), Some("2024"));
        assert!(!text.contains("workspace"), "{text}");
        let serde = &table["dependencies"]["serde"];
        assert_eq!(serde["optional"].as_bool(), Some(true));
        assert!(serde["features"].as_array().unwrap().iter().any(|f| f.as_str() == Some("derive")));
        let wit_bindgen = &table["target"]["cfg(target_arch = \"wasm32\")"]["dependencies"]["wit-bindgen"];
        assert!(wit_bindgen["version"].as_str().is_some(), "{text}");
        assert!(table.get("lints").is_none() && table.get("dev-dependencies").is_none());
    }

    #[test]
    fn names_and_kinds_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let e = new_plugin("Bad", "k", dir.path(), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "plugin name `Bad` must start with a-z and have 1-64 characters of a-z, 0-9, `-`, `_`"
        );
        let e = new_plugin("good", "bad kind", dir.path(), None).unwrap_err();
        assert_eq!(e.to_string(), "kind `bad kind` must be 1-64 characters of a-z, 0-9, `-`, `_`, `.`");
        let made = new_plugin("good", "k", dir.path(), None).unwrap();
        assert!(made.join("vendor/dspark-guest/src/lib.rs").is_file());
        assert!(made.join("vendor/wit/0.1.0/constraint.wit").is_file());
        let e = new_plugin("good", "k", dir.path(), None).unwrap_err();
        assert!(e.to_string().ends_with("exists and is not empty; choose another --dir or name"), "{e}");
    }
}
