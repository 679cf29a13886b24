//! [`PluginInstance`]: one Store of a plugin, the calls of the contract through it, and the
//! validation of every answer.

use std::sync::Arc;
use std::time::Duration;

use wasmtime::Store;
use wasmtime::component::ResourceAny;

use super::PluginError;
use super::bindings;
use super::bindings::dspark::constraint::types as wit;
use super::deadline::{self, Stop};
use super::health::{TrapCause, constraint_key};
use super::runtime::{HostState, LoadedPlugin, MAX_LOCATION_BYTES, MAX_MESSAGE_BYTES, capped, wit_error};
use crate::tokenizer::{CanonicalTokenizer, TokenTable};

impl LoadedPlugin {
    /// A new instance given `table` and the canonical tokenizer behind it.
    pub fn instantiate(
        self: &Arc<Self>,
        table: Arc<TokenTable>,
        tokenizer: Arc<dyn CanonicalTokenizer>,
    ) -> Result<PluginInstance, PluginError> {
        self.check_not_quarantined()?;
        PluginInstance::new(self.clone(), table, tokenizer)
    }
}

/// A validated mask: ids are below the vocabulary size, a bitset has the right length.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenMask {
    /// Every token.
    All,
    /// Exactly these ids.
    Allow(Vec<u32>),
    /// The union of half-open ranges.
    Ranges(Vec<(u32, u32)>),
    /// One bit per token, least significant first.
    Bitset(Vec<u32>),
}

impl TokenMask {
    /// Whether `token` is allowed.
    pub fn allows(&self, token: u32) -> bool {
        match self {
            TokenMask::All => true,
            TokenMask::Allow(ids) => ids.contains(&token),
            TokenMask::Ranges(r) => r.iter().any(|&(s, e)| s <= token && token < e),
            TokenMask::Bitset(w) => w.get((token / 32) as usize).is_some_and(|w| w >> (token % 32) & 1 == 1),
        }
    }

    /// The mask as a bitset of `ceil(vocab / 32)` words (the sampler's layout).
    pub fn to_bitset(&self, vocab: usize) -> Vec<u32> {
        let words = vocab.div_ceil(32);
        let mut out = vec![0u32; words];
        let mut set = |t: u32| out[(t / 32) as usize] |= 1 << (t % 32);
        match self {
            TokenMask::All => (0..vocab as u32).for_each(&mut set),
            TokenMask::Allow(ids) => ids.iter().copied().for_each(&mut set),
            TokenMask::Ranges(r) => r.iter().for_each(|&(s, e)| (s..e).for_each(&mut set)),
            TokenMask::Bitset(w) => out.copy_from_slice(w),
        }
        out
    }

    /// How many tokens are allowed out of `vocab`.
    pub fn count(&self, vocab: usize) -> usize {
        self.to_bitset(vocab).iter().map(|w| w.count_ones() as usize).sum()
    }
}

/// A validated commit answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitOutcome {
    /// The forced span that follows (the matcher is already past it).
    pub forced: Vec<u32>,
    /// The sequence must end.
    pub stop: bool,
}

/// A compiled constraint living in one instance.
#[derive(Debug)]
pub struct CompiledHandle {
    res: ResourceAny,
    generation: u64,
    /// The constraint's key for the quarantine policy.
    constraint: u64,
    /// What the plugin could only approximate.
    pub warnings: Vec<(String, String)>,
}

/// A matcher living in one instance.
#[derive(Debug)]
pub struct MatcherHandle {
    res: ResourceAny,
    generation: u64,
    constraint: u64,
}

/// One sandboxed instance of a plugin, initialised with a tokenizer's table.
///
/// Not `Sync`: a Store runs one call at a time. The server keeps a pool of instances per
/// plugin and tokenizer. A trap poisons the Store; the next call restarts it from the plugin's
/// `InstancePre` (and calls `init` again), and older handles become [`PluginError::Stale`].
pub struct PluginInstance {
    plugin: Arc<LoadedPlugin>,
    table: Arc<TokenTable>,
    tokenizer: Arc<dyn CanonicalTokenizer>,
    store: Store<HostState>,
    bindings: bindings::Plugin,
    generation: u64,
    poisoned: bool,
    /// The constraint the running call serves, to which a trap is attributed.
    serving: Option<u64>,
}

