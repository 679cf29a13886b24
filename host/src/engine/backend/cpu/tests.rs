//! The CPU backend's ops against candle's and against plain scalar references.

use super::*;
use crate::engine::backend::test_values as values;

/// Spans are cut into shorter ones that cover the same rows in order, as many as wanted
/// where the rows allow, each span's pieces within one row of each other in length.
#[test]
#[allow(clippy::single_range_in_vec_init)] // a list of one span is meant
fn spans_are_cut_into_the_pieces_wanted() {
    assert_eq!(split_spans(&[0..4], 2), vec![0..2, 2..4]);
    assert_eq!(split_spans(&[0..5], 2), vec![0..3, 3..5]);
    assert_eq!(split_spans(&[0..2], 3), vec![0..1, 1..2], "at most one piece per row");
    assert_eq!(split_spans(&[0..1, 1..7], 4), vec![0..1, 1..3, 3..5, 5..6, 6..7], "shares rounded up");
    for (spans, wanted) in [(vec![0..16], 3), (vec![0..3, 3..4, 4..13], 5), (vec![0..9, 9..10], 8)] {
        let cut = split_spans(&spans, wanted);
        let rows: Vec<usize> = cut.iter().flat_map(|s| s.clone()).collect();
        assert_eq!(rows, (0..spans.last().unwrap().end).collect::<Vec<_>>(), "{spans:?}");
        assert!(cut.len() >= wanted.min(rows.len()), "{spans:?} into {wanted}: {cut:?}");
        assert!(cut.iter().all(|s| !s.is_empty() && spans.iter().any(|o| o.start <= s.start && s.end <= o.end)));
    }
}

/// A single row's groups are cut so every thread gets as many items: SmolLM2's 3 kv heads
/// of 3 on 2 threads in halves (6 items), Qwen2.5's 2 of 7 whole, one head per item only
/// where nothing fewer balances.
#[test]
fn a_single_rows_groups_are_cut_into_balanced_pieces() {
    assert_eq!(group_pieces(3, 3, 2), 2);
    assert_eq!(group_pieces(2, 7, 2), 1);
    assert_eq!(group_pieces(3, 3, 1), 1);
    assert_eq!(group_pieces(8, 4, 16), 2);
    assert_eq!(group_pieces(1, 3, 5), 3, "no cut balances: one head per item");
    assert_eq!(group_pieces(4, 1, 3), 1, "one head per group already");
}

#[test]
fn a_group_is_allowed_when_its_half_word_has_a_bit() {
    let mask = [1u32 << 17, 1u32 << 15];
    assert!(!group_allowed(&mask, 0), "tokens 0..16");
    assert!(group_allowed(&mask, 1), "token 17");
    assert!(group_allowed(&mask, 2), "token 47");
    assert!(!group_allowed(&mask, 3), "tokens 48..64");
    assert!(!group_allowed(&mask, 4), "past the mask's end");
}

/// Under `batch_invariant`, every row of a Q4_K or Q6_K product equals the same row
/// multiplied alone, bit for bit, at row counts on both sides of candle's kernel switches
/// (one row, 32 rows) and for shapes with and without candle's repacked tiles.
#[test]
fn invariant_calls_give_each_row_its_result_alone() {
    let backend = CpuBackend::batch_invariant();
    for dtype in [GgmlDType::Q4K, GgmlDType::Q6K] {
        for (n, k) in [(32usize, 512usize), (20, 512)] {
            let w = Tensor::from_vec(values(n * k, 3), (n, k), &Device::Cpu).unwrap();
            let weight = backend.matrix(QTensor::quantize(&w, dtype).unwrap()).unwrap();
            let x = values(40 * k, 9);
            let alone: Vec<Vec<f32>> = x
                .chunks_exact(k)
                .map(|row| {
                    let one = CpuTensor { rows: 1, cols: k, data: row.to_vec() };
                    backend.linear(&one, &weight, None).unwrap().data
                })
                .collect();
            for rows in [2usize, 3, 31, 32, 33, 40] {
                let batch = CpuTensor { rows, cols: k, data: x[..rows * k].to_vec() };
                let got = backend.linear(&batch, &weight, None).unwrap();
                for (r, want) in alone.iter().take(rows).enumerate() {
                    let row = &got.data[r * n..(r + 1) * n];
                    assert!(
                        row.iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{dtype:?} {n}x{k}: row {r} of {rows} differs from the row alone"
                    );
                }
            }
            if dtype == GgmlDType::Q6K && n % 16 == 0 && cfg!(target_arch = "x86_64") {
                // The test discriminates: candle's one-row and two-row kernels disagree here.
                let one = Tensor::from_slice(&x[..k], (1, k), &Device::Cpu).unwrap();
                let two = Tensor::from_slice(&x[..2 * k], (2, k), &Device::Cpu).unwrap();
                let one = weight.matmul.forward(&one).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                let two = weight.matmul.forward(&two).unwrap().flatten_all().unwrap().to_vec1::<f32>().unwrap();
                assert_ne!(one, two[..n], "candle's Q6_K kernels agreed; the data does not test the split");
            }
        }
    }
}

