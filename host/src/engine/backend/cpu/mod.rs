//! The CPU backend: candle-core's quantised matrix products, plain Rust for the rest.
//!
//! Weight matrices stay in their GGUF quantisation. Q4_1, Q8_0 and Q5_0 matrices are repacked
//! at load for the kernels of [`matmul`] (AVX-512 VNNI or AVX2, picked at run time,
//! candle's results bit for bit, several rows per weight read), and Q4_K and Q6_K for those of
//! [`matmul::k_quants`] (candle's repacked tiles, where the shape has them); the other formats are
//! multiplied by candle's kernels (which quantise the activations to 8 bits per block and use
//! AVX2 when the crate is built for x86-64-v3, see `.cargo/config.toml`). Norms, RoPE, the gated activation and residual adds
//! are short loops over row-major f32 slices, parallel over rows for batches and chunks
//! (`for_row_chunks`); paged attention is parallel over (row, head). Every parallel section
//! runs on the backend's worker threads ([`threads`]). The cache
//! keeps each block's keys dimension-major (per kv head `[dim][slot]`) so that the scores
//! are computed a vector lane per key ([`attention::key_lanes`]); values stay row-major, as
//! the weighted sum reads a key's whole head at once.
//!
//! Numerics: attention computes every row as if it were decoded alone, so a row's result
//! does not depend on whether it came in a prefill chunk, a fast-forward chunk or a decode
//! step. With an f32 cache that is exactly how candle computes a single decoded token (its
//! GEMM kernels' summation orders and softmax reduction on AVX2, see
//! [`key_lanes::horizontal_dot`], [`key_lanes::lane_dot`], `lane_sum`), and the engine
//! reproduces candle-transformers' quantised models bit for bit up to the output
//! projection. That matters more than it seems: activations are re-quantised to 8 bits
//! before every matrix product, so one rounding difference flips a quantisation step and
//! grows into percent-level logit changes. The output projection is the exception: nothing
//! re-quantises logits, so it sums in its kernel's fastest order ([`matmul::Packed::logits`];
//! for a Q8_0 table, on AVX-512 VNNI and AVX2 alike, within a few float roundings of
//! candle's logits), and the greedy tokens still match candle's
//! (`tests/tests/engine_models.rs`).
//! An f16 cache rounds the keys and values, so no reference is reproduced bit for bit
//! anyway: its attention runs in the order that costs least, one pass over the sequence with
//! an online softmax, scores and weighted sums in two fused chains ([`attention::f16`];
//! candle's two passes read the values from memory a second time, and its matrix-vector
//! order, which it takes beyond 256 keys, needs twice the vector operations).
//! Quantised products are row-independent for most formats; for Q4_K/Q6_K, and for the dense
//! path large batches take (see [`CpuBackend::dense_min_rows`]), see
//! [`CpuBackend::batch_invariant`].
//!
//! The KV cache holds 2-byte elements by default, half the memory of f32 (16 sequences x
//! 2,048 tokens of SmolLM2 take 755 MB instead of 1.5 GB): bf16 where the CPU has AVX-512
//! BF16 ([`attention::bf16`]: its pair dot products make attention about 1.6x faster
//! than the f16 path's f32 multiply-adds), f16 elsewhere ([`KvDtype::fastest`]). f32 is
//! available for bit-exact agreement with reference implementations that keep f32 keys and
//! values.

use std::sync::Arc;

use anyhow::{anyhow, bail};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use half::f16;
use half::slice::HalfFloatSliceExt;

pub mod attention;
pub mod expf;
pub mod matmul;
pub mod threads;

use super::{AttentionHeads, Backend, ForwardBatch, KvDtype, KvShape, RopeLayout, RopeTable};
use attention::key_lanes::{self, KeyLanes, ScoreOrder};
use attention::{bf16 as bf16_attention, f16 as f16_attention, int8 as int8_attention};
use matmul::Packed;

/// Row-major f32 activations.
#[derive(Clone, Debug, PartialEq)]
pub struct CpuTensor {
    /// Rows (tokens).
    pub rows: usize,
    /// Columns (features).
    pub cols: usize,
    /// `rows * cols` values.
    pub data: Vec<f32>,
}

impl CpuTensor {
    fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }
}

/// A weight matrix: the stored tensor (for embedding lookups) and candle's product over it.
pub struct CpuMatrix {
    tensor: Arc<QTensor>,
    matmul: QMatMul,
    dense: std::sync::OnceLock<QMatMul>,
    /// Q4_1, Q8_0 and Q5_0 weights repacked for the packed kernels, where the CPU runs them.
    packed: Option<Packed>,
}

/// Paged K/V storage of all layers.
pub struct CpuKvCache {
    shape: KvShape,
    layers: Vec<LayerKv>,
}

/// One layer's keys and values, in the cache's element type.
enum LayerKv {
    F16 {
        k: Vec<f16>,
        v: Vec<f16>,
    },
    /// bf16 bits, in [`attention::bf16`]'s paired layout.
    Bf16 {
        k: Vec<u16>,
        v: Vec<u16>,
    },
    F32 {
        k: Vec<f32>,
        v: Vec<f32>,
    },
    /// Bytes and their scales (one per 32 elements), in [`attention::int8`]'s layout.
    Int8 {
        k: Vec<i8>,
        v: Vec<i8>,
        k_scales: Vec<f32>,
        v_scales: Vec<f32>,
    },
}

/// An element type of the KV cache.
trait KvElement: Copy + Send + Sync + simd::Load8 + key_lanes::KeyElement {
    const ZERO: Self;
    fn load(src: &[Self], dst: &mut [f32]);
    fn store(src: &[f32], dst: &mut [Self]);
    /// The order attention sums a score's products in, with `keys` keys in the context.
    fn score_order(keys: usize) -> ScoreOrder;

    /// `out += weight * value`, one fused multiply-add per element.
    fn axpy(weight: f32, value: &[Self], out: &mut [f32], buffer: &mut [f32]) {
        if simd::AVAILABLE {
            // SAFETY: the build enables AVX2, FMA and F16C (checked by `AVAILABLE`).
            return unsafe { simd::axpy(weight, value, out) };
        }
        Self::load(value, buffer);
        out.iter_mut().zip(buffer.iter()).for_each(|(o, v)| *o = weight.mul_add(*v, *o));
    }
}

impl KvElement for f16 {
    const ZERO: f16 = f16::ZERO;
    fn load(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn store(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src);
    }
    /// No reference keeps f16 keys, so none is reproduced bit for bit: the fastest order.
    fn score_order(_: usize) -> ScoreOrder {
        ScoreOrder::TwoChains
    }
}