impl PluginInstance {
    pub(crate) fn new(
        plugin: Arc<LoadedPlugin>,
        table: Arc<TokenTable>,
        tokenizer: Arc<dyn CanonicalTokenizer>,
    ) -> Result<Self, PluginError> {
        let (store, bindings) = Self::start(&plugin, &table, &tokenizer)?;
        Ok(Self { plugin, table, tokenizer, store, bindings, generation: 0, poisoned: false, serving: None })
    }

    fn start(
        plugin: &Arc<LoadedPlugin>,
        table: &Arc<TokenTable>,
        tokenizer: &Arc<dyn CanonicalTokenizer>,
    ) -> Result<(Store<HostState>, bindings::Plugin), PluginError> {
        let setup = |message: String| PluginError::Setup { plugin: plugin.name().to_string(), message };
        let mut store = plugin.runtime.new_store(plugin, tokenizer.clone());
        let bindings = plugin.pre.instantiate(&mut store).map_err(|e| {
            plugin.fault(None);
            setup(format!("cannot instantiate: {}", describe_trap(&e, &store).0))
        })?;
        let ticks = store.data_mut().deadline.arm(plugin.compile_deadline);
        store.set_epoch_deadline(ticks);
        let init = bindings.dspark_constraint_constraint().call_init(&mut store, &table.to_wit());
        store.data_mut().deadline.disarm();
        match init {
            Ok(Ok(())) => Ok((store, bindings)),
            Ok(Err(e)) => Err(wit_error(plugin.name(), e)),
            Err(trap) => {
                plugin.fault(None);
                Err(setup(format!("init failed: {}", describe_trap(&trap, &store).0)))
            }
        }
    }

    /// The plugin this instance runs.
    pub fn plugin(&self) -> &Arc<LoadedPlugin> {
        &self.plugin
    }

    /// The most linear memory this instance has held, bytes (compare with
    /// [`LoadedPlugin::memory_limit`]).
    pub fn memory_peak(&self) -> u64 {
        self.store.data().limits.peak
    }

    /// The vocabulary size of the instance's table.
    pub fn vocab_size(&self) -> usize {
        self.table.vocab_size()
    }

    /// Restarts a poisoned Store. Called before every compile; matcher calls on a poisoned
    /// instance fail as stale instead (their state is gone).
    fn revive(&mut self) -> Result<(), PluginError> {
        if self.poisoned {
            self.plugin.check_not_quarantined()?;
            let (store, bindings) = Self::start(&self.plugin, &self.table, &self.tokenizer)?;
            self.store = store;
            self.bindings = bindings;
            self.generation += 1;
            self.poisoned = false;
        }
        Ok(())
    }

    /// Checks that a handle belongs to this instance's current Store, and attributes the
    /// calls that follow to its constraint.
    fn enter(&mut self, generation: u64, constraint: u64, what: &'static str) -> Result<(), PluginError> {
        self.serving = Some(constraint);
        if generation != self.generation || self.poisoned {
            return Err(PluginError::Stale { plugin: self.plugin.name().to_string(), what });
        }
        Ok(())
    }

    /// Runs one guest call with `limit` of CPU time. A trap poisons the Store, and is judged
    /// by the [`health`](super::health) policy: an exhausted resource refuses the constraint
    /// being served, anything else is a fault against the plugin.
    fn call<R>(
        &mut self,
        name: &'static str,
        limit: Duration,
        f: impl FnOnce(&mut Store<HostState>, &bindings::Plugin) -> wasmtime::Result<R>,
    ) -> Result<R, PluginError> {
        let ticks = self.store.data_mut().deadline.arm(limit);
        self.store.set_epoch_deadline(ticks);
        let result = f(&mut self.store, &self.bindings);
        self.store.data_mut().deadline.disarm();
        match result {
            Ok(r) => Ok(r),
            Err(trap) => {
                self.poisoned = true;
                let (message, cause) = describe_trap(&trap, &self.store);
                match self.serving {
                    Some(constraint) if cause.is_resource() => self.plugin.refuse(constraint, message.clone()),
                    serving => self.plugin.fault(serving),
                }
                Err(PluginError::Trap { plugin: self.plugin.name().to_string(), call: name, message, cause })
            }
        }
    }