/// The vector loops of the weighted sum give the scalar loops' results bit for bit, for
/// lengths with and without tails.
#[test]
fn vector_attention_loops_equal_the_scalar_ones() {
    // With the committed build flags (x86-64-v3) `axpy` takes the vector path; a baseline
    // build compares the scalar loops with themselves.
    for k in [8usize, 13, 64, 72, 130, 200] {
        let q = values(k, k as u32);
        let halves: Vec<f16> = values(k, 7 * k as u32).iter().map(|&v| f16::from_f32(v)).collect();
        let widened: Vec<f32> = halves.iter().map(|h| h.to_f32()).collect();
        let mut buffer = vec![0f32; k];
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
    // A head group's weighted sums, each value loaded once for several heads, equal each
    // head's key-by-key fused multiply-adds, for every group size the models have (chunks
    // of 3, 2 and 1 with AVX2, of 4 to 1 with AVX-512), both head sizes, and an odd number
    // of keys.
    for head_dim in [64usize, 128] {
        let keys = 37;
        let values16: Vec<f16> = values(keys * head_dim + 5, 11).iter().map(|&v| f16::from_f32(v)).collect();
        let offsets: Vec<usize> = (0..keys).map(|j| (j * 7 % keys) * head_dim + j % 2).collect();
        for heads in 1..=7usize {
            let weights: Vec<Vec<f32>> = (0..heads).map(|h| values(keys, 40 + h as u32)).collect();
            let start = values(heads * head_dim, 3);
            let mut fast = start.clone();
            if !unsafe { simd::weighted_sum_heads(&weights, &offsets, &values16, &mut fast) } {
                // Only where the CPU lacks AVX2 (never on this project's machines).
                #[cfg(target_arch = "x86_64")]
                assert!(!std::arch::is_x86_feature_detected!("avx2"));
                continue;
            }
            let mut slow = start.clone();
            for (h, out) in slow.chunks_exact_mut(head_dim).enumerate() {
                for (&w, &o) in weights[h].iter().zip(&offsets) {
                    for (e, out) in out.iter_mut().enumerate() {
                        *out = w.mul_add(values16[o + e].to_f32(), *out);
                    }
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&fast), bits(&slow), "{heads} heads of {head_dim}");
        }
    }
}

/// Attention over a paged cache written by `write_kv` (keys key-major per block, blocks
/// scattered, partial last blocks, grouped-query heads) equals softmax attention
/// computed key by key from the rows written, bit for bit: for f32 in the reference's
/// orders, short contexts (candle's horizontal order) and long ones (its matrix-vector
/// order); for f16 as [`f16_attention::reference_head`] specifies.
#[test]
fn paged_attention_equals_attention_over_the_written_rows() {
    let backend = CpuBackend::default();
    let settings = [KvDtype::F16, KvDtype::Bf16, KvDtype::F32, KvDtype::Int8]
        .into_iter()
        .flat_map(|d| [(d, 1, 2), (d, 2, 2), (d, 1, 3)]);
    for (dtype, seqs, kv_heads) in settings {
        // Groups of 3 query heads. One row per sequence (with 2 threads: one group per
        // item for 2 kv heads, pieces of a group for 3), a few (one sequence's span cut
        // into shorter ones, a group per item) to 300 (a group per item).
        let heads = AttentionHeads { heads: 3 * kv_heads, kv_heads, head_dim: 64 };
        let kv_width = heads.kv_heads * heads.head_dim;
        for len in [1usize, 5, 37, 300] {
            let shape = KvShape { layers: 1, num_blocks: 64, block_size: 16, kv_heads, head_dim: 64, dtype };
            let mut cache = backend.kv_cache(shape).unwrap();
            // Two sequences on interleaved, out-of-order blocks.
            let tables: [Vec<u32>; 2] = [
                (0..len.div_ceil(16) as u32).map(|b| 63 - 2 * b).collect(),
                (0..len.div_ceil(16) as u32).map(|b| 2 * b).collect(),
            ];
            let mut batch = ForwardBatch::default();
            for table in &tables[..seqs] {
                batch.push_sequence(&vec![0; len], 0, table, 16, true);
            }
            let rows = batch.tokens.len();
            let k = CpuTensor { rows, cols: kv_width, data: values(rows * kv_width, 11 + len as u32) };
            let v = CpuTensor { rows, cols: kv_width, data: values(rows * kv_width, 17 + len as u32) };
            let q = CpuTensor { rows, cols: heads.heads * 64, data: values(rows * heads.heads * 64, 5) };
            backend.write_kv(&mut cache, 0, &k, &v, &batch.slots).unwrap();
            let got = backend.attention(&q, &cache, 0, &batch, heads).unwrap();
            let stored = |x: f32| match dtype {
                KvDtype::F16 => f16::from_f32(x).to_f32(),
                KvDtype::Bf16 => bf16_attention::from_bf16(bf16_attention::to_bf16(x)),
                KvDtype::F32 | KvDtype::Int8 => x,
            };
            for row in 0..rows {
                let seq_start = if row < len { 0 } else { len };
                let seen = batch.positions[row] as usize + 1;
                for head in 0..heads.heads {
                    let kv = head / 3;
                    let query = &q.row(row)[head * 64..][..64];
                    let cached = |t: &CpuTensor, j: usize| -> Vec<f32> {
                        t.row(seq_start + j)[kv * 64..][..64].iter().map(|&x| stored(x)).collect()
                    };
                    let want = if dtype == KvDtype::Bf16 {
                        let (keys, values): (Vec<_>, Vec<_>) =
                            (0..seen).map(|j| (cached(&k, j), cached(&v, j))).unzip();
                        let mut want = vec![0f32; 64];
                        let bits = bf16_attention::to_bf16;
                        let (key, value) =
                            (|j: usize, e: usize| bits(keys[j][e]), |j: usize, e: usize| bits(values[j][e]));
                        bf16_attention::reference_head(query, seen, key, value, 0.125, &mut want);
                        want
                    } else if dtype == KvDtype::Int8 {
                        // Each 32 elements as bytes against their amax / 127, rounded half
                        // away from zero.
                        let quantised = |t: &CpuTensor, j: usize| -> (Vec<i8>, Vec<f32>) {
                            let head = &t.row(seq_start + j)[kv * 64..][..64];
                            let mut bytes = Vec::new();
                            let mut scales = Vec::new();
                            for part in head.chunks(32) {
                                let d = part.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
                                let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
                                bytes.extend(part.iter().map(|x| (x * inverse).round() as i8));
                                scales.push(d);
                            }
                            (bytes, scales)
                        };
                        let (keys, values): (Vec<_>, Vec<_>) =
                            (0..seen).map(|j| (quantised(&k, j), quantised(&v, j))).unzip();
                        let mut want = vec![0f32; 64];
                        int8_attention::reference_head(
                            query,
                            seen,
                            |j, e| keys[j].0[e],
                            |j, p| keys[j].1[p],
                            |j, e| values[j].0[e],
                            |j, p| values[j].1[p],
                            0.125,
                            &mut want,
                        );
                        want
                    } else if dtype == KvDtype::F16 {
                        let (keys, values): (Vec<_>, Vec<_>) =
                            (0..seen).map(|j| (cached(&k, j), cached(&v, j))).unzip();
                        let mut want = vec![0f32; 64];
                        let (key, value) = (|j: usize, e: usize| keys[j][e], |j: usize, e: usize| values[j][e]);
                        f16_attention::reference_head(query, seen, key, value, 0.125, &mut want);
                        want
                    } else {
                        let order = ScoreOrder::candle(seen);
                        let mut scores: Vec<f32> =
                            (0..seen).map(|j| order.dot(query, &cached(&k, j)) * 0.125).collect();
                        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
                        scores.iter_mut().for_each(|s| *s = (*s - max).exp());
                        let total = lane_sum(&scores);
                        let mut want = vec![0f32; 64];
                        for (j, &w) in scores.iter().enumerate() {
                            for (o, x) in want.iter_mut().zip(cached(&v, j)) {
                                *o = (w / total).mul_add(x, *o);
                            }
                        }
                        want
                    };
                    let have = &got.row(row)[head * 64..][..64];
                    assert!(
                        have.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{dtype:?}, {seqs} sequences, {kv_heads} kv heads, len {len}, row {row}, head {head}"
                    );
                }
            }
        }
    }
}
