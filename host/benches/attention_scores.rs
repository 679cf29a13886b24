//! The attention score kernels alone: `cargo bench -p dspark-host --bench attention_scores`. One
//! thread computes a head group's scores over a sequence's key-major cache blocks (16 keys
//! per block, f16 keys, as the CPU cache stores them) for SmolLM2's and Qwen2.5's head
//! groups (3 and 7 query heads per kv head, head size 64), at 1,024 keys (serving contexts)
//! and 192, in each summation order ([`ScoreOrder`]: candle's horizontal one, which it takes
//! up to 256 keys, its matrix-vector one, taken beyond, and the two-chain one of f16 caches),
//! with every vector width this CPU has. Prints the median and minimum nanoseconds per (head, key):
//! the minimum is the kernel undisturbed, the figure to compare two versions by. A first
//! argument not starting with `-` keeps only the widths whose name contains it (`-- Avx2`).

mod common;

use common::{median_secs, values};
use dspark_host::engine::backend::cpu::attention::key_lanes::{KeyLanes, ScoreOrder, append_block_scores};
use half::f16;

fn main() {
    const BLOCK: usize = 16;
    const HEAD_DIM: usize = 64;
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let widths: Vec<KeyLanes> = [KeyLanes::Scalar, KeyLanes::Avx2, KeyLanes::Avx512]
        .into_iter()
        .filter(|&w| w == KeyLanes::Scalar || KeyLanes::detect(BLOCK).width() >= w.width())
        .filter(|w| filter.as_deref().is_none_or(|f| format!("{w:?}").contains(f)))
        .collect();
    println!("{:<8} {:>6} {:>16} {:<12} {:>12} {:>12}", "heads", "keys", "order", "width", "median ns", "min ns");
    for heads in [3usize, 7] {
        for keys in [1024usize, 192] {
            let blocks = keys / BLOCK;
            let cache: Vec<f16> =
                values(blocks * BLOCK * HEAD_DIM, keys as u64).into_iter().map(f16::from_f32).collect();
            let queries = values(heads * HEAD_DIM, heads as u64);
            // The candle order of this context, and the two-chain order of f16 caches (which
            // the engine computes inside the f16 attention kernel's pass: the `attention` bench).
            let variants = [ScoreOrder::candle(keys), ScoreOrder::TwoChains];
            for (order, &lanes) in variants.into_iter().flat_map(|order| widths.iter().map(move |lanes| (order, lanes)))
            {
                let mut scores = vec![Vec::with_capacity(keys); heads];
                let run = || {
                    scores.iter_mut().for_each(Vec::clear);
                    for block in cache.chunks_exact(BLOCK * HEAD_DIM) {
                        append_block_scores(lanes, &queries, HEAD_DIM, block, BLOCK, BLOCK, order, 0.125, &mut scores);
                    }
                    std::hint::black_box(&scores);
                };
                let (median, min) = median_secs(2000, run);
                let per = (heads * keys) as f64 / 1e9;
                let order = match order {
                    ScoreOrder::Horizontal => "horiz",
                    ScoreOrder::MatrixVector => "matvec",
                    ScoreOrder::TwoChains => "chains",
                };
                println!(
                    "{heads:<8} {keys:>6} {order:>16} {:<12} {:>12.3} {:>12.3}",
                    format!("{lanes:?}"),
                    median / per,
                    min / per
                );
            }
        }
    }
}