    fn invalid(&self, call: &'static str, message: String) -> PluginError {
        self.plugin.fault(self.serving);
        PluginError::InvalidOutput { plugin: self.plugin.name().to_string(), call, message }
    }

    /// Compiles a constraint.
    pub fn compile(&mut self, kind: &str, source: &str, options: &str) -> Result<CompiledHandle, PluginError> {
        self.plugin.check_not_quarantined()?;
        let constraint = constraint_key(kind, source, options);
        if let Some((reason, left)) = self.plugin.refusal(constraint) {
            return Err(PluginError::Refused { plugin: self.plugin.name().to_string(), reason, left });
        }
        self.serving = Some(constraint);
        self.revive()?;
        let limit = self.plugin.compile_deadline;
        let res = self.call("compile", limit, |s, b| {
            b.dspark_constraint_constraint().compiled().call_compile(s, kind, source, options)
        })?;
        let res = res.map_err(|e| wit_error(self.plugin.name(), e))?;
        let warnings =
            self.call("warnings", limit, |s, b| b.dspark_constraint_constraint().compiled().call_warnings(s, res))?;
        Ok(CompiledHandle { res, generation: self.generation, constraint, warnings: keep_warnings(warnings) })
    }

    /// A matcher at the start of `compiled`.
    pub fn new_matcher(&mut self, compiled: &CompiledHandle) -> Result<MatcherHandle, PluginError> {
        self.enter(compiled.generation, compiled.constraint, "compiled constraint")?;
        let res = self.call("new-matcher", self.plugin.mask_deadline, |s, b| {
            b.dspark_constraint_constraint().compiled().call_new_matcher(s, compiled.res)
        })?;
        Ok(MatcherHandle { res, generation: self.generation, constraint: compiled.constraint })
    }

    /// The allowed tokens, validated against the vocabulary.
    pub fn compute_mask(&mut self, m: &MatcherHandle) -> Result<TokenMask, PluginError> {
        self.enter(m.generation, m.constraint, "matcher")?;
        let mask = self.call("compute-mask", self.plugin.mask_deadline, |s, b| {
            b.dspark_constraint_constraint().matcher().call_compute_mask(s, m.res)
        })?;
        let mask = mask.map_err(|e| wit_error(self.plugin.name(), e))?;
        self.validate_mask(mask)
    }

