//! The CPU backend: candle-core's quantised matrix products, plain Rust for the rest.
//!
//! Weight matrices stay in their GGUF quantisation. Q4_1, Q8_0 and Q5_0 matrices are repacked
//! at load for the kernels of [`super::packed`] (AVX-512 VNNI or AVX2, picked at run time,
//! candle's results bit for bit, several rows per weight read); the other formats are
//! multiplied by candle's kernels (which quantise the activations to 8 bits per block and use
//! AVX2 when the crate is built for x86-64-v3, see `.cargo/config.toml`). Norms, RoPE, the gated activation and residual adds
//! are short loops over row-major f32 slices, parallel over rows for batches and chunks
//! (`for_row_chunks`); paged attention is parallel over (row, head), with rayon.
//!
//! Numerics: attention is computed for every row exactly as candle computes it for a single
//! decoded token (its GEMM kernels' summation orders and softmax reduction on AVX2, see
//! `horizontal_dot`, `lane_dot`, `lane_sum`). So a row's result does not depend on whether it
//! came in a prefill chunk, a fast-forward chunk or a decode step, and with an f32 cache the
//! engine reproduces candle-transformers' quantised models bit for bit. That matters more
//! than it seems: activations are re-quantised to 8 bits before every matrix product, so one
//! rounding difference flips a quantisation step and grows into percent-level logit changes.
//! Quantised products are row-independent for most formats; for Q4_K/Q6_K, and for the dense
//! path large batches take (see [`CpuBackend::dense_min_rows`]), see
//! [`CpuBackend::batch_invariant`].
//!
//! The KV cache is f16 by default: half the memory of f32 (16 sequences x 2,048 tokens of
//! SmolLM2 take 755 MB instead of 1.5 GB). f32 is available for bit-closer agreement with
//! reference implementations that keep f32 keys and values.

use std::sync::Arc;

use anyhow::{anyhow, bail};
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

use super::expf;
use super::packed::{self, Packed};
use super::{AttentionHeads, Backend, ForwardBatch, KvDtype, KvShape, RopeLayout, RopeTable};

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
    F16 { k: Vec<f16>, v: Vec<f16> },
    F32 { k: Vec<f32>, v: Vec<f32> },
}

/// An element type of the KV cache.
trait KvElement: Copy + Send + Sync + simd::Load8 {
    fn load(src: &[Self], dst: &mut [f32]);
    fn store(src: &[f32], dst: &mut [Self]);

    /// `query . key` in the summation order of candle's kernel for one query row (see
    /// [`horizontal_dot`] and [`lane_dot`]); `buffer` is scratch of the key's length.
    fn dot(query: &[f32], key: &[Self], horizontal: bool, buffer: &mut [f32]) -> f32 {
        if simd::AVAILABLE {
            // SAFETY: the build enables AVX2, FMA and F16C (checked by `AVAILABLE`).
            return unsafe { if horizontal { simd::horizontal_dot(query, key) } else { simd::lane_dot(query, key) } };
        }
        Self::load(key, buffer);
        if horizontal { horizontal_dot(query, buffer) } else { lane_dot(query, buffer) }
    }

    /// `out += weight * value`, one fused multiply-add per element.
    fn axpy(weight: f32, value: &[Self], out: &mut [f32], buffer: &mut [f32]) {
        if simd::AVAILABLE {
            // SAFETY: as in `dot`.
            return unsafe { simd::axpy(weight, value, out) };
        }
        Self::load(value, buffer);
        out.iter_mut().zip(buffer.iter()).for_each(|(o, v)| *o = weight.mul_add(*v, *o));
    }
}

impl KvElement for f16 {
    fn load(src: &[f16], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst);
    }
    fn store(src: &[f32], dst: &mut [f16]) {
        dst.convert_from_f32_slice(src);
    }
}