impl KvElement for f32 {
    const ZERO: f32 = 0.0;
    fn load(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn store(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    /// candle's, so that f32 caches reproduce candle-transformers' models bit for bit.
    fn score_order(keys: usize) -> ScoreOrder {
        ScoreOrder::candle(keys)
    }
}

/// The CPU backend.
#[derive(Clone, Copy, Debug)]
pub struct CpuBackend {
    /// Split Q4_K and Q6_K products into calls that reach one candle kernel whatever the row
    /// count (candle picks its kernel by the number of rows, see `invariant_calls`), and never
    /// use the dense path, so a row's result never depends on its batch. vLLM calls this
    /// batch-invariant mode. It costs the dense path's batch throughput, and a lone Q6_K row
    /// pays for a second copy of itself in the tiles.
    pub batch_invariant: bool,
    /// From this many rows on, multiply with a dense f32 copy of the weights (made on first
    /// use) through candle's f32 GEMM instead of the quantised kernels. The quantised kernels
    /// re-read every weight block for every row, so on a CPU they are compute-bound at about
    /// one row's cost per row; the dense GEMM reuses each weight across rows (prefill 3.6x,
    /// batch 16 1.75x faster on SmolLM2 on 2 cores) at the price of 4 bytes per parameter.
    /// `None` never does.
    pub dense_min_rows: Option<usize>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self { batch_invariant: false, dense_min_rows: Some(DEFAULT_DENSE_MIN_ROWS) }
    }
}

/// The largest matrix given a dense copy. The vocabulary projection is the largest matrix
/// (28M parameters in SmolLM2, 136M in Qwen2.5-0.5B), sees only one row per sampled sequence
/// and would cost the most memory, so it stays quantised.
pub const DENSE_MAX_PARAMS: usize = 16 << 20;

/// Rows from which the dense path pays (measured with `dspark engine-bench`: at 4 rows the
/// f32 weights' bandwidth costs more than the quantised kernels' compute).
pub const DEFAULT_DENSE_MIN_ROWS: usize = 8;

impl CpuBackend {
    /// The default backend (batched and dense kernels).
    pub fn new() -> Self {
        Self::default()
    }

    /// A backend whose results do not depend on batch composition.
    pub fn batch_invariant() -> Self {
        Self { batch_invariant: true, dense_min_rows: None }
    }
}

/// How to split `rows` rows into candle calls so that every row of an `(n, k)` matrix of
/// `dtype` goes through the same candle kernel whatever its batch: call sizes, in order, and
/// whether a lone row must be sent twice.
///
/// candle-core 0.11.1 computes each row of a quantised product on its own (no sum mixes rows),
/// but picks the kernel by the number of rows: on x86-64, Q6_K matrices whose shape fits its
/// repacked tiles (`n % 16 == 0`, `k % 256 == 0`) take the tiles from two rows on and a dot
/// product per column for one row, and Q4_K takes AMX tiles from 32 rows on where the CPU has
/// AMX. So calls of 2 to 31 rows reach one kernel, and a single row is padded with a copy of
/// itself (its result is read from the first copy). Where the tiles do not apply candle uses
/// the same kernel for any count. Other architectures keep one row per call, which is always
/// the one-row kernel. The reference-parity and batch tests on Qwen2.5 (whose down projections
/// are Q4_K and Q6_K) and `invariant_calls_give_each_row_its_result_alone` check the claim.
fn invariant_calls(dtype: GgmlDType, rows: usize, (n, k): (usize, usize)) -> (Vec<usize>, bool) {
    /// The largest call that stays below candle's AMX threshold.
    const MAX_CALL_ROWS: usize = 31;
    if !matches!(dtype, GgmlDType::Q4K | GgmlDType::Q6K) {
        return (vec![rows], false);
    }
    if !cfg!(target_arch = "x86_64") {
        return (vec![1; rows], false);
    }
    let tiled = n % 16 == 0 && k % 256 == 0;
    if rows == 1 {
        return (vec![1], tiled && dtype == GgmlDType::Q6K);
    }
    // Near-equal calls, so none is a lone row.
    let calls = rows.div_ceil(MAX_CALL_ROWS);
    ((0..calls).map(|c| rows * (c + 1) / calls - rows * c / calls).collect(), false)
}

fn candle(e: candle_core::Error) -> anyhow::Error {
    anyhow!("cpu backend: {e}")
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Matrix = CpuMatrix;
    type Vector = Vec<f32>;
    type KvCache = CpuKvCache;

    fn name(&self) -> String {
        "cpu".to_string()
    }

    fn matrix(&self, weight: QTensor) -> anyhow::Result<CpuMatrix> {
        if weight.shape().rank() != 2 {
            bail!("a weight matrix must have two dimensions, got {:?}", weight.shape());
        }
        let packed = match weight.dtype() {
            GgmlDType::Q4_1 | GgmlDType::Q8_0 | GgmlDType::Q5_0 | GgmlDType::Q4K | GgmlDType::Q6K
                if matmul::supported() =>
            {
                let (n, k) = weight.shape().dims2().map_err(candle)?;
                Packed::new(weight.dtype(), &weight.data().map_err(candle)?, n, k)
            }
            _ => None,
        };
        let tensor = Arc::new(weight);
        let matmul = QMatMul::from_arc(tensor.clone()).map_err(candle)?;
        Ok(CpuMatrix { tensor, matmul, dense: std::sync::OnceLock::new(), packed })
    }

    fn vector(&self, weight: QTensor) -> anyhow::Result<Vec<f32>> {
        let tensor = weight.dequantize(&Device::Cpu).map_err(candle)?;
        tensor.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(candle)
    }

    fn kv_cache(&self, shape: KvShape) -> anyhow::Result<CpuKvCache> {
        let per_layer = shape
            .num_blocks
            .checked_mul(shape.block_size)
            .and_then(|s| s.checked_mul(shape.kv_heads * shape.head_dim))
            .ok_or_else(|| anyhow!("KV cache size overflows: {shape:?}"))?;
        let layer = || match shape.dtype {
            KvDtype::F16 => LayerKv::F16 { k: vec![f16::ZERO; per_layer], v: vec![f16::ZERO; per_layer] },
            KvDtype::Bf16 => LayerKv::Bf16 { k: vec![0; per_layer], v: vec![0; per_layer] },
            KvDtype::F32 => LayerKv::F32 { k: vec![0.0; per_layer], v: vec![0.0; per_layer] },
            KvDtype::Int8 => LayerKv::Int8 {
                k: vec![0; per_layer],
                v: vec![0; per_layer],
                k_scales: vec![0.0; per_layer / int8_attention::PART],
                v_scales: vec![0.0; per_layer / int8_attention::PART],
            },
        };
        if shape.dtype == KvDtype::Int8 && !shape.head_dim.is_multiple_of(int8_attention::PART) {
            bail!(
                "an int8 KV cache takes head sizes that are multiples of {}; this model's is {} (use bf16 or f16)",
                int8_attention::PART,
                shape.head_dim
            );
        }
        Ok(CpuKvCache { shape, layers: (0..shape.layers).map(|_| layer()).collect() })
    }

    fn matrix_bytes(&self, matrix: &CpuMatrix) -> usize {
        // The bytes a product reads: the packed copy where the kernel uses it.
        matrix.packed.as_ref().map_or_else(|| matrix.tensor.storage_size_in_bytes(), Packed::bytes)
    }

    fn embed(&self, table: &CpuMatrix, tokens: &[u32]) -> anyhow::Result<CpuTensor> {
        let (vocab, cols) = table.tensor.shape().dims2().map_err(candle)?;
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
            bail!("token id {bad} is outside the vocabulary (size {vocab})");
        }
        let ids = Tensor::new(tokens, &Device::Cpu).map_err(candle)?;
        let rows = table.tensor.embedding(&ids).map_err(candle)?;
        let data = rows.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(candle)?;
        Ok(CpuTensor { rows: tokens.len(), cols, data })
    }

