//! The plugin registry directory: one folder per plugin, `plugin.toml` + `plugin.wasm`.
//!
//! [`Registry::scan`] brings the in-memory view up to date with the directory: new folders are
//! loaded, folders whose files changed (size or modification time) are reloaded and replace
//! the old plugin (requests holding the old one finish with it), removed folders are dropped.
//! A folder that fails to load is listed with its error and never stops the others. An update
//! that fails to load (a stale sha256, kinds that differ from the manifest, a half-copied
//! file) does not take a working plugin away: the previous version keeps serving, and the list
//! says the update was refused and why, until the folder changes again.
//! [`Registry::watch`] rescans on a background thread, so plugins can be added, replaced and
//! removed without a restart. Polling (default every second) is used rather than inotify:
//! it works on every filesystem, including network and container mounts, and a scan that
//! finds nothing changed only stats two files per plugin.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use crate::plugin::{LoadedPlugin, Manifest, PluginRuntime, PluginStatus};

/// What the registry knows of one folder.
#[derive(Clone, Debug)]
pub enum EntryState {
    /// Loaded and serving (or quarantined: see [`LoadedPlugin::status`]).
    Loaded(Arc<LoadedPlugin>),
    /// Failed to load; the message says why.
    Failed(String),
}

#[derive(Clone, Debug)]
struct Entry {
    state: EntryState,
    fingerprint: Fingerprint,
    /// Why the folder's current files did not load, while an older version keeps serving.
    update_error: Option<String>,
}

/// Sizes and modification times of the two files: a change means reload.
type Fingerprint = [(u64, Option<SystemTime>); 2];

/// One line of `dspark plugins list` (and one entry of the server's `GET /v1/plugins`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PluginSummary {
    /// The folder name (the plugin's name when it loaded).
    pub name: String,
    /// The manifest's version, when readable.
    pub version: String,
    /// The kinds served.
    pub kinds: Vec<String>,
    /// `ready`, `quarantined`, or `failed: why`.
    pub status: String,
    /// Strikes counted against it in this process.
    pub strikes: u32,
    /// Why the folder's current files were refused while the previous version keeps serving
    /// (absent when the files on disk are the ones serving).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub update_error: Option<String>,
}

/// What a scan changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Folders loaded for the first time.
    pub added: Vec<String>,
    /// Folders reloaded because their files changed.
    pub replaced: Vec<String>,
    /// Folders that disappeared.
    pub removed: Vec<String>,
    /// Folders that failed to load, with the reason.
    pub failed: Vec<(String, String)>,
    /// Of the failed folders, those whose previous version keeps serving.
    pub kept_previous: Vec<String>,
    /// Plugins whose quarantine record was removed, and which serve again.
    pub unquarantined: Vec<String>,
}

/// The plugins of one directory.
pub struct Registry {
    dir: PathBuf,
    runtime: Arc<PluginRuntime>,
    entries: RwLock<BTreeMap<String, Entry>>,
}

impl Registry {
    /// A registry over `dir` (not scanned yet). Refuses a runtime whose state directory is
    /// inside `dir`: cached native code must never come from where plugins are dropped.
    pub fn new(dir: impl Into<PathBuf>, runtime: Arc<PluginRuntime>) -> anyhow::Result<Self> {
        let dir = dir.into();
        let state = std::fs::canonicalize(&runtime.config().state_dir).unwrap_or(runtime.config().state_dir.clone());
        if let Ok(d) = std::fs::canonicalize(&dir)
            && state.starts_with(&d)
        {
            anyhow::bail!(
                "the state directory {} is inside the plugin directory {}; choose one outside it",
                state.display(),
                d.display()
            );
        }
        Ok(Self { dir, runtime, entries: RwLock::new(BTreeMap::new()) })
    }

    /// The directory scanned.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Brings the registry up to date with the directory. A missing directory is an empty
    /// registry.
    pub fn scan(&self) -> ScanReport {
        let mut report = ScanReport::default();
        let mut seen: BTreeMap<String, (PathBuf, Fingerprint)> = BTreeMap::new();
        if let Ok(read) = std::fs::read_dir(&self.dir) {
            for entry in read.flatten() {
                let path = entry.path();
                if !path.is_dir() {
                    continue;
                }
                let Some(name) = path.file_name().and_then(|n| n.to_str()).map(str::to_string) else { continue };
                if name.starts_with('.') {
                    continue;
                }
                seen.insert(name, (path.clone(), fingerprint(&path)));
            }
        }
        let current: BTreeMap<String, Fingerprint> = match self.entries.read() {
            Ok(e) => e.iter().map(|(k, v)| (k.clone(), v.fingerprint)).collect(),
            Err(p) => p.into_inner().iter().map(|(k, v)| (k.clone(), v.fingerprint)).collect(),
        };
        // Load outside the lock: compiling a component can take seconds.
        let mut updates = Vec::new();
        for (name, (path, fp)) in &seen {
            match current.get(name) {
                Some(old) if old == fp => continue,
                old => {
                    let (state, update_error) = match self.runtime.load(path) {
                        Ok(p) => (EntryState::Loaded(p), None),
                        Err(e) => {
                            let why = format!("{e:#}");
                            report.failed.push((name.clone(), why.clone()));
                            match self.state(name) {
                                Some(previous @ EntryState::Loaded(_)) => {
                                    report.kept_previous.push(name.clone());
                                    (previous, Some(why))
                                }
                                _ => (EntryState::Failed(why), None),
                            }
                        }
                    };
                    if old.is_some() {
                        report.replaced.push(name.clone())
                    } else {
                        report.added.push(name.clone())
                    }
                    updates.push((name.clone(), Entry { state, fingerprint: *fp, update_error }));
                }
            }
        }
        let mut entries = self.entries.write().unwrap_or_else(|p| p.into_inner());
        // Quarantines an operator lifted (`dspark plugins unquarantine`) end here.
        for (name, entry) in entries.iter() {
            if let EntryState::Loaded(p) = &entry.state
                && p.sync_quarantine_record()
            {
                report.unquarantined.push(name.clone());
            }
        }
        for (name, entry) in updates {
            entries.insert(name, entry);
        }
        let gone: Vec<String> = entries.keys().filter(|k| !seen.contains_key(*k)).cloned().collect();
        for name in gone {
            entries.remove(&name);
            report.removed.push(name);
        }
        report
    }

