//! What the benchmarks share.

use std::time::Instant;

/// Deterministic values in [-1, 1).
pub fn values(n: usize, seed: u64) -> Vec<f32> {
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

/// Median and minimum seconds of `run` over enough repetitions to fill about half a second
/// (at least 5, at most `max_reps`). The minimum is the code undisturbed, the figure to
/// compare two versions by on a shared machine.
pub fn median_secs(max_reps: usize, mut run: impl FnMut()) -> (f64, f64) {
    run();
    let start = Instant::now();
    run();
    let once = start.elapsed().as_secs_f64().max(1e-6);
    let reps = ((0.5 / once) as usize).clamp(5, max_reps.max(5));
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            run();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[reps / 2], times[0])
}