    fn rms_norm(&self, x: &CpuTensor, weight: &Vec<f32>, eps: f32) -> anyhow::Result<CpuTensor> {
        if weight.len() != x.cols {
            bail!("rms_norm: weight has {} values for {} columns", weight.len(), x.cols);
        }
        let mut data = vec![0f32; x.data.len()];
        for_row_chunks(&mut data, x.cols, |first, out| {
            for (r, out) in out.chunks_exact_mut(x.cols).enumerate() {
                let row = x.row(first + r);
                let mean_square = row.iter().map(|v| v * v).sum::<f32>() / x.cols as f32;
                let rms = (mean_square + eps).sqrt();
                out.iter_mut().zip(row.iter().zip(weight)).for_each(|(o, (v, w))| *o = v / rms * w);
            }
        });
        Ok(CpuTensor { rows: x.rows, cols: x.cols, data })
    }

    fn linear(&self, x: &CpuTensor, weight: &CpuMatrix, bias: Option<&Vec<f32>>) -> anyhow::Result<CpuTensor> {
        let (out, inner) = weight.tensor.shape().dims2().map_err(candle)?;
        if inner != x.cols {
            bail!("linear: input has {} columns, weight expects {inner}", x.cols);
        }
        let multiply = |rows: &[f32]| -> anyhow::Result<Vec<f32>> {
            let m = rows.len() / x.cols;
            // The packed kernels: candle's exact results, several rows per weight read,
            // so it also replaces the dense path.
            if let Some(product) = weight.packed.as_ref().and_then(|p| p.matmul(rows, m)) {
                return Ok(product);
            }
            let input = Tensor::from_slice(rows, (m, x.cols), &Device::Cpu).map_err(candle)?;
            let product = match self.dense_min_rows {
                Some(min)
                    if m >= min && !self.batch_invariant && weight.tensor.shape().elem_count() <= DENSE_MAX_PARAMS =>
                {
                    let dense = match weight.dense.get() {
                        Some(d) => d,
                        None => {
                            let w = weight.tensor.dequantize(&Device::Cpu).map_err(candle)?;
                            weight.dense.get_or_init(|| QMatMul::Tensor(w))
                        }
                    };
                    dense.forward(&input).map_err(candle)?
                }
                _ => weight.matmul.forward(&input).map_err(candle)?,
            };
            product.flatten_all().and_then(|t| t.to_vec1::<f32>()).map_err(candle)
        };
        let mut data = if self.batch_invariant && weight.packed.is_none() {
            let (calls, pad_lone_row) = invariant_calls(weight.tensor.dtype(), x.rows, (out, inner));
            if pad_lone_row {
                let mut twice = multiply(&[x.data.as_slice(), x.data.as_slice()].concat())?;
                twice.truncate(out);
                twice
            } else if calls.len() == 1 {
                multiply(&x.data)?
            } else {
                let mut data = Vec::with_capacity(x.rows * out);
                let mut first = 0;
                for rows in calls {
                    data.extend(multiply(&x.data[first * x.cols..(first + rows) * x.cols])?);
                    first += rows;
                }
                data
            }
        } else {
            multiply(&x.data)?
        };
        if let Some(bias) = bias {
            if bias.len() != out {
                bail!("linear: bias has {} values for {out} outputs", bias.len());
            }
            for row in data.chunks_exact_mut(out) {
                row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
            }
        }
        Ok(CpuTensor { rows: x.rows, cols: out, data })
    }

    /// The packed kernels compute only the 16-column groups ([`matmul::GROUP_COLUMNS`]) in
    /// which a row's mask allows a token; the other columns are `-inf`. The time follows the
    /// groups computed: every fifth group takes about a fifth of the full product's time
    /// (`matmul` bench, `1/5`). With or without masks, the sums are taken in the
    /// kernel's logits order ([`Packed::logits`]: Q8_0, as SmolLM2's tied output projection
    /// is, in a third of candle's vector operations with AVX-512 VNNI, 0.7x its time with
    /// AVX2; the same values on both).
    fn linear_masked(&self, x: &CpuTensor, weight: &CpuMatrix, masks: &[Option<&[u32]>]) -> anyhow::Result<CpuTensor> {
        if let Some(packed) = weight.packed.as_ref() {
            let (out, inner) = weight.tensor.shape().dims2().map_err(candle)?;
            if inner != x.cols {
                bail!("linear: input has {} columns, weight expects {inner}", x.cols);
            }
            let masked = masks.len() == x.rows && masks.iter().any(Option::is_some);
            let wanted = |row: usize, group: usize| masks[row].is_none_or(|mask| group_allowed(mask, group));
            let selection: Option<matmul::Selection> = if masked { Some(&wanted) } else { None };
            if let Some(data) = packed.logits(&x.data, x.rows, selection, f32::NEG_INFINITY) {
                return Ok(CpuTensor { rows: x.rows, cols: out, data });
            }
        }
        self.linear(x, weight, None)
    }

    fn linear_many(
        &self,
        x: &CpuTensor,
        weights: &[(&CpuMatrix, Option<&Vec<f32>>)],
    ) -> anyhow::Result<Vec<CpuTensor>> {
        // The packed kernels run all the products in one parallel pass over one quantisation
        // of `x`; each output column is the same sum as alone, so results are unchanged.
        let packed: Option<Vec<&Packed>> = weights.iter().map(|(w, _)| w.packed.as_ref()).collect();
        if let Some(packed) = packed
            && let Some(products) = Packed::matmul_many(&packed, &x.data, x.rows)
        {
            let mut out = Vec::with_capacity(weights.len());
            for ((_, bias), data) in weights.iter().zip(products) {
                let cols = data.len() / x.rows.max(1);
                let mut t = CpuTensor { rows: x.rows, cols, data };
                if let Some(bias) = bias {
                    if bias.len() != cols {
                        bail!("linear: bias has {} values for {cols} outputs", bias.len());
                    }
                    for row in t.data.chunks_exact_mut(cols) {
                        row.iter_mut().zip(bias.iter()).for_each(|(v, b)| *v += b);
                    }
                }
                out.push(t);
            }
            return Ok(out);
        }
        weights.iter().map(|(w, bias)| self.linear(x, w, *bias)).collect()
    }

    fn add_assign(&self, x: &mut CpuTensor, y: &CpuTensor) -> anyhow::Result<()> {
        if (x.rows, x.cols) != (y.rows, y.cols) {
            bail!("add: shapes {}x{} and {}x{} differ", x.rows, x.cols, y.rows, y.cols);
        }
        let cols = x.cols;
        for_row_chunks(&mut x.data, cols, |first, rows| {
            rows.iter_mut().zip(&y.data[first * cols..]).for_each(|(a, b)| *a += b);
        });
        Ok(())
    }

    fn silu_mul(&self, gate: &CpuTensor, up: &CpuTensor) -> anyhow::Result<CpuTensor> {
        if (gate.rows, gate.cols) != (up.rows, up.cols) {
            bail!("silu_mul: shapes differ");
        }
        let cols = gate.cols;
        let mut data = vec![0f32; gate.data.len()];
        for_row_chunks(&mut data, cols, |first, out| {
            // exp(-g) first, in vectors (bit for bit libm's, see `expf`), then the rest.
            let gates = &gate.data[first * cols..][..out.len()];
            out.iter_mut().zip(gates).for_each(|(o, &g)| *o = -g);
            expf::exp_in_place(out);
            let inputs = gates.iter().zip(&up.data[first * cols..]);
            out.iter_mut().zip(inputs).for_each(|(o, (&g, &u))| *o = g / (1.0 + *o) * u);
        });
        Ok(CpuTensor { rows: gate.rows, cols: gate.cols, data })
    }

