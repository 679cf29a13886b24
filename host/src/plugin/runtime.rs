//! [`PluginRuntime`]: the wasmtime engine, its epoch ticker, the on-disk component cache, and
//! the loading of a plugin into a [`LoadedPlugin`].

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Config, Engine, OptLevel, ResourceLimiter, StoreLimits};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::bindings;
use super::deadline::{CallDeadline, EpochClock, Verdict};
use super::health::Health;
use super::manifest::Manifest;
use super::{ErrorCode, PluginError};
use crate::tokenizer::CanonicalTokenizer;

/// Converts wasmtime's own error type into `anyhow` so boundary errors can carry context.
trait IntoAnyhow<T> {
    fn anyhow(self) -> anyhow::Result<T>;
}

impl<T> IntoAnyhow<T> for wasmtime::Result<T> {
    fn anyhow(self) -> anyhow::Result<T> {
        self.map_err(anyhow::Error::from)
    }
}

/// Host-wide limits and the places the runtime keeps its files.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Where compiled components are cached and quarantines recorded. Server-owned: it must
    /// not be inside a plugin directory (a plugin could otherwise plant a native artifact).
    pub state_dir: PathBuf,
    /// Epoch tick: the granularity of every deadline.
    pub tick: Duration,
    /// Default deadline of a matcher call (mask, commit, rollback, ...), in CPU time used by
    /// the call (see [`deadline`](super::deadline)).
    pub mask_deadline: Duration,
    /// Default deadline of a compile (and of `init`), in CPU time.
    pub compile_deadline: Duration,
    /// The most a manifest may raise either deadline to.
    pub max_deadline: Duration,
    /// Default linear memory per instance.
    pub memory_bytes: u64,
    /// The most a manifest may raise memory to.
    pub max_memory_bytes: u64,
    /// The longest forced span accepted from a commit, in tokens.
    pub max_forced_tokens: usize,
    /// Faults (panics, invalid answers, `init` traps) under this many distinct constraints
    /// within [`Self::strike_window`] quarantine a plugin (see [`health`](super::health)).
    pub strike_limit: u32,
    /// How long a fault counts.
    pub strike_window: Duration,
    /// How long a constraint that exhausted a plugin's resources is refused.
    pub refusal_period: Duration,
    /// The largest `plugin.wasm` accepted.
    pub max_component_bytes: u64,
}

impl RuntimeConfig {
    /// Defaults with `state_dir` as the cache and quarantine directory.
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        Self {
            state_dir: state_dir.into(),
            tick: Duration::from_millis(1),
            mask_deadline: Duration::from_millis(10),
            compile_deadline: Duration::from_secs(10),
            max_deadline: Duration::from_secs(60),
            memory_bytes: 256 << 20,
            max_memory_bytes: 2 << 30,
            max_forced_tokens: 4096,
            strike_limit: 3,
            strike_window: Duration::from_secs(600),
            refusal_period: Duration::from_secs(600),
            max_component_bytes: 64 << 20,
        }
    }

    /// The default state directory: `$DSPARK_STATE_DIR`, else `$XDG_CACHE_HOME/dspark`, else
    /// `~/.cache/dspark`. There is no fallback under the system's temp directory: native code
    /// is loaded from here, and a shared temp directory is where another user could plant it.
    pub fn default_state_dir() -> anyhow::Result<PathBuf> {
        if let Some(d) = std::env::var_os("DSPARK_STATE_DIR") {
            return Ok(PathBuf::from(d));
        }
        if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
            return Ok(PathBuf::from(d).join("dspark"));
        }
        if let Some(h) = std::env::var_os("HOME") {
            return Ok(PathBuf::from(h).join(".cache").join("dspark"));
        }
        bail!("no state directory: set DSPARK_STATE_DIR (or HOME), or pass --state-dir")
    }
}

