//! The packed matrix kernels alone, per instruction set: `cargo bench -p dspark-host --bench
//! matmul`. For each of SmolLM2's product shapes (the gate/up, down and output
//! projections), and Qwen2.5's that the packed kernels take, and 1, 2, 4, 8 and 16 rows, the median time of a product, the weight bytes streamed
//! per second and the multiply-adds per second, with the AVX-512 VNNI and AVX2 kernels where
//! this CPU has them and candle's own kernel beside them. Medians and minimums of repeated
//! runs, since these machines are shared and noisy: the minimum is the kernel undisturbed, the
//! figure to compare two versions of a kernel by. A first argument not starting with `-`
//! keeps only the products whose name contains it (`cargo bench ... -- Q4_1`).
//!
//! The products run on the backend's worker threads ([`dspark_host::engine::backend::cpu::threads`]),
//! as in the engine's forward pass; the calling thread takes items beside them.

mod common;

use common::{median_secs, values};

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{Device, Module, Tensor};
use dspark_host::engine::backend::cpu::matmul::{Isa, Packed};

fn main() -> anyhow::Result<()> {
    let shapes = [
        ("gate/up 1536x576 Q4_1", GgmlDType::Q4_1, 1536usize, 576usize),
        ("down 576x1536 Q4_1", GgmlDType::Q4_1, 576, 1536),
        ("output 49152x576 Q8_0", GgmlDType::Q8_0, 49152, 576),
        ("Qwen ffn 4864x896 Q5_0", GgmlDType::Q5_0, 4864, 896),
        ("Qwen down 896x4864 Q4_K", GgmlDType::Q4K, 896, 4864),
        ("Qwen down 896x4864 Q6_K", GgmlDType::Q6K, 896, 4864),
    ];
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    println!(
        "{:<24} {:>4} {:<12} {:>10} {:>8} {:>9} {:>10} {:>11}",
        "product", "rows", "kernel", "median us", "GB/s", "GMAC/s", "min us", "min GMAC/s"
    );
    for (name, dtype, n, k) in shapes {
        if filter.as_deref().is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let w = Tensor::from_vec(values(n * k, (n + k) as u64), (n, k), &Device::Cpu)?;
        let q = QTensor::quantize(&w, dtype)?;
        let bytes = q.storage_size_in_bytes();
        let packed = Packed::new(dtype, &q.data()?, n, k).ok_or_else(|| anyhow::anyhow!("{name}: not packable"))?;
        let reference = QMatMul::from_qtensor(q)?;
        for rows in [1usize, 2, 4, 8, 16] {
            let x = values(rows * k, rows as u64);
            let input = Tensor::from_slice(&x, (rows, k), &Device::Cpu)?;
            let report = |kernel: &str, (secs, min): (f64, f64)| {
                let gbs = bytes as f64 / secs / 1e9;
                let gmacs = (rows * n * k) as f64 / secs / 1e9;
                let min_gmacs = (rows * n * k) as f64 / min / 1e9;
                println!(
                    "{name:<24} {rows:>4} {kernel:<12} {:>10.1} {gbs:>8.2} {gmacs:>9.2} {:>10.1} {min_gmacs:>11.2}",
                    secs * 1e6,
                    min * 1e6
                );
            };
            for isa in [Isa::Avx512Vnni, Isa::Avx2].into_iter().filter(|i| i.available()) {
                let secs = median_secs(400, || {
                    std::hint::black_box(packed.matmul_with(isa, &x, rows));
                });
                report(&format!("{isa:?}"), secs);
                if name.starts_with("output") {
                    // The output projection's own order (`Packed::logits`).
                    let secs = median_secs(400, || {
                        std::hint::black_box(packed.logits_with(isa, &x, rows, None, 0.0));
                    });
                    report(&format!("{isa:?} logits"), secs);
                    // The masked output projection: every fifth group of 16 columns, about
                    // the share of the vocabulary a JSON constraint's masks allow (19% of
                    // tokens in `dspark bench`'s orders workload). GB/s and GMAC/s count the
                    // whole matrix, so they read as the full product's equivalent.
                    let wanted = |_: usize, g: usize| g.is_multiple_of(5);
                    let secs = median_secs(400, || {
                        std::hint::black_box(packed.matmul_selected_with(isa, &x, rows, &wanted, f32::NEG_INFINITY));
                    });
                    report(&format!("{isa:?} 1/5"), secs);
                }
            }
            let secs = median_secs(400, || {
                std::hint::black_box(reference.forward(&input).ok());
            });
            report("candle", secs);
        }
    }
    Ok(())
}
