//! The packed kernels against candle, bit for bit, on every instruction set this CPU has.

use half::f16;

use super::quantize::*;
use super::tiles::*;
use super::*;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// The instruction sets this CPU runs; on x86-64 (the build's x86-64-v3 baseline) at least
/// AVX2, so the comparisons below never pass by running nothing.
fn isas() -> Vec<Isa> {
    let found: Vec<Isa> = [Isa::Avx512Vnni, Isa::Avx2].into_iter().filter(|i| i.available()).collect();
    #[cfg(target_arch = "x86_64")]
    assert!(!found.is_empty(), "an x86-64-v3 build runs on a CPU with AVX2");
    found
}

#[test]
fn the_kernels_match_candle_bit_for_bit() {
    for isa in isas() {
        the_kernels_of(isa);
    }
}

fn the_kernels_of(isa: Isa) {
    for (dtype, (n, k)) in [GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q5_0]
        .into_iter()
        .flat_map(|d| [(16usize, 64usize), (64, 576), (192, 576), (48, 1472), (32, 896)].map(|s| (d, s)))
    {
        let w = Tensor::from_vec(values(n * k, n as u64 + k as u64), (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, dtype).unwrap();
        let packed = Packed::new(dtype, &q.data().unwrap(), n, k).unwrap();
        let reference = QMatMul::from_qtensor(q).unwrap();
        // Up to several passes of `PASS_ROWS` rows, the last ones partial.
        for rows in [1usize, 2, 5, 8, 11, 14, 17, 37, 70] {
            let x = values(rows * k, rows as u64 * 31 + n as u64);
            let input = Tensor::from_slice(&x, (rows, k), &Device::Cpu).unwrap();
            let expected: Vec<f32> = reference.forward(&input).unwrap().flatten_all().unwrap().to_vec1().unwrap();
            let got = packed.matmul_with(isa, &x, rows).unwrap();
            let same = expected.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{isa:?} {dtype:?}, {rows} rows of [{n}, {k}]: {:?} vs {:?}", &expected[..4], &got[..4]);
        }
    }
}

#[test]
fn vector_quantisation_equals_the_scalar_one() {
    // Ties (x.5 after scaling), zeros, negative ties, and random blocks.
    let mut blocks: Vec<Vec<f32>> = vec![vec![0.0; 32]];
    let mut ties: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) + 0.5).collect();
    ties[0] = 127.0;
    blocks.push(ties.clone());
    blocks.push(ties.iter().map(|v| -v).collect());
    for seed in 0..64 {
        blocks.push(values(32, seed));
    }
    for isa in isas() {
        for block in &blocks {
            let (mut a, mut b) = ([0i32; 8], [0i32; 8]);
            let got = quantize_block(isa, block, &mut a);
            let want = quantize_block_scalar(block, &mut b);
            assert_eq!((got.0.to_bits(), got.1, a), (want.0.to_bits(), want.1, b), "{isa:?} {block:?}");
        }
    }
}

#[test]
fn rows_quantised_together_equal_their_blocks_one_by_one() {
    // Block counts around the 16 blocks of a vector pass and the runs of `SUM_RUN`, with
    // zero blocks, ties and the blocks of the test above spread over the row.
    for blocks in [1usize, 2, 15, 16, 17, 18, 31, 33, 46, 64, 65, 152] {
        let mut x = values(blocks * BLOCK, blocks as u64);
        for (i, block) in x.chunks_exact_mut(BLOCK).enumerate() {
            match i % 7 {
                3 => block.fill(0.0),
                5 => block.iter_mut().enumerate().for_each(|(j, v)| *v = (j as f32 - 16.0) + 0.5),
                6 => block.iter_mut().enumerate().for_each(|(j, v)| *v = -((j as f32 - 16.0) + 0.5) * 1e-3),
                _ => {}
            }
            if i % 7 == 5 {
                block[0] = 127.0;
            }
        }
        let mut want_words = vec![0i32; 8 * blocks];
        let want: Vec<(u32, i32)> = x
            .chunks_exact(BLOCK)
            .zip(want_words.chunks_exact_mut(8))
            .map(|(block, words)| {
                let (amax, sum) = quantize_block_scalar(block, words);
                (amax.to_bits(), sum)
            })
            .collect();
        let want_word_sums: Vec<i32> =
            want_words.iter().map(|w| w.to_le_bytes().iter().map(|&b| b as i8 as i32).sum()).collect();
        for isa in isas() {
            let (mut words, mut amax, mut sums) = (vec![0i32; 8 * blocks], vec![0f32; blocks], vec![0i32; blocks]);
            quantize_row(isa, &x, &mut words, &mut amax, &mut sums);
            let got: Vec<(u32, i32)> = amax.iter().map(|a| a.to_bits()).zip(sums).collect();
            assert_eq!(got, want, "{isa:?}, {blocks} blocks: amax and sums");
            assert_eq!(words, want_words, "{isa:?}, {blocks} blocks: words");
            let mut word_total = vec![0i32; 8 * blocks];
            word_sums(isa, &words, &mut word_total);
            assert_eq!(word_total, want_word_sums, "{isa:?}, {blocks} blocks: word sums");
        }
    }
}