/// Makes sure `dir` is this user's own and closed to others (mode 0700 when anyone else could
/// write there): the component cache in it is native code the runtime loads without
/// compiling, so nobody else may be able to put a file there.
fn secure_dir(dir: &Path) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let meta = std::fs::metadata(dir).with_context(|| format!("cannot read {}", dir.display()))?;
        // The owner of a file this process creates is this process's user.
        let probe = dir.join(format!(".owner-probe-{}", std::process::id()));
        std::fs::write(&probe, b"").with_context(|| format!("cannot write in {}", dir.display()))?;
        let me = std::fs::metadata(&probe).map(|m| m.uid());
        let _ = std::fs::remove_file(&probe);
        let me = me.with_context(|| format!("cannot read {}", probe.display()))?;
        if meta.uid() != me {
            bail!(
                "{} belongs to another user (uid {}, this process runs as uid {me}); compiled plugins are loaded only \
                 from this user's own directory: choose another with --state-dir or DSPARK_STATE_DIR",
                dir.display(),
                meta.uid()
            );
        }
        if meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .with_context(|| format!("cannot close {} to other users", dir.display()))?;
        }
    }
    Ok(())
}

/// The resource limits of one Store, which also records the most linear memory the guest
/// held and the growth it was refused, so that a memory trap can name the manifest key to
/// raise and `plugins validate` can report use against the limit.
pub(crate) struct MemoryLimiter {
    inner: StoreLimits,
    /// The plugin's memory limit, bytes.
    pub(crate) limit: u64,
    /// The most a manifest may ask for on this host, bytes.
    pub(crate) host_max: u64,
    /// The largest linear memory size granted so far, bytes.
    pub(crate) peak: u64,
    /// The size a refused growth asked for, bytes.
    pub(crate) refused: Option<u64>,
}

impl MemoryLimiter {
    fn new(limit: u64, host_max: u64) -> Self {
        let inner = wasmtime::StoreLimitsBuilder::new()
            .memory_size(usize::try_from(limit).unwrap_or(usize::MAX))
            .instances(16)
            .tables(16)
            .memories(4)
            .table_elements(1 << 20)
            .trap_on_grow_failure(true)
            .build();
        Self { inner, limit, host_max, peak: 0, refused: None }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        match self.inner.memory_growing(current, desired, maximum) {
            Ok(true) => {
                self.peak = self.peak.max(desired as u64);
                Ok(true)
            }
            refused => {
                self.refused = Some(desired as u64);
                refused
            }
        }
    }

    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.memory_grow_failed(error)
    }

    fn table_growing(&mut self, current: usize, desired: usize, maximum: Option<usize>) -> wasmtime::Result<bool> {
        self.inner.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.inner.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.inner.instances()
    }

    fn tables(&self) -> usize {
        self.inner.tables()
    }

    fn memories(&self) -> usize {
        self.inner.memories()
    }
}

/// The per-Store state the host keeps for one instance.
pub(crate) struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limits: MemoryLimiter,
    tokenizer: Arc<dyn CanonicalTokenizer>,
    pub(crate) stderr: wasmtime_wasi::p2::pipe::MemoryOutputPipe,
    /// The time limit of the call the Store is running.
    pub(crate) deadline: CallDeadline,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl bindings::dspark::constraint::types::Host for HostState {}

impl bindings::dspark::constraint::host::Host for HostState {
    fn tokenize(&mut self, text: Vec<u8>) -> Vec<u32> {
        self.tokenizer.tokenize(&text)
    }
}

/// The WASI interface whose subscriptions let a guest sleep.
const MONOTONIC_CLOCK: &str = "wasi:clocks/monotonic-clock@0.2.12";

/// Replaces `subscribe-duration` and `subscribe-instant` with functions that trap. A plugin
/// call computes a mask or a step; it has nothing to wait for, and a guest blocked in the host
/// (`std::thread::sleep` ends there) cannot be interrupted by its deadline: the engine's
/// thread would be lost for as long as the guest asked. Reading the clock stays allowed.
fn refuse_sleeping(linker: &mut Linker<HostState>) -> anyhow::Result<()> {
    use wasmtime::component::Resource;
    use wasmtime_wasi::p2::DynPollable;
    const REFUSED: &str = "asked to sleep (a WASI clock subscription); plugins may not wait, only compute";
    linker.allow_shadowing(true);
    let mut clock = linker.instance(MONOTONIC_CLOCK).anyhow()?;
    clock
        .func_wrap("subscribe-duration", |_, (_,): (u64,)| -> wasmtime::Result<(Resource<DynPollable>,)> {
            Err(wasmtime::format_err!(REFUSED))
        })
        .anyhow()?;
    clock
        .func_wrap("subscribe-instant", |_, (_,): (u64,)| -> wasmtime::Result<(Resource<DynPollable>,)> {
            Err(wasmtime::format_err!(REFUSED))
        })
        .anyhow()?;
    linker.allow_shadowing(false);
    Ok(())
}