    fn rope(&self, x: &mut CpuTensor, positions: &[u32], table: &RopeTable) -> anyhow::Result<()> {
        let head_dim = table.head_dim;
        let half = head_dim / 2;
        if positions.len() != x.rows || !x.cols.is_multiple_of(head_dim) {
            bail!("rope: {} positions for {} rows of {} columns", positions.len(), x.rows, x.cols);
        }
        let cols = x.cols;
        if let Some(&p) = positions.iter().find(|&&p| p as usize >= table.max_positions()) {
            bail!("rope: position {p} is beyond the table ({} positions)", table.max_positions());
        }
        for_row_chunks(&mut x.data, cols, |first, rows| {
            for (row, &position) in rows.chunks_exact_mut(cols).zip(&positions[first..]) {
                let p = position as usize;
                let cos = &table.cos[p * half..(p + 1) * half];
                let sin = &table.sin[p * half..(p + 1) * half];
                for head in row.chunks_exact_mut(head_dim) {
                    for i in 0..half {
                        let (a, b) = match table.layout {
                            RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                            RopeLayout::Halves => (i, i + half),
                        };
                        let (x0, x1) = (head[a], head[b]);
                        head[a] = x0 * cos[i] - x1 * sin[i];
                        head[b] = x0 * sin[i] + x1 * cos[i];
                    }
                }
            }
        });
        Ok(())
    }

    fn write_kv(
        &self,
        cache: &mut CpuKvCache,
        layer: usize,
        k: &CpuTensor,
        v: &CpuTensor,
        slots: &[u32],
    ) -> anyhow::Result<()> {
        let shape = cache.shape;
        let width = shape.kv_heads * shape.head_dim;
        let num_slots = shape.num_blocks * shape.block_size;
        if layer >= shape.layers || k.cols != width || v.cols != width || k.rows != slots.len() || v.rows != k.rows {
            bail!("write_kv: shapes do not match the cache {shape:?}");
        }
        if let Some(&slot) = slots.iter().find(|&&s| s as usize >= num_slots) {
            bail!("write_kv: slot {slot} is outside the cache ({num_slots} slots)");
        }
        // Per (block, kv head), contiguous: keys dimension-major (see `attention::key_lanes`), values
        // slot-major.
        fn write<T: KvElement>(
            keys: &mut [T],
            values: &mut [T],
            k: &CpuTensor,
            v: &CpuTensor,
            slots: &[u32],
            shape: KvShape,
        ) {
            let width = shape.kv_heads * shape.head_dim;
            let block_size = shape.block_size;
            let mut key = vec![T::ZERO; width];
            for (row, &slot) in slots.iter().enumerate() {
                let slot = slot as usize;
                let (block, at) = (slot / block_size, slot % block_size);
                T::store(k.row(row), &mut key);
                for (e, &x) in key.iter().enumerate() {
                    keys[(block * width + e) * block_size + at] = x;
                }
                T::store(v.row(row), &mut key);
                for (head, x) in key.chunks_exact(shape.head_dim).enumerate() {
                    let at = ((block * shape.kv_heads + head) * block_size + at) * shape.head_dim;
                    values[at..at + shape.head_dim].copy_from_slice(x);
                }
            }
        }
        match &mut cache.layers[layer] {
            LayerKv::F16 { k: keys, v: values } => write(keys, values, k, v, slots, shape),
            LayerKv::F32 { k: keys, v: values } => write(keys, values, k, v, slots, shape),
            LayerKv::Bf16 { k: keys, v: values } => {
                let (block_size, head_dim) = (shape.block_size, shape.head_dim);
                let (mut key_bits, mut value_bits) = (vec![0u16; width], vec![0u16; width]);
                for (row, &slot) in slots.iter().enumerate() {
                    let slot = slot as usize;
                    let (block, at) = (slot / block_size, slot % block_size);
                    bf16_attention::to_bf16_slice(k.row(row), &mut key_bits);
                    bf16_attention::to_bf16_slice(v.row(row), &mut value_bits);
                    let heads = key_bits.chunks_exact(head_dim).zip(value_bits.chunks_exact(head_dim));
                    for (head, (key, value)) in heads.enumerate() {
                        let start = (block * shape.kv_heads + head) * block_size * head_dim;
                        for (e, (&x, &y)) in key.iter().zip(value).enumerate() {
                            keys[start + bf16_attention::key_index(e, at, block_size)] = x;
                            values[start + bf16_attention::value_index(e, at, head_dim)] = y;
                        }
                    }
                }
            }
            LayerKv::Int8 { k: keys, v: values, k_scales, v_scales } => {
                let (block_size, head_dim) = (shape.block_size, shape.head_dim);
                let parts = width / int8_attention::PART;
                let (mut words, mut scales, mut sums) = (vec![0i32; width / 4], vec![0f32; parts], vec![0i32; parts]);
                // Row `row` of `x` quantised into slot `slot`'s place of `bytes` and `to_scales`.
                let mut store =
                    |x: &CpuTensor, row: usize, slot: usize, bytes: &mut [i8], to_scales: &mut [f32], key: bool| {
                        matmul::quantize_q8(x.row(row), &mut words, &mut scales, &mut sums);
                        let (block, at) = (slot / block_size, slot % block_size);
                        let quantised = words.iter().flat_map(|w| w.to_le_bytes());
                        for (i, byte) in quantised.enumerate() {
                            let (head, e) = (i / head_dim, i % head_dim);
                            let start = (block * shape.kv_heads + head) * block_size * head_dim;
                            let index = if key {
                                int8_attention::key_index(e, at, block_size)
                            } else {
                                int8_attention::value_index(e, at, head_dim)
                            };
                            bytes[start + index] = byte as i8;
                        }
                        let per_head = head_dim / int8_attention::PART;
                        for (i, &scale) in scales.iter().enumerate() {
                            let (head, part) = (i / per_head, i % per_head);
                            let start = (block * shape.kv_heads + head) * block_size * head_dim;
                            to_scales
                                [start / int8_attention::PART + int8_attention::scale_index(part, at, block_size)] =
                                scale;
                        }
                    };
                for (row, &slot) in slots.iter().enumerate() {
                    store(k, row, slot as usize, keys, k_scales, true);
                    store(v, row, slot as usize, values, v_scales, false);
                }
            }
        }
        Ok(())
    }