    fn validate_mask(&self, mask: wit::Mask) -> Result<TokenMask, PluginError> {
        let vocab = self.table.vocab_size();
        let words = vocab.div_ceil(32);
        Ok(match mask {
            wit::Mask::All => TokenMask::All,
            wit::Mask::Allow(ids) => {
                if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                    return Err(self
                        .invalid("compute-mask", format!("token id {bad} is not below the vocabulary size {vocab}")));
                }
                TokenMask::Allow(ids)
            }
            wit::Mask::Ranges(r) => {
                if let Some(bad) = r.iter().find(|r| r.start > r.end || r.end as usize > vocab) {
                    return Err(self.invalid(
                        "compute-mask",
                        format!("range [{}, {}) is not within the vocabulary of {vocab}", bad.start, bad.end),
                    ));
                }
                TokenMask::Ranges(r.into_iter().map(|r| (r.start, r.end)).collect())
            }
            wit::Mask::Bitset(w) => {
                if w.len() != words {
                    return Err(self.invalid(
                        "compute-mask",
                        format!("the bitset has {} words; a vocabulary of {vocab} needs exactly {words}", w.len()),
                    ));
                }
                let tail = vocab % 32;
                if tail != 0 && w[words - 1] >> tail != 0 {
                    return Err(
                        self.invalid("compute-mask", format!("the bitset allows token ids at or above {vocab}"))
                    );
                }
                TokenMask::Bitset(w)
            }
        })
    }

    /// Commits `tokens`; returns the validated forced span and the stop flag.
    pub fn commit(&mut self, m: &MatcherHandle, tokens: &[u32]) -> Result<CommitOutcome, PluginError> {
        self.enter(m.generation, m.constraint, "matcher")?;
        let r = self.call("commit", self.plugin.mask_deadline, |s, b| {
            b.dspark_constraint_constraint().matcher().call_commit(s, m.res, tokens)
        })?;
        let r = r.map_err(|e| wit_error(self.plugin.name(), e))?;
        let cap = self.plugin.runtime.config().max_forced_tokens;
        if r.forced.len() > cap {
            return Err(
                self.invalid("commit", format!("a forced span of {} tokens exceeds the cap of {cap}", r.forced.len()))
            );
        }
        let vocab = self.table.vocab_size();
        if let Some(bad) = r.forced.iter().find(|&&t| t as usize >= vocab) {
            return Err(
                self.invalid("commit", format!("forced token id {bad} is not below the vocabulary size {vocab}"))
            );
        }
        Ok(CommitOutcome { forced: r.forced, stop: r.stop })
    }

    /// Undoes the last `n` tokens.
    pub fn rollback(&mut self, m: &MatcherHandle, n: u32) -> Result<(), PluginError> {
        self.enter(m.generation, m.constraint, "matcher")?;
        let r = self.call("rollback", self.plugin.mask_deadline, |s, b| {
            b.dspark_constraint_constraint().matcher().call_rollback(s, m.res, n)
        })?;
        r.map_err(|e| wit_error(self.plugin.name(), e))
    }

    /// How many draft tokens would be accepted in turn.
    pub fn validate_draft(&mut self, m: &MatcherHandle, tokens: &[u32]) -> Result<u32, PluginError> {
        self.enter(m.generation, m.constraint, "matcher")?;
        let n = self.call("validate-draft", self.plugin.mask_deadline, |s, b| {
            b.dspark_constraint_constraint().matcher().call_validate_draft(s, m.res, tokens)
        })?;
        if n as usize > tokens.len() {
            return Err(self.invalid("validate-draft", format!("accepted {n} of {} draft tokens", tokens.len())));
        }
        Ok(n)
    }

    /// An independent copy of a matcher.
    pub fn fork(&mut self, m: &MatcherHandle) -> Result<MatcherHandle, PluginError> {
        self.enter(m.generation, m.constraint, "matcher")?;
        let res = self.call("fork", self.plugin.mask_deadline, |s, b| {
            b.dspark_constraint_constraint().matcher().call_fork(s, m.res)
        })?;
        Ok(MatcherHandle { res, generation: self.generation, constraint: m.constraint })
    }

    /// Whether the output so far is complete.
    pub fn is_accepting(&mut self, m: &MatcherHandle) -> Result<bool, PluginError> {
        self.enter(m.generation, m.constraint, "matcher")?;
        self.call("is-accepting", self.plugin.mask_deadline, |s, b| {
            b.dspark_constraint_constraint().matcher().call_is_accepting(s, m.res)
        })
    }

    /// Whether the sequence has ended.
    pub fn is_stopped(&mut self, m: &MatcherHandle) -> Result<bool, PluginError> {
        self.enter(m.generation, m.constraint, "matcher")?;
        self.call("is-stopped", self.plugin.mask_deadline, |s, b| {
            b.dspark_constraint_constraint().matcher().call_is_stopped(s, m.res)
        })
    }

    /// The matcher's state key.
    pub fn state_key(&mut self, m: &MatcherHandle) -> Result<u64, PluginError> {
        self.enter(m.generation, m.constraint, "matcher")?;
        self.call("state-key", self.plugin.mask_deadline, |s, b| {
            b.dspark_constraint_constraint().matcher().call_state_key(s, m.res)
        })
    }

    /// Frees a matcher in the guest. Handles of a restarted instance are simply forgotten.
    pub fn drop_matcher(&mut self, m: MatcherHandle) -> Result<(), PluginError> {
        self.serving = Some(m.constraint);
        if m.generation != self.generation || self.poisoned {
            return Ok(());
        }
        self.call("drop-matcher", self.plugin.mask_deadline, |s, _| m.res.resource_drop(s))
    }

    /// Frees a compiled constraint in the guest.
    pub fn drop_compiled(&mut self, c: CompiledHandle) -> Result<(), PluginError> {
        self.serving = Some(c.constraint);
        if c.generation != self.generation || self.poisoned {
            return Ok(());
        }
        self.call("drop-compiled", self.plugin.mask_deadline, |s, _| c.res.resource_drop(s))
    }
}