/// A clock that always reads zero: the default for plugins without the `clock` capability.
struct FrozenClock;

impl wasmtime_wasi::HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl wasmtime_wasi::HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// The shared wasmtime engine with its linker and epoch ticker.
pub struct PluginRuntime {
    engine: Engine,
    linker: Linker<HostState>,
    config: RuntimeConfig,
    ticker_stop: Arc<AtomicBool>,
    /// The ticker's coarse clock (the deadlines' wall-time backstop) and its rest.
    clock: Arc<EpochClock>,
}

impl Drop for PluginRuntime {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
        self.clock.wake_ticker();
    }
}

/// How long a resting ticker sleeps before it looks whether the runtime is gone.
const TICKER_REST: Duration = Duration::from_secs(1);

impl PluginRuntime {
    /// Builds the engine (Cranelift, component model, epoch interruption; no async, no
    /// `component-model-async`), links WASI with no capabilities and the contract's host
    /// interface, and starts the epoch ticker.
    pub fn new(config: RuntimeConfig) -> anyhow::Result<Arc<Self>> {
        let mut wasm = Config::new();
        wasm.epoch_interruption(true)
            .cranelift_opt_level(OptLevel::Speed)
            .wasm_component_model(true)
            .max_wasm_stack(1 << 20);
        let engine = Engine::new(&wasm).anyhow().context("cannot create the wasmtime engine")?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker).anyhow().context("cannot link WASI")?;
        refuse_sleeping(&mut linker).context("cannot replace WASI's clock subscriptions")?;
        bindings::Plugin::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |s| s)
            .anyhow()
            .context("cannot link the dspark host interface")?;
        std::fs::create_dir_all(config.state_dir.join("components"))
            .with_context(|| format!("cannot create the state directory {}", config.state_dir.display()))?;
        std::fs::create_dir_all(config.state_dir.join("quarantine"))?;
        for dir in [config.state_dir.clone(), config.state_dir.join("components"), config.state_dir.join("quarantine")]
        {
            secure_dir(&dir)?;
        }
        let ticker_stop = Arc::new(AtomicBool::new(false));
        let clock = Arc::new(EpochClock::default());
        let runtime = Arc::new(Self { engine, linker, config, ticker_stop: ticker_stop.clone(), clock: clock.clone() });
        let weak: Weak<Self> = Arc::downgrade(&runtime);
        let tick = runtime.config.tick;
        let engine = runtime.engine.clone();
        std::thread::Builder::new()
            .name("dspark-epoch".into())
            .spawn(move || {
                // Named before the first tick, so that a call can always wake a resting ticker.
                clock.set_ticker(std::thread::current());
                let (mut idle, mut seen) = (0, 0);
                while !ticker_stop.load(Ordering::Relaxed) && weak.strong_count() > 0 {
                    std::thread::sleep(tick);
                    clock.read();
                    engine.increment_epoch();
                    clock.tick_or_rest(&mut idle, &mut seen, TICKER_REST);
                }
            })
            .context("cannot start the epoch ticker thread")?;
        Ok(runtime)
    }

    /// Removes every quarantine record from the state directory: a server that does not keep
    /// quarantines across restarts calls this before loading plugins.
    pub fn forget_quarantines(&self) -> std::io::Result<usize> {
        let mut removed = 0;
        for entry in std::fs::read_dir(self.config.state_dir.join("quarantine"))?.flatten() {
            if entry.path().is_file() {
                std::fs::remove_file(entry.path())?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Removes the quarantine record of the component with this sha256, so that the plugin
    /// serves again (at once here, and at the next registry scan of a server sharing the
    /// state directory). Returns whether there was one.
    pub fn unquarantine(&self, sha256: &str) -> std::io::Result<bool> {
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(false);
        }
        match std::fs::remove_file(self.config.state_dir.join("quarantine").join(sha256)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The runtime's configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// Whether the epoch ticker is resting: no plugin call ran for its last 50 ticks (see
    /// [`deadline`](super::deadline)).
    pub fn ticker_resting(&self) -> bool {
        self.clock.resting()
    }

    /// A fresh Store for `plugin`, with its limits and capabilities.
    pub(crate) fn new_store(
        &self,
        plugin: &LoadedPlugin,
        tokenizer: Arc<dyn CanonicalTokenizer>,
    ) -> wasmtime::Store<HostState> {
        let stderr = wasmtime_wasi::p2::pipe::MemoryOutputPipe::new(4096);
        let mut wasi = WasiCtx::builder();
        wasi.stderr(stderr.clone()).allow_ip_name_lookup(false).allow_tcp(false).allow_udp(false);
        if !plugin.manifest.capabilities.clock {
            wasi.wall_clock(FrozenClock).monotonic_clock(FrozenClock);
        }
        let limits = MemoryLimiter::new(plugin.memory_bytes, self.config.max_memory_bytes);
        let deadline = CallDeadline::new(self.config.tick, self.clock.clone());
        let state = HostState { wasi: wasi.build(), table: ResourceTable::new(), limits, tokenizer, stderr, deadline };
        let mut store = wasmtime::Store::new(&self.engine, state);
        store.limiter(|s| &mut s.limits);
        store.epoch_deadline_callback(|mut ctx| {
            Ok(match ctx.data_mut().deadline.on_epoch() {
                Verdict::Continue(ticks) => wasmtime::UpdateDeadline::Continue(ticks),
                Verdict::Interrupt => wasmtime::UpdateDeadline::Interrupt,
            })
        });
        let ticks = store.data_mut().deadline.arm(plugin.compile_deadline);
        store.set_epoch_deadline(ticks);
        store
    }

    /// Compiles `wasm` to a component, or loads it from the state directory's cache, keyed by
    /// the wasm's sha256 and the engine's compatibility hash. Only files this runtime wrote
    /// there are ever deserialized.
    fn component(&self, wasm: &[u8], sha256: &str) -> anyhow::Result<Component> {
        let mut h = DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut h);
        let path = self.config.state_dir.join("components").join(format!("{sha256}-{:016x}.cwasm", h.finish()));
        if path.is_file() {
            // SAFETY: the file is in the server-owned state directory and was written by
            // `Component::serialize` of an engine with the same compatibility hash.
            match unsafe { Component::deserialize_file(&self.engine, &path) } {
                Ok(c) => return Ok(c),
                Err(_) => {
                    let _ = std::fs::remove_file(&path);
                }
            }
        }
        let component = Component::new(&self.engine, wasm).anyhow().context("the component does not compile")?;
        if let Ok(bytes) = component.serialize() {
            let tmp = path.with_extension(format!("tmp{}", std::process::id()));
            if std::fs::write(&tmp, bytes).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        }
        Ok(component)
    }

    /// Loads the plugin in `dir` (`plugin.toml` + `plugin.wasm`): checks the manifest and the
    /// sha256, compiles (or takes from cache), pre-links, and checks the kinds the component
    /// reports against the manifest.
    pub fn load(self: &Arc<Self>, dir: &Path) -> anyhow::Result<Arc<LoadedPlugin>> {
        let manifest = Manifest::load(&dir.join("plugin.toml"))?;
        if let Some(folder) = dir.file_name().and_then(|f| f.to_str())
            && folder != manifest.name
        {
            bail!("plugin `{}` is in folder `{folder}`; the folder must be named after the plugin", manifest.name);
        }
        let wasm_path = dir.join("plugin.wasm");
        let size = std::fs::metadata(&wasm_path).with_context(|| format!("cannot read {}", wasm_path.display()))?.len();
        if size > self.config.max_component_bytes {
            bail!("{} is {size} bytes; the limit is {}", wasm_path.display(), self.config.max_component_bytes);
        }
        let wasm = std::fs::read(&wasm_path).with_context(|| format!("cannot read {}", wasm_path.display()))?;
        let sha = hex::encode(Sha256::digest(&wasm));
        if sha != manifest.sha256 {
            bail!("plugin `{}`: plugin.wasm has sha256 {sha}, the manifest says {}", manifest.name, manifest.sha256);
        }
        let component = self.component(&wasm, &sha).with_context(|| format!("plugin `{}`", manifest.name))?;
        let pre = self
            .linker
            .instantiate_pre(&component)
            .anyhow()
            .with_context(|| format!("plugin `{}` imports something this host does not provide", manifest.name))?;
        let pre = bindings::PluginPre::new(pre)
            .anyhow()
            .with_context(|| format!("plugin `{}` does not export the contract", manifest.name))?;
        let clamp = |asked: Option<u64>, default: Duration| {
            asked.map_or(default, Duration::from_millis).min(self.config.max_deadline)
        };
        let plugin = Arc::new(LoadedPlugin {
            memory_bytes: manifest
                .limits
                .memory_mib
                .map_or(self.config.memory_bytes, |m| m.saturating_mul(1 << 20))
                .min(self.config.max_memory_bytes),
            mask_deadline: clamp(manifest.limits.mask_ms, self.config.mask_deadline),
            compile_deadline: clamp(manifest.limits.compile_ms, self.config.compile_deadline),
            quarantine_marker: self.config.state_dir.join("quarantine").join(&sha),
            health: Health::default(),
            quarantine_strikes: AtomicU32::new(0),
            quarantined: AtomicBool::new(false),
            runtime: self.clone(),
            manifest,
            sha256: sha,
            dir: dir.to_path_buf(),
            pre,
        });
        if plugin.quarantine_marker.exists() {
            plugin.quarantined.store(true, Ordering::Relaxed);
            plugin.quarantine_strikes.store(self.config.strike_limit, Ordering::Relaxed);
        }
        let kinds = plugin.probe_kinds()?;
        let mut declared = plugin.manifest.kinds.clone();
        let mut reported = kinds.clone();
        declared.sort();
        reported.sort();
        if declared != reported {
            bail!(
                "plugin `{}` declares kinds {:?} but the component serves {:?}",
                plugin.manifest.name,
                plugin.manifest.kinds,
                kinds
            );
        }
        Ok(plugin)
    }
}

/// What `plugins list` says of a plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PluginStatus {
    /// Serving.
    Ready,
    /// Refused after repeated failures, until its file changes.
    Quarantined,
}

impl PluginStatus {
    /// `ready` or `quarantined`.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginStatus::Ready => "ready",
            PluginStatus::Quarantined => "quarantined",
        }
    }
}