impl KvElement for f32 {
    fn load(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
    fn store(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

/// The CPU backend.
#[derive(Clone, Copy, Debug)]
pub struct CpuBackend {
    /// Multiply rows one at a time where candle's kernel for several rows rounds differently
    /// from its kernel for one (Q4_K, Q6_K), and never use the dense path, so a row's result
    /// never depends on its batch. Costs batch throughput; vLLM calls this batch-invariant mode.
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

/// Formats whose candle kernel for several rows is not the one-row kernel.
fn rows_interact(dtype: GgmlDType) -> bool {
    matches!(dtype, GgmlDType::Q4K | GgmlDType::Q6K)
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
            GgmlDType::Q4_1 | GgmlDType::Q8_0 | GgmlDType::Q5_0 if packed::supported() => {
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
            KvDtype::F32 => LayerKv::F32 { k: vec![0.0; per_layer], v: vec![0.0; per_layer] },
        };
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
        let mut data = if self.batch_invariant && x.rows > 1 && rows_interact(weight.tensor.dtype()) {
            let mut data = Vec::with_capacity(x.rows * out);
            for row in x.data.chunks_exact(x.cols) {
                data.extend(multiply(row)?);
            }
            data
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

    /// The packed kernels compute only the 16-column groups ([`packed::GROUP_COLUMNS`]) in
    /// which a row's mask allows a token; the other columns are `-inf`. The time follows the
    /// groups computed: every fifth group takes about a fifth of the full product's time
    /// (`packed_kernels` bench, `1/5`).
    fn linear_masked(&self, x: &CpuTensor, weight: &CpuMatrix, masks: &[Option<&[u32]>]) -> anyhow::Result<CpuTensor> {
        if let Some(packed) = weight.packed.as_ref()
            && masks.len() == x.rows
            && masks.iter().any(Option::is_some)
        {
            let (out, inner) = weight.tensor.shape().dims2().map_err(candle)?;
            if inner != x.cols {
                bail!("linear: input has {} columns, weight expects {inner}", x.cols);
            }
            let wanted = |row: usize, group: usize| masks[row].is_none_or(|mask| group_allowed(mask, group));
            if let Some(data) = packed.matmul_selected(&x.data, x.rows, &wanted, f32::NEG_INFINITY) {
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
        fn write<T: KvElement>(
            keys: &mut [T],
            values: &mut [T],
            k: &CpuTensor,
            v: &CpuTensor,
            slots: &[u32],
            width: usize,
        ) {
            for (row, &slot) in slots.iter().enumerate() {
                let slot = slot as usize;
                T::store(k.row(row), &mut keys[slot * width..(slot + 1) * width]);
                T::store(v.row(row), &mut values[slot * width..(slot + 1) * width]);
            }
        }
        match &mut cache.layers[layer] {
            LayerKv::F16 { k: keys, v: values } => write(keys, values, k, v, slots, width),
            LayerKv::F32 { k: keys, v: values } => write(keys, values, k, v, slots, width),
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
        let geometry = Geometry { heads, block_size: shape.block_size };
        let data = match &cache.layers[layer] {
            LayerKv::F16 { k, v } => attend(q, k, v, batch, &row_seq, geometry),
            LayerKv::F32 { k, v } => attend(q, k, v, batch, &row_seq, geometry),
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
    let per_chunk = rows.div_ceil(rayon::current_num_threads().max(1) * 2).max(1);
    data.par_chunks_mut(per_chunk * cols).enumerate().for_each(|(i, chunk)| f(i * per_chunk, chunk));
}

#[derive(Clone, Copy)]
struct Geometry {
    heads: AttentionHeads,
    block_size: usize,
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
    let Geometry { heads, block_size } = geometry;
    let head_dim = heads.head_dim;
    let group = heads.heads / heads.kv_heads;
    let kv_width = heads.kv_heads * head_dim;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut out = vec![0f32; q.rows * q.cols];
    out.par_chunks_mut(head_dim).enumerate().for_each_init(
        || (Vec::<f32>::new(), Vec::<usize>::new(), vec![0f32; head_dim]),
        |(scores, offsets, buffer), (index, out)| {
            let (row, head) = (index / heads.heads, index % heads.heads);
            let kv_head = head / group;
            let seq = &batch.seqs[row_seq[row]];
            let keys_seen = batch.positions[row] as usize + 1;
            let query = &q.data[row * q.cols + head * head_dim..][..head_dim];
            // Where each cached position's key and value start, block by block (no division
            // per key).
            offsets.clear();
            for (b, &block) in seq.block_table.iter().enumerate() {
                let first = b * block_size;
                if first >= keys_seen {
                    break;
                }
                let base = block as usize * block_size;
                offsets.extend(
                    (base..base + block_size.min(keys_seen - first)).map(|slot| slot * kv_width + kv_head * head_dim),
                );
            }
            debug_assert!(offsets.iter().all(|&o| o + head_dim <= keys.len()));
            scores.clear();
            // Every row is computed as if it were decoded alone: the same numbers whether it
            // comes in a prefill chunk, a fast-forward chunk or a decode step.
            let horizontal = keys_seen <= HORIZONTAL_MAX_KEYS;
            let mut groups = offsets.chunks_exact(8);
            for eight in &mut groups {
                // SAFETY: the offsets lie in the cache (the block table was checked against it).
                match unsafe { simd::scores8(query, keys, eight, horizontal) } {
                    Some(dots) => scores.extend(dots.iter().map(|d| d * scale)),
                    None => scores.extend(
                        eight.iter().map(|&o| T::dot(query, &keys[o..][..head_dim], horizontal, buffer) * scale),
                    ),
                }
            }
            for &o in groups.remainder() {
                scores.push(T::dot(query, &keys[o..][..head_dim], horizontal, buffer) * scale);
            }
            let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
            for s in scores.iter_mut() {
                *s -= max;
            }
            expf::exp_in_place(scores);
            let total = lane_sum(scores);
            let weighted = scores.iter().zip(offsets.iter()).map(|(&w, &o)| (w / total, &values[o..][..head_dim]));
            // SAFETY: `weighted_sum` checks the build's features and the head size itself.
            if !unsafe { simd::weighted_sum(weighted.clone(), out) } {
                for (weight, value) in weighted {
                    T::axpy(weight, value, out, buffer);
                }
            }
        },
    );
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

        #[inline(always)]
        unsafe fn lanes(v: __m256) -> [f32; 8] {
            let mut out = [0f32; 8];
            // SAFETY: 8 floats of room.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), v) };
            out
        }

        /// [`super::super::horizontal_dot`].
        pub unsafe fn horizontal_dot<T: Load8 + Copy>(a: &[f32], b: &[T]) -> f32 {
            let k = a.len().min(b.len());
            let full = k / 8 * 8;
            // SAFETY: every load reads 8 elements below `full <= k`.
            let mut acc = unsafe {
                let mut acc = _mm256_setzero_ps();
                let mut at = 0;
                while at < full {
                    acc = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(at)), T::load8(b.as_ptr().add(at)), acc);
                    at += 8;
                }
                lanes(acc)
            };
            for at in full..k {
                acc[at % 8] = a[at].mul_add(b[at].to_f32(), acc[at % 8]);
            }
            let x: [f32; 4] = std::array::from_fn(|l| acc[l] + acc[l + 4]);
            (x[0] + x[2]) + (x[1] + x[3])
        }

        /// [`super::super::lane_dot`].
        pub unsafe fn lane_dot<T: Load8 + Copy>(a: &[f32], b: &[T]) -> f32 {
            let k = a.len().min(b.len());
            // SAFETY: `lane_partials` reads below `k` in both.
            let (v, depth) = unsafe { lane_partials(a, b.as_ptr(), k) };
            // SAFETY: 8 floats of room.
            let lanes8 = unsafe { lanes(v) };
            let mut sum = lanes8[0];
            for v in &lanes8[1..] {
                sum += *v;
            }
            for at in depth..k {
                sum = a[at].mul_add(b[at].to_f32(), sum);
            }
            sum
        }

        /// The 8-lane partial sums of `a . b` over the first `k` elements in the order of the
        /// reference's matrix-vector kernel: eight fused accumulators over blocks of 64,
        /// reduced pairwise, then 8-lane blocks; and how far that got (the rest, `k % 8`
        /// elements, is the caller's tail).
        ///
        /// # Safety
        /// `a` and `b` have `k` readable elements.
        #[inline(always)]
        unsafe fn lane_partials<T: Load8>(a: &[f32], b: *const T, k: usize) -> (__m256, usize) {
            let mut depth = 0;
            // SAFETY: every load reads 8 elements below `k`.
            unsafe {
                let mut acc = [_mm256_setzero_ps(); 8];
                while depth + 64 <= k {
                    for (i, v) in acc.iter_mut().enumerate() {
                        let at = depth + 8 * i;
                        *v = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(at)), T::load8(b.add(at)), *v);
                    }
                    depth += 64;
                }
                let pair = |x: usize, y: usize| _mm256_add_ps(acc[x], acc[y]);
                let mut v = _mm256_add_ps(_mm256_add_ps(pair(0, 1), pair(2, 3)), _mm256_add_ps(pair(4, 5), pair(6, 7)));
                while depth + 8 <= k {
                    v = _mm256_fmadd_ps(_mm256_loadu_ps(a.as_ptr().add(depth)), T::load8(b.add(depth)), v);
                    depth += 8;
                }
                (v, depth)
            }
        }

        /// `r` transposed: lane `k` of row `l` of the result is lane `l` of `r[k]`.
        #[inline(always)]
        unsafe fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
            // SAFETY: register shuffles only; the callers run with AVX.
            unsafe {
                let t0 = _mm256_unpacklo_ps(r[0], r[1]);
                let t1 = _mm256_unpackhi_ps(r[0], r[1]);
                let t2 = _mm256_unpacklo_ps(r[2], r[3]);
                let t3 = _mm256_unpackhi_ps(r[2], r[3]);
                let t4 = _mm256_unpacklo_ps(r[4], r[5]);
                let t5 = _mm256_unpackhi_ps(r[4], r[5]);
                let t6 = _mm256_unpacklo_ps(r[6], r[7]);
                let t7 = _mm256_unpackhi_ps(r[6], r[7]);
                let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
                let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
                [
                    _mm256_permute2f128_ps::<0x20>(s0, s4),
                    _mm256_permute2f128_ps::<0x20>(s1, s5),
                    _mm256_permute2f128_ps::<0x20>(s2, s6),
                    _mm256_permute2f128_ps::<0x20>(s3, s7),
                    _mm256_permute2f128_ps::<0x31>(s0, s4),
                    _mm256_permute2f128_ps::<0x31>(s1, s5),
                    _mm256_permute2f128_ps::<0x31>(s2, s6),
                    _mm256_permute2f128_ps::<0x31>(s3, s7),
                ]
            }
        }

        /// [`horizontal_dot`] or [`lane_dot`] of `a` with the eight keys at `offsets` in
        /// `keys`, bit for bit, eight keys at a time: the per-key accumulators are
        /// independent chains, and the final reductions run across keys after a transpose
        /// (lane `k` of every step is key `k`'s scalar step).
        ///
        /// # Safety
        /// `a.len()` is a multiple of 8; every key `keys[o..o + a.len()]` is in bounds.
        pub unsafe fn scores8<T: Load8 + Copy>(a: &[f32], keys: &[T], offsets: &[usize], horizontal: bool) -> [f32; 8] {
            let k = a.len();
            // SAFETY: the caller's promise: every load reads 8 elements inside `a` or a key.
            unsafe {
                let key = |i: usize| keys.as_ptr().add(offsets[i]);
                let reduced = if horizontal {
                    let mut acc = [_mm256_setzero_ps(); 8];
                    let mut at = 0;
                    while at < k {
                        let q = _mm256_loadu_ps(a.as_ptr().add(at));
                        for (i, v) in acc.iter_mut().enumerate() {
                            *v = _mm256_fmadd_ps(q, T::load8(key(i).add(at)), *v);
                        }
                        at += 8;
                    }
                    // Per key: x_l = l_l + l_{l+4}, then (x_0 + x_2) + (x_1 + x_3).
                    let t = transpose8(acc);
                    let x: [__m256; 4] = std::array::from_fn(|l| _mm256_add_ps(t[l], t[l + 4]));
                    _mm256_add_ps(_mm256_add_ps(x[0], x[2]), _mm256_add_ps(x[1], x[3]))
                } else {
                    // `k` is a multiple of 8: the partial sums cover every element.
                    let per_key: [__m256; 8] = std::array::from_fn(|i| lane_partials(a, key(i), k).0);
                    // Per key: the lanes summed in order.
                    let t = transpose8(per_key);
                    let mut sum = t[0];
                    for lane in &t[1..] {
                        sum = _mm256_add_ps(sum, *lane);
                    }
                    sum
                };
                lanes(reduced)
            }
        }

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
    pub use x86::{axpy, horizontal_dot, lane_dot};

    /// The dot products of `a` with the eight keys at `offsets` in `keys`, each exactly as
    /// [`horizontal_dot`] (or [`lane_dot`]) computes it alone; `None` where the build or the
    /// head size (a multiple of 8) does not suit the vector kernel.
    ///
    /// # Safety
    /// Every key `keys[o..o + a.len()]` is in bounds and `offsets` has 8 entries.
    #[inline]
    pub unsafe fn scores8<T: Load8 + Copy>(
        a: &[f32],
        keys: &[T],
        offsets: &[usize],
        horizontal: bool,
    ) -> Option<[f32; 8]> {
        #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
        {
            if !a.len().is_multiple_of(8) || offsets.len() != 8 {
                return None;
            }
            // SAFETY: checked above and the caller's promise.
            Some(unsafe { x86::scores8(a, keys, offsets, horizontal) })
        }
        #[cfg(not(all(
            target_arch = "x86_64",
            target_feature = "avx2",
            target_feature = "fma",
            target_feature = "f16c"
        )))]
        {
            let _ = (a, keys, offsets, horizontal);
            None
        }
    }

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

    #[cfg(not(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")))]
    mod fallback {
        use super::Load8;
        pub unsafe fn horizontal_dot<T: Load8 + Copy>(_: &[f32], _: &[T]) -> f32 {
            unreachable!("AVAILABLE is false")
        }
        pub unsafe fn lane_dot<T: Load8 + Copy>(_: &[f32], _: &[T]) -> f32 {
            unreachable!("AVAILABLE is false")
        }
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
    pub use fallback::{axpy, horizontal_dot, lane_dot};
}

/// Up to this many keys, candle's GEMM computes a single query's scores with its
/// horizontal kernel; beyond, with its matrix-vector kernel.
const HORIZONTAL_MAX_KEYS: usize = 256;

/// A dot product in the order of the reference's horizontal kernel: one fused 8-lane
/// accumulator, then the lanes reduced as `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))`.
fn horizontal_dot(a: &[f32], b: &[f32]) -> f32 {
    let k = a.len().min(b.len());
    let mut acc = [0f32; 8];
    for (at, (x, y)) in a[..k].iter().zip(&b[..k]).enumerate() {
        acc[at % 8] = x.mul_add(*y, acc[at % 8]);
    }
    let x: [f32; 4] = std::array::from_fn(|l| acc[l] + acc[l + 4]);
    (x[0] + x[2]) + (x[1] + x[3])
}

/// A dot product in the order of the reference's matrix-vector kernel (one query row):
/// eight 8-lane fused accumulators over blocks of 64, reduced pairwise, then 8-lane blocks,
/// the lanes summed in order, then the tail.
fn lane_dot(a: &[f32], b: &[f32]) -> f32 {
    let k = a.len().min(b.len());
    let mut depth = 0;
    let mut acc = [[0f32; 8]; 8];
    while depth + 64 <= k {
        for (i, lanes) in acc.iter_mut().enumerate() {
            for (l, v) in lanes.iter_mut().enumerate() {
                let at = depth + 8 * i + l;
                *v = a[at].mul_add(b[at], *v);
            }
        }
        depth += 64;
    }
    let pair = |x: usize, y: usize, l: usize| acc[x][l] + acc[y][l];
    let mut lanes: [f32; 8] =
        std::array::from_fn(|l| (pair(0, 1, l) + pair(2, 3, l)) + (pair(4, 5, l) + pair(6, 7, l)));
    while depth + 8 <= k {
        for (l, v) in lanes.iter_mut().enumerate() {
            *v = a[depth + l].mul_add(b[depth + l], *v);
        }
        depth += 8;
    }
    let mut sum = lanes[0];
    for v in &lanes[1..] {
        sum += v;
    }
    for at in depth..k {
        sum = a[at].mul_add(b[at], sum);
    }
    sum
}

/// Whether `mask` (the plugins' bitset layout) allows a token of column group `group`
/// (columns `16 group..16 group + 16`: half a mask word).
fn group_allowed(mask: &[u32], group: usize) -> bool {
    const PER_WORD: usize = 32 / packed::GROUP_COLUMNS;
    const BITS: u32 = (1u32 << packed::GROUP_COLUMNS) - 1;
    const { assert!(32 % packed::GROUP_COLUMNS == 0) };
    mask.get(group / PER_WORD).is_some_and(|w| (w >> ((group % PER_WORD) * packed::GROUP_COLUMNS)) & BITS != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_allowed_when_its_half_word_has_a_bit() {
        let mask = [1u32 << 17, 1u32 << 15];
        assert!(!group_allowed(&mask, 0), "tokens 0..16");
        assert!(group_allowed(&mask, 1), "token 17");
        assert!(group_allowed(&mask, 2), "token 47");
        assert!(!group_allowed(&mask, 3), "tokens 48..64");
        assert!(!group_allowed(&mask, 4), "past the mask's end");
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The vector attention loops give the scalar loops' results bit for bit, for f32 and f16
    /// caches and lengths with and without tails.
    #[test]
    fn vector_attention_loops_equal_the_scalar_ones() {
        // With the committed build flags (x86-64-v3) `dot` and `axpy` take the vector path;
        // a baseline build compares the scalar loops with themselves.
        for k in [8usize, 13, 64, 72, 130, 200] {
            let q = values(k, k as u32);
            let keys = values(k, 7 * k as u32);
            let halves: Vec<f16> = keys.iter().map(|&v| f16::from_f32(v)).collect();
            let widened: Vec<f32> = halves.iter().map(|h| h.to_f32()).collect();
            let mut buffer = vec![0f32; k];
            for horizontal in [true, false] {
                let scalar = if horizontal { horizontal_dot(&q, &keys) } else { lane_dot(&q, &keys) };
                assert_eq!(f32::dot(&q, &keys, horizontal, &mut buffer).to_bits(), scalar.to_bits(), "f32, k {k}");
                let scalar = if horizontal { horizontal_dot(&q, &widened) } else { lane_dot(&q, &widened) };
                assert_eq!(f16::dot(&q, &halves, horizontal, &mut buffer).to_bits(), scalar.to_bits(), "f16, k {k}");
            }
            if k.is_multiple_of(8) {
                // Eight keys scattered in a cache, as the attention loop reads them.
                let cache = values(k * 20, 3 * k as u32);
                let halves: Vec<f16> = cache.iter().map(|&v| f16::from_f32(v)).collect();
                let offsets: Vec<usize> = [19usize, 0, 7, 3, 12, 4, 18, 9].iter().map(|i| i * k).collect();
                for horizontal in [true, false] {
                    let expect = |key: &[f32]| if horizontal { horizontal_dot(&q, key) } else { lane_dot(&q, key) };
                    if let Some(got) = unsafe { simd::scores8(&q, &cache, &offsets, horizontal) } {
                        for (g, &o) in got.iter().zip(&offsets) {
                            assert_eq!(g.to_bits(), expect(&cache[o..o + k]).to_bits(), "scores8 f32, k {k}");
                        }
                    }
                    if let Some(got) = unsafe { simd::scores8(&q, &halves, &offsets, horizontal) } {
                        for (g, &o) in got.iter().zip(&offsets) {
                            let key: Vec<f32> = halves[o..o + k].iter().map(|h| h.to_f32()).collect();
                            assert_eq!(g.to_bits(), expect(&key).to_bits(), "scores8 f16, k {k}");
                        }
                    }
                }
                assert_eq!(simd::AVAILABLE, unsafe { simd::scores8(&q, &cache, &offsets, true) }.is_some());
            }
            let (mut fast, mut slow) = (q.clone(), q.clone());
            f16::axpy(0.37, &halves, &mut fast, &mut buffer);
            slow.iter_mut().zip(&widened).for_each(|(o, v)| *o = 0.37f32.mul_add(*v, *o));
            assert!(fast.iter().zip(&slow).all(|(a, b)| a.to_bits() == b.to_bits()), "axpy, k {k}");
            if k == 64 {
                let rows: Vec<Vec<f16>> =
                    (0..40).map(|j| values(k, 99 + j).iter().map(|&v| f16::from_f32(v)).collect()).collect();
                let weights = values(40, 5);
                let (mut fast, mut slow) = (q.clone(), q.clone());
                let terms = weights.iter().zip(&rows).map(|(&w, r)| (w, r.as_slice()));
                assert!(unsafe { simd::weighted_sum(terms.clone(), &mut fast) });
                for (w, r) in terms {
                    for (o, v) in slow.iter_mut().zip(r) {
                        *o = w.mul_add(v.to_f32(), *o);
                    }
                }
                assert!(fast.iter().zip(&slow).all(|(a, b)| a.to_bits() == b.to_bits()), "weighted sum");
            }
        }
    }
}