    /// The loaded plugin named `name`, if it is loaded.
    pub fn get(&self, name: &str) -> Option<Arc<LoadedPlugin>> {
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        match entries.get(name).map(|e| &e.state) {
            Some(EntryState::Loaded(p)) => Some(p.clone()),
            _ => None,
        }
    }

    /// The first ready plugin (by name) that serves `kind`.
    pub fn find_kind(&self, kind: &str) -> Option<Arc<LoadedPlugin>> {
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        entries.values().find_map(|e| match &e.state {
            EntryState::Loaded(p) if p.serves(kind) && p.status() == PluginStatus::Ready => Some(p.clone()),
            _ => None,
        })
    }

    /// Why no ready plugin serves `kind`, one sentence per installed plugin that declares it
    /// but cannot serve (quarantined, or failed to load); empty when none declares it.
    pub fn unavailable_for_kind(&self, kind: &str) -> Vec<String> {
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        let mut why = Vec::new();
        for (name, e) in entries.iter() {
            match &e.state {
                EntryState::Loaded(p) if p.serves(kind) => {
                    if let Err(e) = p.check_not_quarantined() {
                        why.push(e.to_string());
                    }
                }
                EntryState::Failed(reason) => {
                    let manifest = Manifest::load(&self.dir.join(name).join("plugin.toml")).ok();
                    if manifest.is_some_and(|m| m.kinds.iter().any(|k| k == kind)) {
                        why.push(format!("plugin `{name}` failed to load: {reason}"));
                    }
                }
                _ => {}
            }
        }
        why
    }

    /// The state of the folder `name`.
    pub fn state(&self, name: &str) -> Option<EntryState> {
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        entries.get(name).map(|e| e.state.clone())
    }

    /// One summary per folder, by name.
    pub fn list(&self) -> Vec<PluginSummary> {
        let entries = self.entries.read().unwrap_or_else(|p| p.into_inner());
        entries
            .iter()
            .map(|(name, e)| match &e.state {
                EntryState::Loaded(p) => PluginSummary {
                    name: name.clone(),
                    version: p.manifest.version.clone(),
                    kinds: p.manifest.kinds.clone(),
                    status: p.status().as_str().to_string(),
                    strikes: p.strikes(),
                    update_error: e.update_error.clone(),
                },
                EntryState::Failed(why) => {
                    let manifest = Manifest::load(&self.dir.join(name).join("plugin.toml")).ok();
                    PluginSummary {
                        name: name.clone(),
                        version: manifest.as_ref().map_or("?".into(), |m| m.version.clone()),
                        kinds: manifest.map_or(Vec::new(), |m| m.kinds),
                        status: format!("failed: {why}"),
                        strikes: 0,
                        update_error: None,
                    }
                }
            })
            .collect()
    }

    /// Rescans every `interval` on a background thread until the returned guard is dropped.
    /// `on_change` is called with each scan that changed something.
    pub fn watch(
        self: &Arc<Self>,
        interval: Duration,
        on_change: impl Fn(&ScanReport) + Send + 'static,
    ) -> std::io::Result<WatchGuard> {
        let stop = Arc::new(AtomicBool::new(false));
        let registry = Arc::downgrade(self);
        let flag = stop.clone();
        std::thread::Builder::new().name("dspark-plugin-watch".into()).spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                std::thread::sleep(interval);
                let Some(registry) = registry.upgrade() else { break };
                let report = registry.scan();
                if report != ScanReport::default() {
                    on_change(&report);
                }
            }
        })?;
        Ok(WatchGuard { stop })
    }
}

/// Stops [`Registry::watch`] when dropped.
pub struct WatchGuard {
    stop: Arc<AtomicBool>,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn fingerprint(dir: &Path) -> Fingerprint {
    let stat =
        |f: &str| std::fs::metadata(dir.join(f)).map(|m| (m.len(), m.modified().ok())).unwrap_or((u64::MAX, None));
    [stat("plugin.toml"), stat("plugin.wasm")]
}