/// A plugin compiled and pre-linked, ready to instantiate; shared by all its instances.
pub struct LoadedPlugin {
    /// Its manifest.
    pub manifest: Manifest,
    /// The sha256 of its component.
    pub sha256: String,
    /// The folder it was loaded from.
    pub dir: PathBuf,
    pub(crate) pre: bindings::PluginPre<HostState>,
    pub(crate) runtime: Arc<PluginRuntime>,
    pub(crate) memory_bytes: u64,
    pub(crate) mask_deadline: Duration,
    pub(crate) compile_deadline: Duration,
    health: Health,
    /// The strikes counted when it was quarantined (for the message).
    quarantine_strikes: AtomicU32,
    quarantined: AtomicBool,
    quarantine_marker: PathBuf,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.manifest.name)
            .field("sha256", &self.sha256)
            .field("status", &self.status())
            .finish()
    }
}

impl LoadedPlugin {
    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.manifest.name
    }

    /// Whether it serves `kind`.
    pub fn serves(&self, kind: &str) -> bool {
        self.manifest.kinds.iter().any(|k| k == kind)
    }

    /// Ready or quarantined.
    pub fn status(&self) -> PluginStatus {
        if self.quarantined.load(Ordering::Relaxed) { PluginStatus::Quarantined } else { PluginStatus::Ready }
    }

    /// Strikes counted now: distinct constraints with a fault within the strike window.
    pub fn strikes(&self) -> u32 {
        self.health.strikes(self.runtime.config.strike_window)
    }

    /// The linear memory one instance may hold, bytes (the manifest's `memory_mib`, clamped).
    pub fn memory_limit(&self) -> u64 {
        self.memory_bytes
    }

    /// The deadline of one matcher call.
    pub fn mask_deadline(&self) -> Duration {
        self.mask_deadline
    }

    /// The deadline of one compile.
    pub fn compile_deadline(&self) -> Duration {
        self.compile_deadline
    }

    /// Records a fault (a panic, an invalid answer, an `init` trap) under `constraint`;
    /// quarantines the plugin, and records it in the state directory, when faults under
    /// [`RuntimeConfig::strike_limit`] distinct constraints fall within the strike window.
    pub(crate) fn fault(&self, constraint: Option<u64>) {
        let config = &self.runtime.config;
        let n = self.health.fault(constraint, config.strike_window);
        if n >= config.strike_limit && !self.quarantined.swap(true, Ordering::Relaxed) {
            self.quarantine_strikes.store(n, Ordering::Relaxed);
            let _ = std::fs::write(&self.quarantine_marker, format!("{n} strikes\n"));
        }
    }

    /// Refuses `constraint` for the refusal period: it exhausted a resource (see
    /// [`health`](super::health)).
    pub(crate) fn refuse(&self, constraint: u64, reason: String) {
        self.health.refuse(constraint, reason);
    }

    /// Why `constraint` is refused and for how much longer, if it is.
    pub(crate) fn refusal(&self, constraint: u64) -> Option<(String, Duration)> {
        self.health.refusal(constraint, self.runtime.config.refusal_period)
    }

    /// Lifts a quarantine whose record an operator removed from the state directory
    /// (`dspark plugins unquarantine`); returns whether it did.
    pub(crate) fn sync_quarantine_record(&self) -> bool {
        if self.quarantined.load(Ordering::Relaxed) && !self.quarantine_marker.exists() {
            self.health.clear_faults();
            self.quarantined.store(false, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Fails with [`PluginError::Quarantined`] if the plugin is quarantined.
    pub(crate) fn check_not_quarantined(&self) -> Result<(), PluginError> {
        match self.status() {
            PluginStatus::Ready => Ok(()),
            PluginStatus::Quarantined => Err(PluginError::Quarantined {
                plugin: self.manifest.name.clone(),
                strikes: self.quarantine_strikes.load(Ordering::Relaxed),
            }),
        }
    }

    /// Instantiates a fresh Store from the cached `InstancePre` and drops it, without `init`:
    /// the fixed cost of restarting an instance after a trap (benchmarks, health checks).
    pub fn instantiate_bare(&self) -> Result<(), PluginError> {
        let mut store = self.runtime.new_store(self, Arc::new(crate::tokenizer::NoTokenizer));
        self.pre.instantiate(&mut store).map(drop).map_err(|e| PluginError::Setup {
            plugin: self.name().to_string(),
            message: format!("cannot instantiate: {e:#}"),
        })
    }

    /// Instantiates without a tokenizer and asks for the kinds (used at load).
    fn probe_kinds(self: &Arc<Self>) -> anyhow::Result<Vec<String>> {
        let mut store = self.runtime.new_store(self, Arc::new(crate::tokenizer::NoTokenizer));
        let instance = self.pre.instantiate(&mut store).anyhow().context("cannot instantiate the component")?;
        let kinds =
            instance.dspark_constraint_constraint().call_kinds(&mut store).anyhow().context("`kinds` failed")?;
        Ok(kinds)
    }
}

/// The most bytes of a plugin's error or warning message the host keeps: the rest is cut, so a
/// plugin cannot put megabytes into an HTTP error body or a log line.
pub(crate) const MAX_MESSAGE_BYTES: usize = 4096;

/// The most bytes of a plugin's error or warning location the host keeps.
pub(crate) const MAX_LOCATION_BYTES: usize = 512;

/// `text` cut to at most `max` bytes at a character boundary, saying how much was cut.
pub(crate) fn capped(mut text: String, max: usize) -> String {
    if text.len() <= max {
        return text;
    }
    let cut = text.len();
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&format!(" [... {} of {cut} bytes cut]", cut - end));
    text
}

pub(crate) fn wit_error(plugin: &str, e: bindings::dspark::constraint::types::ConstraintError) -> PluginError {
    use bindings::dspark::constraint::types::ErrorCode as W;
    let code = match e.code {
        W::InvalidKind => ErrorCode::InvalidKind,
        W::InvalidSource => ErrorCode::InvalidSource,
        W::InvalidOptions => ErrorCode::InvalidOptions,
        W::Unsupported => ErrorCode::Unsupported,
        W::TooLarge => ErrorCode::TooLarge,
        W::RejectedToken => ErrorCode::RejectedToken,
        W::InvalidState => ErrorCode::InvalidState,
        W::Internal => ErrorCode::Internal,
    };
    PluginError::Constraint {
        plugin: plugin.to_string(),
        error: super::ConstraintError {
            code,
            message: capped(e.message, MAX_MESSAGE_BYTES),
            location: e.location.map(|l| capped(l, MAX_LOCATION_BYTES)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::capped;

    #[test]
    fn capping_keeps_whole_characters_and_says_what_was_cut() {
        assert_eq!(capped("short".to_string(), 5), "short");
        // `€` is three bytes: a cut at 4 falls inside the second one, which goes too.
        assert_eq!(capped("€€€".to_string(), 4), "€ [... 6 of 9 bytes cut]");
    }
}