#[test]
fn products_run_together_equal_products_run_alone() {
    for isa in isas() {
        products_together_and_alone(isa);
    }
}

fn products_together_and_alone(isa: Isa) {
    let k = 576;
    let mats: Vec<Packed> = [576usize, 192, 64]
        .iter()
        .map(|&n| {
            let w = Tensor::from_vec(values(n * k, n as u64), (n, k), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
            Packed::new(GgmlDType::Q4_1, &q.data().unwrap(), n, k).unwrap()
        })
        .collect();
    for rows in [1usize, 3, 16] {
        let x = values(rows * k, rows as u64 + 7);
        let refs: Vec<&Packed> = mats.iter().collect();
        let together = Packed::matmul_many_with(isa, &refs, &x, rows).unwrap();
        for (m, got) in mats.iter().zip(&together) {
            let alone = m.matmul_with(isa, &x, rows).unwrap();
            assert!(alone.iter().zip(got).all(|(a, b)| a.to_bits() == b.to_bits()), "{rows} rows");
        }
    }
    let q8 = {
        let w = Tensor::from_vec(values(16 * k, 3), (16, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
        Packed::new(GgmlDType::Q8_0, &q.data().unwrap(), 16, k).unwrap()
    };
    assert!(Packed::matmul_many_with(isa, &[&mats[0], &q8], &values(k, 1), 1).is_none(), "Q4_1 only");
}

#[test]
fn selected_blocks_equal_the_full_product_and_the_rest_is_filled() {
    for isa in isas() {
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0, GgmlDType::Q5_0] {
            let (n, k) = (160, 576);
            let w = Tensor::from_vec(values(n * k, 11), (n, k), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&w, dtype).unwrap();
            let packed = Packed::new(dtype, &q.data().unwrap(), n, k).unwrap();
            for rows in [1usize, 3, 9] {
                let x = values(rows * k, rows as u64 + 5);
                let full = packed.matmul_with(isa, &x, rows).unwrap();
                // Every row wants a different pattern: none, all, and scattered groups
                // (runs of wanted rows longer and shorter than a row tile).
                let wanted = |r: usize, g: usize| match r % 3 {
                    0 => (r + g) % 4 == 1,
                    1 => true,
                    _ => r == 2 && g == 9,
                };
                let got = packed.matmul_selected_with(isa, &x, rows, &wanted, f32::NEG_INFINITY).unwrap();
                assert_eq!(got.len(), full.len());
                for (i, (a, b)) in full.iter().zip(&got).enumerate() {
                    let (r, g) = (i / n, (i % n) / GROUP_COLUMNS);
                    if wanted(r, g) {
                        assert_eq!(a.to_bits(), b.to_bits(), "{isa:?} {dtype:?} row {r} column {}", i % n);
                    } else {
                        assert_eq!(*b, f32::NEG_INFINITY, "{isa:?} {dtype:?} row {r} column {}", i % n);
                    }
                }
            }
        }
    }
}

/// The logits kernel's order ([`PackedQ8_0::logits_with`]), one value at a time.
fn logits_specification(raw: &[u8], n: usize, k: usize, y: &Q8_0Rows, row: usize, col: usize) -> f32 {
    let blocks = k / BLOCK;
    let mut acc = 0f32;
    for b in 0..blocks {
        let block = &raw[(col * blocks + b) * 34..][..34];
        let dx = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let at = row * blocks + b;
        let q = y.words[at * 8..][..8].iter().flat_map(|w| w.to_le_bytes());
        let sumi: i32 = block[2..].iter().zip(q).map(|(&w, q)| w as i8 as i32 * q as i8 as i32).sum();
        acc = (dx * y.d[at]).mul_add(sumi as f32, acc);
    }
    assert!(col < n);
    acc
}

#[test]
fn the_logits_kernel_follows_its_order_and_stays_within_rounding_of_candle() {
    for isa in isas() {
        for (n, k) in [(16usize, 64usize), (64, 576), (192, 576), (48, 1472)] {
            let w = Tensor::from_vec(values(n * k, n as u64 * 3 + k as u64), (n, k), &Device::Cpu).unwrap();
            let q = QTensor::quantize(&w, GgmlDType::Q8_0).unwrap();
            let raw = q.data().unwrap().to_vec();
            let packed = Packed::new(GgmlDType::Q8_0, &raw, n, k).unwrap();
            let reference = QMatMul::from_qtensor(q).unwrap();
            for rows in [1usize, 3, 8, 11, 17] {
                let x = values(rows * k, rows as u64 * 17 + n as u64);
                let input = Tensor::from_slice(&x, (rows, k), &Device::Cpu).unwrap();
                let candle: Vec<f32> = reference.forward(&input).unwrap().flatten_all().unwrap().to_vec1().unwrap();
                let got = packed.logits_with(isa, &x, rows, None, 0.0).unwrap();
                let y = Q8_0Rows::quantize(isa, &x, rows, k);
                for (i, (&got, &candle)) in got.iter().zip(&candle).enumerate() {
                    let (row, col) = (i / n, i % n);
                    // Every instruction set computes the specification's values.
                    let want = logits_specification(&raw, n, k, &y, row, col);
                    assert_eq!(got.to_bits(), want.to_bits(), "{isa:?} [{n}, {k}] row {row} column {col}");
                    // Only the summation order differs: a few float roundings of the
                    // blocks' partial sums, far below the logits' scale.
                    let scale = k as f32 * 1e-6 * (1.0 + candle.abs());
                    assert!((got - candle).abs() <= scale, "[{n}, {k}] row {row} column {col}: {got} vs {candle}");
                }
                // A selection computes the same values and fills the rest.
                let wanted = |r: usize, g: usize| (r + g) % 3 != 1;
                let selected = packed.logits_with(isa, &x, rows, Some(&wanted), f32::NEG_INFINITY).unwrap();
                for (i, (&all, &some)) in got.iter().zip(&selected).enumerate() {
                    let (row, group) = (i / n, (i % n) / GROUP_COLUMNS);
                    let want = if wanted(row, group) { all } else { f32::NEG_INFINITY };
                    assert_eq!(some.to_bits(), want.to_bits(), "{isa:?} [{n}, {k}] row {row} column {}", i % n);
                }
                // Each row's values are the same whatever rows share its tiles.
                if rows > 1 {
                    let alone = packed.logits_with(isa, &x[k..2 * k], 1, None, 0.0).unwrap();
                    assert_eq!(
                        alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        got[n..2 * n].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{isa:?} [{n}, {k}]: row 1 alone"
                    );
                }
            }
        }
        // Other formats keep candle's order in the logits too.
        let (n, k) = (64, 576);
        let w = Tensor::from_vec(values(n * k, 5), (n, k), &Device::Cpu).unwrap();
        let q = QTensor::quantize(&w, GgmlDType::Q4_1).unwrap();
        let packed = Packed::new(GgmlDType::Q4_1, &q.data().unwrap(), n, k).unwrap();
        let x = values(3 * k, 9);
        let exact = packed.matmul_with(isa, &x, 3).unwrap();
        let logits = packed.logits_with(isa, &x, 3, None, 0.0).unwrap();
        assert!(exact.iter().zip(&logits).all(|(a, b)| a.to_bits() == b.to_bits()), "{isa:?} Q4_1");
    }
}

#[test]
fn shapes_the_kernels_cannot_take_are_refused() {
    assert!(PackedQ4_1::new(&[0; 20 * 15], 15, 32).is_none());
    assert!(PackedQ4_1::new(&[0; 20 * 16], 16, 33).is_none());
    assert!(PackedQ4_1::new(&[0; 7], 16, 32).is_none());
    assert!(PackedQ8_0::new(&[0; 34 * 15], 15, 32).is_none());
    assert!(PackedQ8_0::new(&[0; 34 * 16 * 8], 16, 256).is_none(), "candle's own kernel takes k = 256n");
    assert!(Packed::new(GgmlDType::Q5K, &[0; 176 * 16], 16, 256).is_none());
}