    fn attention(
        &self,
        q: &CpuTensor,
        cache: &CpuKvCache,
        layer: usize,
        batch: &ForwardBatch,
        heads: AttentionHeads,
    ) -> anyhow::Result<CpuTensor> {
        let shape = cache.shape;
        let head_dim = heads.head_dim;
        if q.cols != heads.heads * head_dim || q.rows != batch.len() || layer >= shape.layers {
            bail!("attention: query shape {}x{} does not match the batch", q.rows, q.cols);
        }
        if heads.kv_heads == 0 || !heads.heads.is_multiple_of(heads.kv_heads) || shape.head_dim != head_dim {
            bail!("attention: {} heads cannot share {} kv heads", heads.heads, heads.kv_heads);
        }
        // Which sequence each row belongs to; every position must be covered by its table.
        let mut row_seq = vec![0usize; q.rows];
        for (s, seq) in batch.seqs.iter().enumerate() {
            for (row, &position) in batch.positions.iter().enumerate().skip(seq.start).take(seq.len) {
                if position as usize >= seq.block_table.len() * shape.block_size {
                    bail!("attention: position {position} is beyond the sequence's blocks");
                }
                row_seq[row] = s;
            }
            if let Some(&block) = seq.block_table.iter().find(|&&b| b as usize >= shape.num_blocks) {
                bail!("attention: block {block} is outside the cache");
            }
        }
        let geometry = Geometry { heads, block_size: shape.block_size, lanes: KeyLanes::detect(shape.block_size) };
        let data = match &cache.layers[layer] {
            LayerKv::F16 { k, v } => attend(q, k, v, batch, &row_seq, geometry),
            LayerKv::F32 { k, v } => attend(q, k, v, batch, &row_seq, geometry),
            LayerKv::Bf16 { k, v } => {
                let (head_dim, block_size) = (heads.head_dim, shape.block_size);
                attend_one_pass(q, k, v, batch, &row_seq, geometry, |queries, starts, seen, scale, out, ahead| {
                    bf16_attention::attend(queries, head_dim, k, v, starts, block_size, seen, scale, out, ahead);
                })
            }
            LayerKv::Int8 { k, v, k_scales, v_scales } => {
                let (head_dim, block_size) = (heads.head_dim, shape.block_size);
                attend_one_pass(q, k, v, batch, &row_seq, geometry, |queries, starts, seen, scale, out, ahead| {
                    int8_attention::attend(
                        queries, head_dim, k, v, k_scales, v_scales, starts, block_size, seen, scale, out, ahead,
                    );
                })
            }
        };
        Ok(CpuTensor { rows: q.rows, cols: q.cols, data })
    }

    fn select_rows(&self, x: &CpuTensor, rows: &[usize]) -> anyhow::Result<CpuTensor> {
        let mut data = Vec::with_capacity(rows.len() * x.cols);
        for &r in rows {
            if r >= x.rows {
                bail!("select_rows: row {r} of {}", x.rows);
            }
            data.extend_from_slice(x.row(r));
        }
        Ok(CpuTensor { rows: rows.len(), cols: x.cols, data })
    }

    fn to_host(&self, x: &CpuTensor) -> anyhow::Result<Vec<f32>> {
        Ok(x.data.clone())
    }

    fn move_to_host(&self, x: CpuTensor) -> anyhow::Result<Vec<f32>> {
        Ok(x.data)
    }
}

/// The environment variable that bounds how long candle's worker threads spin for the next
/// product before they sleep (candle-core's barrier pool; its default is 25,000 rounds).
pub const CANDLE_SPIN_VARIABLE: &str = "CANDLE_BARRIER_POOL_SPIN_LIMIT";

/// The spin bound [`quiet_candle_workers`] sets: a few microseconds, enough to catch the next
/// product of a layer without parking.
pub const CANDLE_SPIN_LIMIT: &str = "100";

/// Stops candle's worker threads from spinning between products, unless the user chose a
/// bound in [`CANDLE_SPIN_VARIABLE`] already.
///
/// candle multiplies the formats and shapes the packed kernels do not take (before
/// [`matmul::k_quants`], Q4_K and Q6_K: the down projections of Qwen2.5's Q4_K_M
/// file) on its own pool, whose workers spin for about half
/// a millisecond after each product. Everything between those products runs on the
/// backend's threads ([`threads`]), so on a 2-core machine the spinning worker took a
/// core from them: `dspark
/// generate` decoded Qwen2.5-0.5B at 33 tokens/s before and 46-48 with this bound
/// (`dspark engine-bench`).
///
/// # Safety
/// Sets an environment variable: call it before the process starts any other thread (at the
/// top of `main`), as [`std::env::set_var`] requires.
pub unsafe fn quiet_candle_workers() {
    if std::env::var_os(CANDLE_SPIN_VARIABLE).is_none() {
        // SAFETY: the caller's promise: no other thread reads the environment yet.
        unsafe { std::env::set_var(CANDLE_SPIN_VARIABLE, CANDLE_SPIN_LIMIT) };
    }
}

/// Below this many values an element-wise pass runs on the calling thread: waking the
/// pool costs more than the work.
const PARALLEL_MIN_VALUES: usize = 8 * 1024;

/// Runs `f(first_row, rows)` over `data` (rows of `cols` values) split into whole-row chunks,
/// one or two per pool thread, in parallel when there is enough work. Every value is computed
/// by the same code whatever the split, so results do not depend on it. The serial passes
/// between matrix products (norms, RoPE, the gated activation, residual adds) otherwise leave
/// one of the threads idle: about a sixth of a 16-row step before.
fn for_row_chunks(data: &mut [f32], cols: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    let rows = data.len() / cols.max(1);
    if rows < 2 || data.len() < PARALLEL_MIN_VALUES {
        f(0, data);
        return;
    }
    let per_chunk = rows.div_ceil(threads::threads().max(1) * 2).max(1);
    threads::for_each_chunk_mut(data, per_chunk * cols, |i, chunk| f(i * per_chunk, chunk));
}

#[derive(Clone, Copy)]
struct Geometry {
    heads: AttentionHeads,
    block_size: usize,
    lanes: KeyLanes,
}

/// How many cache blocks ahead attention asks for keys and values.
const PREFETCH_KV_BLOCKS: usize = 4;

