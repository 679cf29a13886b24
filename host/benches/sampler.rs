//! The sampler on a SmolLM2-sized row (49,152 logits): `cargo bench -p dspark-host --bench
//! sampler`. Sampling runs on the engine thread between forward passes, once per sampled
//! sequence, so its time adds to every step. Cases: greedy with no mask, greedy under a mask
//! allowing every fifth 32-token word (a JSON value's mask) and under a mask allowing a
//! single token (a forced step of the classic path), and temperature draws, with and without
//! top-p, on a peaked row and on a flat one.
//! Median and minimum microseconds. A first argument not starting with `-` keeps only the cases
//! whose name contains it.

mod common;

use common::{median_secs, values};
use dspark_host::engine::SamplingParams;
use dspark_host::engine::sampler::{Rng, TokenHistory, sample};

/// A case: its name, the parameters, the mask and the row of logits.
type Case<'a> = (&'a str, &'a SamplingParams, Option<&'a [u32]>, &'a [f32]);

fn main() {
    let vocab = 49_152;
    // A language model's row: most tokens far below a few dozen likely ones.
    let mut logits: Vec<f32> = values(vocab, 7).iter().map(|v| v * 3.0).collect();
    for (i, peak) in values(40, 11).iter().enumerate() {
        logits[(i * 7919) % vocab] = 14.0 + 2.0 * peak;
    }
    // A flat row (every token within a few nats of the best): the nucleus takes most of it.
    let flat = values(vocab, 7);
    let words = vocab / 32;
    let sparse: Vec<u32> = (0..words).map(|w| if w % 5 == 0 { 0x0F0F_0F0F } else { 0 }).collect();
    let mut single = vec![0u32; words];
    single[words / 2] = 1 << 7;
    let greedy = SamplingParams { temperature: 0.0, ..Default::default() };
    let draw = SamplingParams { temperature: 0.8, top_p: 0.9, ..Default::default() };
    let history = TokenHistory::default();
    let plain = SamplingParams { temperature: 0.7, ..Default::default() };
    let cases: [Case; 7] = [
        ("greedy, no mask", &greedy, None, &logits),
        ("greedy, 1/5 of the words", &greedy, Some(&sparse), &logits),
        ("greedy, one token", &greedy, Some(&single), &logits),
        ("temperature 0.7", &plain, None, &logits),
        ("temperature 0.7, 1/5 of the words", &plain, Some(&sparse), &logits),
        ("temperature 0.8, top_p 0.9", &draw, None, &logits),
        ("flat, temperature 0.8, top_p 0.9", &draw, None, &flat),
    ];
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    println!("{:<34} {:>10} {:>10}", "case", "median us", "min us");
    for (name, params, mask, logits) in cases {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let mut rng = Rng::new(1);
        let mut row = logits.to_vec();
        let (median, min) = median_secs(2000, || {
            row.copy_from_slice(logits);
            std::hint::black_box(sample(&mut row, params, &history, mask, &[], &mut rng).ok());
        });
        println!("{name:<34} {:>10.1} {:>10.1}", median * 1e6, min * 1e6);
    }
}
