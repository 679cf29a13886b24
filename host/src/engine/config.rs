//! The engine's limits and switches ([`EngineConfig`]) and its counters ([`EngineStats`]).

use super::backend::KvDtype;
use super::draft::PromptLookup;

/// Engine limits. `Default` suits a small model on a CPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineConfig {
    /// Sequences running at once.
    pub max_num_seqs: usize,
    /// Tokens per forward pass (decode tokens, chunks and prefill together).
    pub max_num_batched_tokens: usize,
    /// Longest sequence (prompt plus output); `None` is the model's context length.
    pub max_model_len: Option<usize>,
    /// Token slots per KV block.
    pub block_size: usize,
    /// KV cache capacity in tokens; `None` is `max_num_seqs * max_model_len`, capped by
    /// `kv_cache_max_bytes` (never below one `max_model_len`).
    pub kv_cache_tokens: Option<usize>,
    /// The cap on the default KV cache size.
    pub kv_cache_max_bytes: usize,
    /// Share cached full blocks between sequences with the same prefix.
    pub prefix_caching: bool,
    /// Element type of the KV cache; by default the fastest 2-byte one on this CPU
    /// ([`KvDtype::fastest`]).
    pub kv_cache_dtype: KvDtype,
    /// Compute constraint masks on worker threads while the forward pass runs (DSpark's
    /// overlap). Off, each mask is computed at sampling time, synchronously (the classic
    /// path).
    pub overlap_masks: bool,
    /// With [`Self::overlap_masks`], the output projection waits for the masks and computes
    /// a sampled row's logits only where its mask allows tokens (whole groups of 16 tokens
    /// on the CPU; the rest are `-inf`, as the mask makes them anyway), so outputs are
    /// unchanged; likewise a drafted row's, where the constraint knows the state it leads to
    /// ([`super::SequenceConstraint::masks_after`]). In `dspark bench`'s orders workload the masks
    /// allowed 17-19% of the vocabulary. vLLM and the classic path compute every logit and
    /// mask after.
    pub masked_logits: bool,
    /// Feed constraints' guesses of the next token ahead of sampling (see
    /// `LlmEngine::draft`).
    pub guesses: bool,
    /// Draft the tokens after a sequence's last one by prompt lookup (see
    /// [`super::draft`]); `None` does not.
    pub prompt_lookup: Option<PromptLookup>,
    /// Draft by prompt lookup only in steps that sample at most this many sequences. Its
    /// drafts are drawn about half the time, and on two CPU cores an extra row costs about a
    /// third of a decode step with one sequence running and more once the rows' compute
    /// dominates (`dspark bench`: 1.11-1.17x with one sequence, 0.95-1.07x with two,
    /// 0.80-0.88x with four).
    pub lookup_max_seqs: usize,
    /// Beyond [`Self::lookup_max_seqs`], a sequence still drafts by prompt lookup once this
    /// many of its sampled tokens in a row were each the token lookup proposed (checked
    /// every step without feeding a row); a miss sets the count back to 0. Repetitive text
    /// (a model that loops on `Nine-Nine-Nine-...`, a copied list) is the case: such a
    /// sequence samples every token while its neighbours fast-forward, so in a full batch
    /// it moved at one token per step, slower than beside classic neighbours, and was the
    /// slowest request of a `dspark bench` run. Its drafts are nearly always drawn, and a drawn row is one the batch would
    /// compute in a later step anyway. `None`: never.
    pub confident_lookup_hits: Option<usize>,
    /// Draft at all (guesses, and prompt lookup within [`Self::lookup_max_seqs`]) only in
    /// steps that sample at most this many sequences. A drafted row pays off while a step's
    /// cost is reading the weights; once the rows' compute dominates (on two CPU cores from
    /// about 8 rows: `dspark engine-bench`), a wrong guess costs what a right one saves
    /// (measured with `dspark bench` at concurrency 8: 0.98x-1.01x).
    pub guess_max_seqs: usize,
    /// While an unconstrained sequence is decoding, the most rows beyond one per sequence
    /// that constrained sequences get per step in total: fast-forward chunks (fed over
    /// several steps when they do not fit) and drafts. On this CPU every extra row slows the
    /// whole step (measured with `dspark bench`: unconstrained requests 9-20% slower beside
    /// constrained ones without a limit), so the default, 0, gives an unconstrained
    /// neighbour the steps it would have beside other unconstrained requests; with only
    /// constrained sequences decoding there is no limit. `usize::MAX`: never limited (a GPU,
    /// where a few more rows cost little). See [`super::scheduler`].
    pub extra_rows_beside_plain: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 16,
            max_num_batched_tokens: 512,
            max_model_len: None,
            block_size: 16,
            kv_cache_tokens: None,
            kv_cache_max_bytes: 2 << 30,
            prefix_caching: true,
            kv_cache_dtype: KvDtype::fastest(),
            overlap_masks: true,
            masked_logits: true,
            guesses: true,
            prompt_lookup: None,
            lookup_max_seqs: 1,
            confident_lookup_hits: Some(4),
            guess_max_seqs: 4,
            extra_rows_beside_plain: 0,
        }
    }
}

/// Counters since the engine started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Forward passes.
    pub steps: u64,
    /// Rows fed to those forward passes (prompt chunks, decoded tokens, fast-forward spans,
    /// drafts): with `steps`, the mean batch a step computed.
    pub step_rows: u64,
    /// Nanoseconds in those forward passes (masks computed meanwhile included).
    pub step_ns: u64,
    /// Prompt tokens computed (prefix-cache hits excluded, recomputation included).
    pub prompt_tokens_computed: u64,
    /// Tokens sampled.
    pub sampled_tokens: u64,
    /// Tokens appended by constraints without sampling.
    pub forced_tokens: u64,
    /// Sequences preempted.
    pub preemptions: u64,
    /// Constraint masks computed.
    pub masks: u64,
    /// Nanoseconds sampling waited for masks: all of the mask time when masks are computed
    /// at sampling, only what outlasted the forward pass when they overlap it.
    pub mask_wait_ns: u64,
    /// Drafted tokens fed to the model after a sequence's chunk (guesses and prompt lookup,
    /// see `LlmEngine::draft`).
    pub speculated_tokens: u64,
    /// Drafted tokens that sampling then drew: each saved a step.
    pub speculated_accepted: u64,
    /// Steps times constrained sequences whose fast-forward chunk was cut to the extra rows
    /// allowed beside an unconstrained neighbour ([`EngineConfig::extra_rows_beside_plain`]).
    pub cut_chunks: u64,
    /// Logits rows whose output projection was computed under their mask
    /// ([`EngineConfig::masked_logits`]).
    pub masked_logits_rows: u64,
    /// Of those rows' vocabulary entries, how many their masks allow (the share of the
    /// projection a backend skipping whole disallowed columns could not skip).
    pub masked_logits_allowed: u64,
    /// Those rows' vocabulary entries in all.
    pub masked_logits_vocab: u64,
}