/// Asks the CPU to bring `data` into its caches (a hint; nothing on other targets).
fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let bytes = std::mem::size_of_val(data);
        let base = data.as_ptr().cast::<i8>();
        for line in (0..bytes).step_by(64) {
            // SAFETY: a prefetch of an address inside `data` (it never faults anyway).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(line)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Causal attention of every (row, query head) over its sequence's cached positions:
/// `softmax(q k_j / sqrt(d)) v_j` for `j <= position`, parallel over (row, head).
fn attend<T: KvElement>(
    q: &CpuTensor,
    keys: &[T],
    values: &[T],
    batch: &ForwardBatch,
    row_seq: &[usize],
    geometry: Geometry,
) -> Vec<f32> {
    let Geometry { heads, block_size, lanes } = geometry;
    let head_dim = heads.head_dim;
    let group = heads.heads / heads.kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    // A work item is a row's whole group of query heads over one kv head, so each key and
    // value is read from memory once for the group (and each value widened once); with too
    // few items to keep the pool busy (a single decoded row), one head per item.
    if T::score_order(0) == ScoreOrder::TwoChains {
        return attend_one_pass(
            q,
            keys,
            values,
            batch,
            row_seq,
            geometry,
            |queries, starts, seen, scale, out, ahead| {
                f16_attention::attend(
                    geometry.lanes,
                    queries,
                    head_dim,
                    keys,
                    values,
                    starts,
                    block_size,
                    seen,
                    scale,
                    out,
                    ahead,
                );
            },
        );
    }
    let per_item = if q.rows * heads.kv_heads >= 4 * threads::threads() { group } else { 1 };
    let items_per_row = heads.heads / per_item;
    let mut out = vec![0f32; q.rows * q.cols];
    threads::for_each_chunk_mut(&mut out, head_dim * per_item, |index, out| {
        SCRATCH.with_borrow_mut(|(scores, offsets, buffer)| {
            scores.resize_with(per_item, Vec::new);
            buffer.resize(head_dim, 0.0);
            let (row, first_head) = (index / items_per_row, (index % items_per_row) * per_item);
            let kv_head = first_head / group;
            let seq = &batch.seqs[row_seq[row]];
            let keys_seen = batch.positions[row] as usize + 1;
            let queries = &q.data[row * q.cols + first_head * head_dim..][..per_item * head_dim];
            // Every row is computed as if it were decoded alone: the same numbers whether it
            // comes in a prefill chunk, a fast-forward chunk or a decode step.
            let order = T::score_order(keys_seen);
            let blocks = keys_seen.div_ceil(block_size);
            let per_block = head_dim * block_size;
            let at = |block: u32| (block as usize * heads.kv_heads + kv_head) * per_block;
            // f32, in candle's orders. Block by block: every head's scores from the key-major
            // keys (each key vector loaded once for the group), and where each cached
            // position's value starts.
            scores.iter_mut().for_each(Vec::clear);
            offsets.clear();
            for (b, &block) in seq.block_table[..blocks].iter().enumerate() {
                // The cache is far larger than the CPU's caches at serving contexts (16
                // sequences of 1,024 tokens: 377 MB of SmolLM2 keys and values per step), so
                // ask for the blocks a few ahead while this one is computed.
                if let Some(&ahead) = seq.block_table[..blocks].get(b + PREFETCH_KV_BLOCKS) {
                    prefetch(&keys[at(ahead)..][..per_block]);
                    prefetch(&values[at(ahead)..][..per_block]);
                }
                let n = block_size.min(keys_seen - b * block_size);
                let block_keys = &keys[at(block)..][..per_block];
                key_lanes::append_block_scores(
                    lanes, queries, head_dim, block_keys, block_size, n, order, scale, scores,
                );
                offsets.extend((0..n).map(|slot| at(block) + slot * head_dim));
            }
            for scores in scores.iter_mut() {
                let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
                for s in scores.iter_mut() {
                    *s -= max;
                }
                expf::exp_in_place(scores);
                let total = lane_sum(scores);
                for s in scores.iter_mut() {
                    *s /= total;
                }
            }
            // SAFETY: every offset starts a value of `head_dim` elements inside `values`;
            // `weighted_sum_heads` checks the CPU's features and the sizes itself.
            if lanes != KeyLanes::Scalar && unsafe { simd::weighted_sum_heads(scores, offsets, values, out) } {
                return;
            }
            for (scores, out) in scores.iter().zip(out.chunks_exact_mut(head_dim)) {
                let weighted = scores.iter().zip(offsets.iter()).map(|(&w, &o)| (w, &values[o..][..head_dim]));
                // SAFETY: `weighted_sum` checks the build's features and the head size itself.
                if !unsafe { simd::weighted_sum(weighted.clone(), out) } {
                    for (weight, value) in weighted {
                        T::axpy(weight, value, out, buffer);
                    }
                }
            }
        })
    });
    out
}

/// [`attend`]'s scratch for one work item: scores per head, value offsets, a widened value.
type AttendScratch = (Vec<Vec<f32>>, Vec<usize>, Vec<f32>);

thread_local! {
    /// [`attend`]'s scratch on each thread, kept from item to item.
    static SCRATCH: std::cell::RefCell<AttendScratch> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new()))
    };
}

/// At most this many rows of one sequence share an attention work item: their queries and
/// running sums (1.5 KB a row for a group of 3 heads) stay in L1 beside a run's keys and
/// values.
const SPAN_ROWS: usize = 16;

/// [`attend`] for f16 and bf16 caches: scores, softmax and weighted sums in one pass
/// ([`online_attention`], [`attention::bf16`]). A work item is a span of consecutive rows of
/// one sequence at consecutive positions (a prefill chunk, a fast-forward span, a draft; a
/// decoded row alone) over one kv head's group of query heads, so the span's rows read each
/// key and value from memory once. Every row still gets exactly the numbers it would get
/// decoded alone. `kernel(queries, starts, seen, scale, out, ahead)` is the cache type's
/// `attend` over `keys` and `values`: the span's queries of the item's heads, where the
/// sequence's blocks of the kv head start, each row's key count, and the prefetch of a block.
fn attend_one_pass<E: Sync>(
    q: &CpuTensor,
    keys: &[E],
    values: &[E],
    batch: &ForwardBatch,
    row_seq: &[usize],
    geometry: Geometry,
    kernel: impl Fn(&[f32], &[usize], &[usize], f32, &mut [f32], &dyn Fn(usize)) + Sync,
) -> Vec<f32> {
    let heads = geometry.heads;
    let head_dim = heads.head_dim;
    let group = heads.heads / heads.kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut spans: Vec<std::ops::Range<usize>> = Vec::new();
    for row in 0..q.rows {
        match spans.last_mut() {
            Some(span)
                if span.len() < SPAN_ROWS
                    && row_seq[span.start] == row_seq[row]
                    && batch.positions[row] == batch.positions[row - 1] + 1 =>
            {
                span.end = row + 1
            }
            _ => spans.push(row..row + 1),
        }
    }
    // Whole head groups per item where there are enough items to keep the pool busy. Short
    // of that, spans of several rows (one sequence's fast-forward span or draft, decoded
    // alone) are cut into shorter spans, still a head group each: a group reads each key and
    // value once for its heads and keeps its dot-product chains busy, where one head per
    // item waits on their latency (the `attention` bench, one thread, min ns per row, head
    // and key at 1,024 keys: 3 heads 3.8-4.9, 1 head 5.5-8.0 with the keys and values in the
    // cache). A single decoded row cuts its groups into pieces instead ([`group_pieces`]), so
    // every thread has the same work.
    let threads = threads::threads();
    let pieces = if spans.len() * heads.kv_heads >= 4 * threads {
        1
    } else {
        let rows: usize = spans.iter().map(|s| s.len()).sum();
        let wanted = (2 * threads).div_ceil(heads.kv_heads);
        if rows < wanted {
            group_pieces(heads.kv_heads, group, threads)
        } else {
            if spans.len() < wanted {
                spans = split_spans(&spans, wanted);
            }
            1
        }
    };
    // Item `index`: span `index / per_span`, then kv head and piece of its group.
    let per_piece = group.div_ceil(pieces);
    let per_span = heads.kv_heads * pieces;
    let item_heads = |index: usize| {
        let (kv_head, piece) = ((index % per_span) / pieces, index % pieces);
        let first = piece * per_piece;
        (kv_head, kv_head * group + first, per_piece.min(group - first))
    };
    let per_block = head_dim * geometry.block_size;
    let mut outputs: Vec<Vec<f32>> = vec![Vec::new(); spans.len() * per_span];
    threads::for_each_mut(&mut outputs, |index, output| {
        ONE_PASS_SCRATCH.with_borrow_mut(|(queries, seen, starts)| {
            let span = &spans[index / per_span];
            let (kv_head, first_head, count) = item_heads(index);
            let seq = &batch.seqs[row_seq[span.start]];
            queries.clear();
            seen.clear();
            for row in span.clone() {
                queries.extend_from_slice(&q.data[row * q.cols + first_head * head_dim..][..count * head_dim]);
                seen.push(batch.positions[row] as usize + 1);
            }
            let blocks = seen[seen.len() - 1].div_ceil(geometry.block_size);
            starts.clear();
            starts.extend(
                seq.block_table[..blocks].iter().map(|&block| (block as usize * heads.kv_heads + kv_head) * per_block),
            );
            let ahead = |b: usize| {
                prefetch(&keys[starts[b]..][..per_block]);
                prefetch(&values[starts[b]..][..per_block]);
            };
            let mut out = vec![0f32; queries.len()];
            kernel(queries, starts, seen, scale, &mut out, &ahead);
            *output = out;
        })
    });
    let mut out = vec![0f32; q.rows * q.cols];
    for (index, item) in outputs.iter().enumerate() {
        let (_, first_head, count) = item_heads(index);
        for (row, item) in spans[index / per_span].clone().zip(item.chunks(count * head_dim)) {
            out[row * q.cols + first_head * head_dim..][..count * head_dim].copy_from_slice(item);
        }
    }
    out
}

