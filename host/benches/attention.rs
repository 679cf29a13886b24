//! One row's attention over an f16 or a bf16 cache, as the engine runs it for those caches
//! ([`f16::attend`](f16_attention::attend), [`bf16::attend`](bf16_attention::attend): scores, online softmax and
//! weighted sum in one pass): `cargo bench -p dspark-host --bench attention`. One thread, one
//! head group sharing a kv head (1 query head: the work item of a row decoded alone, whose
//! heads go one per item; 3: SmolLM2's group; 7: Qwen2.5's), head size 64, blocks of
//! 16 slots, at 1,024 keys (serving contexts) and 192. Two settings: `hot`, the same sequence
//! every call (its 256 KB of keys and values in the CPU's caches), and `cold`, each call
//! another sequence's blocks from a 256 MB pool, as a serving step finds them (a step's keys
//! and values are far larger than the caches). Each for 1, 4 and 16 rows of one sequence (a
//! chunk: a prefill, a fast-forward span), attended `together` (one call: each run of keys
//! read once for all the rows) and, for more than one, `alone` (a call per row). `width` is
//! the f16 kernel's vector width, or for bf16 `bf16x32` (AVX-512 BF16) or `scalar`. Prints
//! the median and minimum nanoseconds per (row, head, key); the minimum is the kernel
//! undisturbed, the figure to compare two versions by.

mod common;

use common::{median_secs, values};
use dspark_host::engine::backend::cpu::attention::key_lanes::KeyLanes;
use dspark_host::engine::backend::cpu::attention::{bf16 as bf16_attention, f16 as f16_attention};
use half::f16;

fn main() {
    const BLOCK: usize = 16;
    const HEAD_DIM: usize = 64;
    const PER_BLOCK: usize = BLOCK * HEAD_DIM;
    // Keys and values of a block share their offset in the two arrays, as in the cache.
    let pool_blocks = (256 << 20) / (2 * 2 * PER_BLOCK);
    let keys: Vec<f16> = values(pool_blocks * PER_BLOCK, 1).into_iter().map(f16::from_f32).collect();
    let vals: Vec<f16> = values(pool_blocks * PER_BLOCK, 2).into_iter().map(f16::from_f32).collect();
    // The same values rounded to bf16 (the layout does not change what is timed: a block's
    // keys and values are read whole either way).
    let keys_bf16: Vec<u16> = keys.iter().map(|x| bf16_attention::to_bf16(x.to_f32())).collect();
    let vals_bf16: Vec<u16> = vals.iter().map(|x| bf16_attention::to_bf16(x.to_f32())).collect();
    let lanes = KeyLanes::detect(BLOCK);
    println!(
        "{:<6} {:>6} {:>5} {:<6} {:<6} {:<9} {:<8} {:>10} {:>10}",
        "heads", "keys", "rows", "cache", "memory", "how", "width", "median ns", "min ns"
    );
    for heads in [1usize, 3, 7] {
        for n in [1024usize, 192] {
            for rows in [1usize, 4, 16] {
                let queries: Vec<f32> = values(rows * heads * HEAD_DIM, heads as u64).iter().map(|x| 2.0 * x).collect();
                let mut out = vec![0f32; rows * heads * HEAD_DIM];
                // A chunk's rows: the last sees `n` keys, each one before it one key fewer.
                let seen: Vec<usize> = (0..rows).map(|r| n + 1 + r - rows).collect();
                for cold in [false, true] {
                    for (bf16, together) in [(false, true), (true, true), (false, false), (true, false)] {
                        if rows == 1 && !together {
                            continue;
                        }
                        let mut sequence = 0usize;
                        let blocks = n / BLOCK;
                        let mut run = || {
                            // A sequence's blocks out of order; cold: another stretch of the pool.
                            let first = if cold { sequence * 7919 % (pool_blocks - 2 * blocks) } else { 0 };
                            sequence += 1;
                            let starts: Vec<usize> =
                                (0..blocks).map(|b| (first + (b * 5) % blocks) * PER_BLOCK).collect();
                            let ahead = |b: usize| {
                                prefetch(&keys[starts[b]..][..PER_BLOCK]);
                                prefetch(&vals[starts[b]..][..PER_BLOCK]);
                            };
                            let row_len = heads * HEAD_DIM;
                            let rows_of: Vec<(std::ops::Range<usize>, &[usize])> = if together {
                                vec![(0..rows * row_len, &seen[..])]
                            } else {
                                (0..rows).map(|r| (r * row_len..(r + 1) * row_len, &seen[r..r + 1])).collect()
                            };
                            for (range, seen) in rows_of {
                                let (q, out) = (&queries[range.clone()], &mut out[range]);
                                if bf16 {
                                    let ahead = |b: usize| {
                                        prefetch(&keys_bf16[starts[b]..][..PER_BLOCK]);
                                        prefetch(&vals_bf16[starts[b]..][..PER_BLOCK]);
                                    };
                                    bf16_attention::attend(
                                        q, HEAD_DIM, &keys_bf16, &vals_bf16, &starts, BLOCK, seen, 0.125, out, ahead,
                                    );
                                } else {
                                    f16_attention::attend(
                                        lanes, q, HEAD_DIM, &keys, &vals, &starts, BLOCK, seen, 0.125, out, ahead,
                                    );
                                }
                            }
                            std::hint::black_box(&out);
                        };
                        let (median, min) = median_secs(if rows == 16 { 800 } else { 3000 }, &mut run);
                        let per = (rows * heads * n) as f64 / 1e9;
                        println!(
                            "{heads:<6} {n:>6} {rows:>5} {:<6} {:<6} {:<9} {:<8} {:>10.3} {:>10.3}",
                            if bf16 { "bf16" } else { "f16" },
                            if cold { "cold" } else { "hot" },
                            if together { "together" } else { "alone" },
                            match (bf16, bf16_attention::accelerated()) {
                                (true, true) => "bf16x32".to_string(),
                                (true, false) => "scalar".to_string(),
                                (false, _) => format!("{lanes:?}"),
                            },
                            median / per,
                            min / per
                        );
                    }
                }
            }
        }
    }
}

/// Asks for every cache line of `data`, as the engine's prefetch does.
fn prefetch<T>(data: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let base = data.as_ptr().cast::<i8>();
        for line in (0..std::mem::size_of_val(data)).step_by(64) {
            // SAFETY: a prefetch of an address inside `data` (it never faults anyway).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(line)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}