/// Says what a trap was, in words a plugin author can act on, and what stopped the call.
fn describe_trap(err: &wasmtime::Error, store: &Store<HostState>) -> (String, TrapCause) {
    let stderr = String::from_utf8_lossy(&store.data().stderr.contents()).trim().to_string();
    let stderr = if stderr.is_empty() { String::new() } else { format!(" (plugin stderr: {})", last_line(&stderr)) };
    match err.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => {
            let deadline = &store.data().deadline;
            let limit = deadline.limit();
            let message = match deadline.stopped() {
                Some(Stop::Wall { cpu }) => format!(
                    "did not finish in {} ms of wall-clock time, using {} ms of CPU after its time \
                     limit of {} ms passed: it was waiting, not computing",
                    deadline::wall_limit(limit).as_millis(),
                    cpu.as_millis(),
                    limit.as_millis(),
                ),
                _ => format!("exceeded its time limit of {} ms of CPU time", limit.as_millis()),
            };
            (message, TrapCause::Deadline)
        }
        Some(wasmtime::Trap::StackOverflow) => (format!("overflowed its stack{stderr}"), TrapCause::Stack),
        Some(wasmtime::Trap::UnreachableCodeReached) if !stderr.is_empty() => {
            (format!("panicked{stderr}"), TrapCause::Fault)
        }
        Some(trap) => (format!("trapped: {trap}{stderr}"), TrapCause::Fault),
        None => match store.data().limits.refused {
            Some(asked) => (memory_message(&store.data().limits, asked, &stderr), TrapCause::Memory),
            None => (format!("{err:#}{stderr}"), TrapCause::Fault),
        },
    }
}

/// A memory trap in words that say what to change: the limit, what was asked, and the manifest
/// key to raise (up to the host's maximum).
fn memory_message(limits: &super::runtime::MemoryLimiter, asked: u64, stderr: &str) -> String {
    let mib = |b: u64| b.div_ceil(1 << 20);
    format!(
        "exceeded its memory limit of {} MiB (it asked for {} MiB){stderr}; raise `memory_mib` under \
         `[limits]` in its plugin.toml (this host allows up to {} MiB)",
        mib(limits.limit),
        mib(asked),
        mib(limits.host_max)
    )
}

/// The most warnings of one compile the host keeps.
pub(crate) const MAX_WARNINGS: usize = 64;

/// A compile's warnings as (location, message), each capped, at most [`MAX_WARNINGS`] of them
/// (the last saying how many more there were).
fn keep_warnings(warnings: Vec<wit::Warning>) -> Vec<(String, String)> {
    let total = warnings.len();
    let mut kept: Vec<(String, String)> = warnings
        .into_iter()
        .take(MAX_WARNINGS)
        .map(|w| (capped(w.location, MAX_LOCATION_BYTES), capped(w.message, MAX_MESSAGE_BYTES)))
        .collect();
    if total > MAX_WARNINGS {
        kept.push((String::new(), format!("{} more warnings were left out", total - MAX_WARNINGS)));
    }
    kept
}

/// The useful tail of a guest's stderr: the last lines (a Rust panic prints the location,
/// then the message), without the backtrace hint, cut to 500 bytes.
fn last_line(s: &str) -> String {
    let lines: Vec<&str> =
        s.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("note: run with")).collect();
    capped(lines[lines.len().saturating_sub(2)..].join(" "), 500)
}