thread_local! {
    /// [`attend_one_pass`]'s scratch on each thread: an item's queries, each row's key count,
    /// where each block starts.
    static ONE_PASS_SCRATCH: std::cell::RefCell<(Vec<f32>, Vec<usize>, Vec<usize>)> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new()))
    };
}

/// Into how many pieces a single row's attention cuts each kv head's group of query heads:
/// the fewest that give every thread the same number of items (or at least two each), so no
/// thread waits on another. A piece of several heads reads each key and value once for all of
/// them and keeps more dot-product chains going than one head alone.
fn group_pieces(kv_heads: usize, group: usize, threads: usize) -> usize {
    (1..group)
        .find(|&pieces| (kv_heads * pieces).is_multiple_of(threads) || kv_heads * pieces >= 2 * threads)
        .unwrap_or(group)
}

/// `spans` cut into at least `wanted` spans where their rows allow (at most one span per
/// row), each cut as evenly as its share of the pieces.
fn split_spans(spans: &[std::ops::Range<usize>], wanted: usize) -> Vec<std::ops::Range<usize>> {
    let rows: usize = spans.iter().map(|s| s.len()).sum();
    let mut out = Vec::with_capacity(wanted.max(spans.len()));
    for span in spans {
        // This span's share of the pieces, by its rows (at least one, at most its rows).
        let pieces = (span.len() * wanted).div_ceil(rows).clamp(1, span.len());
        let (len, extra) = (span.len() / pieces, span.len() % pieces);
        let mut start = span.start;
        for piece in 0..pieces {
            let end = start + len + usize::from(piece < extra);
            out.push(start..end);
            start = end;
        }
    }
    out
}

/// The sum of `xs` in the order of candle's AVX reduction (four 8-lane accumulators over
/// blocks of 32, reduced pairwise, then the tail in order), so softmax denominators round
/// exactly as the reference's do.
fn lane_sum(xs: &[f32]) -> f32 {
    let blocks = xs.len() / 32 * 32;
    let mut acc = [[0f32; 8]; 4];
    for block in xs[..blocks].chunks_exact(32) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, a) in lanes.iter_mut().enumerate() {
                *a += block[j * 8 + l];
            }
        }
    }
    let x: [f32; 8] = std::array::from_fn(|l| (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]));
    let t: [f32; 4] = std::array::from_fn(|l| x[l] + x[l + 4]);
    let mut sum = (t[0] + t[1]) + (t[2] + t[3]);
    for &v in &xs[blocks..] {
        sum += v;
    }
    sum
}

/// AVX2 versions of the attention loops, bit-identical to the scalar ones (the same fused
/// multiply-adds lane by lane, the same reductions): the scalar loops do not vectorise and
/// attention over long contexts dominated serving steps.
mod simd {
    use half::f16;

    use super::key_lanes::KeyElement;

    /// Whether the build can run the vector versions (x86-64-v3, see `.cargo/config.toml`).
    pub const AVAILABLE: bool =
        cfg!(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"));

    /// Eight cache elements as f32.
    pub trait Load8: Sized {
        /// # Safety
        /// `src` has at least 8 readable elements; the CPU has AVX2 and F16C.
        #[cfg(target_arch = "x86_64")]
        unsafe fn load8(src: *const Self) -> std::arch::x86_64::__m256;
        /// One element as f32.
        fn to_f32(self) -> f32;
    }

    impl Load8 for f32 {
        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        unsafe fn load8(src: *const f32) -> std::arch::x86_64::__m256 {
            // SAFETY: the caller guarantees 8 readable values.
            unsafe { std::arch::x86_64::_mm256_loadu_ps(src) }
        }
        fn to_f32(self) -> f32 {
            self
        }
    }

    impl Load8 for f16 {
        #[cfg(target_arch = "x86_64")]
        #[inline(always)]
        unsafe fn load8(src: *const f16) -> std::arch::x86_64::__m256 {
            use std::arch::x86_64::*;
            // SAFETY: the caller guarantees 8 readable halves and F16C.
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(src.cast())) }
        }
        fn to_f32(self) -> f32 {
            f16::to_f32(self)
        }
    }

    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    mod x86 {
        use super::Load8;
        use std::arch::x86_64::*;

        /// `out += sum weight * value` over `N` vectors of 8, `out` in registers.
        #[inline(always)]
        pub unsafe fn weighted_sum<'a, T: Load8 + Copy + 'a, const N: usize>(
            terms: impl Iterator<Item = (f32, &'a [T])>,
            out: &mut [f32],
        ) {
            // SAFETY: `out` has 8N elements and so has every value (the caller's promise).
            unsafe {
                let mut acc: [__m256; N] = std::array::from_fn(|i| _mm256_loadu_ps(out.as_ptr().add(8 * i)));
                for (weight, value) in terms {
                    let w = _mm256_set1_ps(weight);
                    for (i, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(w, T::load8(value.as_ptr().add(8 * i)), *a);
                    }
                }
                for (i, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(out.as_mut_ptr().add(8 * i), *a);
                }
            }
        }

        /// `out += weight * value`.
        pub unsafe fn axpy<T: Load8 + Copy>(weight: f32, value: &[T], out: &mut [f32]) {
            let k = out.len().min(value.len());
            let full = k / 8 * 8;
            // SAFETY: every access covers 8 elements below `full <= k`.
            unsafe {
                let w = _mm256_set1_ps(weight);
                let mut at = 0;
                while at < full {
                    let o = out.as_mut_ptr().add(at);
                    _mm256_storeu_ps(o, _mm256_fmadd_ps(w, T::load8(value.as_ptr().add(at)), _mm256_loadu_ps(o)));
                    at += 8;
                }
            }
            for at in full..k {
                out[at] = weight.mul_add(value[at].to_f32(), out[at]);
            }
        }
    }

    #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
    pub use x86::axpy;

    /// `out += sum_j weight_j * value_j`, in key order per element (the same fused
    /// multiply-adds as [`axpy`] key by key), with `out` held in registers across the keys.
    /// Returns false, doing nothing, where the build or the head size does not suit it
    /// (head sizes 32, 64, 96, 128).
    ///
    /// # Safety
    /// Every value has `out.len()` elements.
    pub unsafe fn weighted_sum<'a, T: Load8 + Copy + 'a>(
        terms: impl Iterator<Item = (f32, &'a [T])>,
        out: &mut [f32],
    ) -> bool {
        #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
        {
            // SAFETY: the caller's promise, and the build's features.
            unsafe {
                match out.len() {
                    32 => x86::weighted_sum::<T, 4>(terms, out),
                    64 => x86::weighted_sum::<T, 8>(terms, out),
                    96 => x86::weighted_sum::<T, 12>(terms, out),
                    128 => x86::weighted_sum::<T, 16>(terms, out),
                    _ => return false,
                }
            }
            true
        }
        #[cfg(not(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        )))]
        {
            let _ = (terms, out);
            false
        }
    }

    /// `out[h] += sum_j weights[h][j] * values[offsets[j]..]` for every head `h` of a group
    /// (`out` holds the heads one after the other), each element in key order with one fused
    /// multiply-add per key, as [`weighted_sum`] computes each head alone; but each value is
    /// loaded and widened once for several heads: up to four in 16-lane vectors with AVX-512
    /// F; with AVX2, three heads over 16 elements at a time (or two over 32, or one over 64),
    /// so the accumulators, the value's vectors and the weights fit the 16 registers. Returns
    /// false, doing nothing, where the CPU lacks AVX2 or the head size is not 64 or 128.
    ///
    /// # Safety
    /// Every `offsets[j] + out.len() / weights.len()` is within `values`; every
    /// `weights[h]` has `offsets.len()` entries.
    pub unsafe fn weighted_sum_heads<T: KeyElement>(
        weights: &[Vec<f32>],
        offsets: &[usize],
        values: &[T],
        out: &mut [f32],
    ) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if weights.is_empty() {
                return false;
            }
            let head_dim = out.len() / weights.len();
            if head_dim != 64 && head_dim != 128 {
                return false;
            }
            if has!("avx512f") {
                for (weights, out) in weights.chunks(4).zip(out.chunks_mut(4 * head_dim)) {
                    // SAFETY: the caller's promise; AVX-512 F checked above.
                    unsafe {
                        match (weights.len(), head_dim) {
                            (1, 64) => heads_avx512::<T, 1, 4>(weights, offsets, values, out),
                            (2, 64) => heads_avx512::<T, 2, 4>(weights, offsets, values, out),
                            (3, 64) => heads_avx512::<T, 3, 4>(weights, offsets, values, out),
                            (4, 64) => heads_avx512::<T, 4, 4>(weights, offsets, values, out),
                            (1, _) => heads_avx512::<T, 1, 8>(weights, offsets, values, out),
                            (2, _) => heads_avx512::<T, 2, 8>(weights, offsets, values, out),
                            (3, _) => heads_avx512::<T, 3, 8>(weights, offsets, values, out),
                            _ => heads_avx512::<T, 4, 8>(weights, offsets, values, out),
                        }
                    }
                }
                return true;
            }
            if !(has!("avx2") && has!("fma") && has!("f16c")) {
                return false;
            }
            for (weights, out) in weights.chunks(3).zip(out.chunks_mut(3 * head_dim)) {
                // SAFETY: the caller's promise; AVX2, FMA and F16C checked above.
                unsafe {
                    match weights.len() {
                        1 => heads_avx2::<T, 1, 8>(weights, offsets, values, out),
                        2 => heads_avx2::<T, 2, 4>(weights, offsets, values, out),
                        _ => heads_avx2::<T, 3, 2>(weights, offsets, values, out),
                    }
                }
            }
            true
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (weights, offsets, values, out);
            false
        }
    }

    /// [`weighted_sum_heads`] with AVX2 for `H` heads, `8 S` elements of each at a time (the
    /// head size a multiple of `8 S`), key by key, the accumulators in registers.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn heads_avx2<T: KeyElement, const H: usize, const S: usize>(
        weights: &[Vec<f32>],
        offsets: &[usize],
        values: &[T],
        out: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        let head_dim = out.len() / H;
        debug_assert!(weights.len() == H && head_dim.is_multiple_of(8 * S));
        let weights: [&[f32]; H] = std::array::from_fn(|h| &weights[h][..offsets.len()]);
        // SAFETY: `out` has `H * head_dim` elements; the caller's promise for the values;
        // `j < offsets.len()`, the length of every `weights[h]`.
        unsafe {
            for slice in (0..head_dim).step_by(8 * S) {
                let at = |h: usize, s: usize| h * head_dim + slice + 8 * s;
                let mut acc: [[__m256; S]; H] =
                    std::array::from_fn(|h| std::array::from_fn(|s| _mm256_loadu_ps(out.as_ptr().add(at(h, s)))));
                for (j, &o) in offsets.iter().enumerate() {
                    let value: [__m256; S] = std::array::from_fn(|s| T::load8(values.as_ptr().add(o + slice + 8 * s)));
                    for (acc, weights) in acc.iter_mut().zip(&weights) {
                        let w = _mm256_set1_ps(*weights.get_unchecked(j));
                        for (a, x) in acc.iter_mut().zip(&value) {
                            *a = _mm256_fmadd_ps(w, *x, *a);
                        }
                    }
                }
                for (h, acc) in acc.iter().enumerate() {
                    for (s, a) in acc.iter().enumerate() {
                        _mm256_storeu_ps(out.as_mut_ptr().add(at(h, s)), *a);
                    }
                }
            }
        }
    }

    /// [`weighted_sum_heads`] for `H` heads of `16 V` elements, the accumulators in registers.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn heads_avx512<T: KeyElement, const H: usize, const V: usize>(
        weights: &[Vec<f32>],
        offsets: &[usize],
        values: &[T],
        out: &mut [f32],
    ) {
        use std::arch::x86_64::*;
        let head_dim = 16 * V;
        debug_assert!(weights.len() == H && out.len() == H * head_dim);
        // SAFETY: `out` has `H * head_dim` elements; the caller's promise for the values.
        unsafe {
            let mut acc: [[__m512; V]; H] = std::array::from_fn(|h| {
                std::array::from_fn(|v| _mm512_loadu_ps(out.as_ptr().add(h * head_dim + 16 * v)))
            });
            for (j, &o) in offsets.iter().enumerate() {
                let value: [__m512; V] = std::array::from_fn(|v| T::load16(values.as_ptr().add(o + 16 * v)));
                for (h, acc) in acc.iter_mut().enumerate() {
                    let w = _mm512_set1_ps(*weights[h].get_unchecked(j));
                    for (a, x) in acc.iter_mut().zip(&value) {
                        *a = _mm512_fmadd_ps(w, *x, *a);
                    }
                }
            }
            for (h, acc) in acc.iter().enumerate() {
                for (v, a) in acc.iter().enumerate() {
                    _mm512_storeu_ps(out.as_mut_ptr().add(h * head_dim + 16 * v), *a);
                }
            }
        }
    }

    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    mod fallback {
        use super::Load8;
        pub unsafe fn axpy<T: Load8 + Copy>(_: f32, _: &[T], _: &mut [f32]) {
            unreachable!("AVAILABLE is false")
        }
    }
    #[cfg(not(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma",
        target_feature = "f16c"
    )))]
    pub use fallback::axpy;
}

/// Whether `mask` (the plugins' bitset layout) allows a token of column group `group`
/// (columns `16 group..16 group + 16`: half a mask word).
fn group_allowed(mask: &[u32], group: usize) -> bool {
    const PER_WORD: usize = 32 / matmul::GROUP_COLUMNS;
    const BITS: u32 = (1u32 << matmul::GROUP_COLUMNS) - 1;
    const { assert!(32 % matmul::GROUP_COLUMNS == 0) };
    mask.get(group / PER_WORD).is_some_and(|w| (w >> ((group % PER_WORD) * matmul::GROUP_COLUMNS)) & BITS != 0)
}

#[cfg(test)]
mod tests;
