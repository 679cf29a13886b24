//! `dspark cuda-check`: every kernel of [`super::KERNELS`] run on the GPU against a scalar
//! CPU reference written out here from the math, on seeded random inputs. This is the first
//! thing to run on a machine with a GPU (scripts/gpu-check.sh): it proves the kernels before the
//! backend that chains them is trusted.

use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use cudarc::driver::{CudaContext, CudaModule, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

use super::nvrtc::CubinCache;

/// One kernel's verdict.
#[derive(Clone, Debug)]
pub struct Check {
    /// What was checked.
    pub name: String,
    /// The largest relative error seen (or mismatches, for integer outputs).
    pub error: f64,
    /// The tolerance it must stay within.
    pub tolerance: f64,
}

impl Check {
    /// Whether the kernel is within tolerance.
    pub fn passed(&self) -> bool {
        self.error <= self.tolerance
    }
}

/// A small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn rel_error(got: &[f32], want: &[f32]) -> f64 {
    let scale = want.iter().fold(1e-6f64, |m, w| m.max(w.abs() as f64));
    got.iter().zip(want).map(|(g, w)| ((g - w).abs() as f64) / scale).fold(0.0, f64::max)
}

/// The device's architecture name (`sm_90` for an H100/H200).
pub fn arch(ctx: &CudaContext) -> anyhow::Result<String> {
    let (major, minor) = ctx.compute_capability().map_err(|e| anyhow!("compute capability: {e:?}"))?;
    Ok(format!("sm_{major}{minor}"))
}

/// Opens device `ordinal` and loads the kernels compiled for it (cached under `cache_dir`).
pub fn load(
    ordinal: usize,
    cache_dir: &std::path::Path,
) -> anyhow::Result<(Arc<CudaContext>, Arc<CudaModule>, String)> {
    if !super::driver_available() {
        bail!("the CUDA driver library (libcuda.so) cannot be loaded: no NVIDIA driver on this machine");
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| anyhow!("cannot open CUDA device {ordinal}: {e:?}"))?;
    let arch = arch(&ctx)?;
    let (cubin, _) = CubinCache::new(cache_dir).get_or_compile(super::KERNELS, &arch)?;
    let module = ctx.load_module(Ptx::from_binary(cubin)).map_err(|e| anyhow!("cannot load the CUBIN: {e:?}"))?;
    Ok((ctx, module, arch))
}

fn cfg(grid: (u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: (grid.0, grid.1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

macro_rules! dev {
    ($e:expr) => {
        $e.map_err(|e| anyhow!("{}: {e:?}", stringify!($e)))?
    };
}

/// Runs every check on device `ordinal`.
pub fn run(ordinal: usize, cache_dir: &std::path::Path) -> anyhow::Result<(String, Vec<Check>)> {
    let (ctx, module, arch) = load(ordinal, cache_dir)?;
    let s = ctx.default_stream();
    let f = |name: &str| module.load_function(name).map_err(|e| anyhow!("no kernel `{name}`: {e:?}"));
    let mut out = Vec::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);

    // RMSNorm with the residual add.
    let (rows, cols, eps) = (3usize, 576usize, 1e-5f32);
    let (x, r, w) = (rng.vec(rows * cols), rng.vec(rows * cols), rng.vec(cols));
    let mut want = vec![0f32; rows * cols];
    for row in 0..rows {
        let h: Vec<f32> = (0..cols).map(|c| x[row * cols + c] + r[row * cols + c]).collect();
        let scale = 1.0 / ((h.iter().map(|v| v * v).sum::<f32>() / cols as f32) + eps).sqrt();
        for c in 0..cols {
            want[row * cols + c] = h[c] * scale * w[c];
        }
    }
    let (dx, dr, dw) = (dev!(s.clone_htod(&x)), dev!(s.clone_htod(&r)), dev!(s.clone_htod(&w)));
    let mut dres = dev!(s.alloc_zeros::<f32>(rows * cols));
    let mut dout = dev!(s.alloc_zeros::<f32>(rows * cols));
    let k = f("rms_norm_residual")?;
    let (c32, eps32) = (cols as i32, eps);
    unsafe {
        s.launch_builder(&k)
            .arg(&dx)
            .arg(&dr)
            .arg(&mut dres)
            .arg(&dw)
            .arg(&mut dout)
            .arg(&c32)
            .arg(&eps32)
            .launch(cfg((rows as u32, 1), 256))
    }
    .map_err(|e| anyhow!("rms_norm_residual: {e:?}"))?;
    let got = dev!(s.clone_dtoh(&dout));
    out.push(Check { name: "rms_norm_residual".into(), error: rel_error(&got, &want), tolerance: 1e-5 });

    // SiLU-and-multiply.
    let n = 4096usize;
    let (g, u) = (rng.vec(n), rng.vec(n));
    let want: Vec<f32> = g.iter().zip(&u).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
    let (dg, du) = (dev!(s.clone_htod(&g)), dev!(s.clone_htod(&u)));
    let mut dy = dev!(s.alloc_zeros::<f32>(n));
    let k = f("silu_mul")?;
    let n32 = n as i32;
    unsafe {
        s.launch_builder(&k).arg(&dg).arg(&du).arg(&mut dy).arg(&n32).launch(cfg((n.div_ceil(256) as u32, 1), 256))
    }
    .map_err(|e| anyhow!("silu_mul: {e:?}"))?;
    out.push(Check { name: "silu_mul".into(), error: rel_error(&dev!(s.clone_dtoh(&dy)), &want), tolerance: 1e-5 });

    // RoPE, both layouts.
    for interleaved in [1i32, 0] {
        let (rows, heads, hd, maxp) = (4usize, 3usize, 64usize, 32usize);
        let table = crate::engine::backend::RopeTable::new(
            hd,
            10000.0,
            if interleaved == 1 {
                crate::engine::backend::RopeLayout::Interleaved
            } else {
                crate::engine::backend::RopeLayout::Halves
            },
            maxp,
        );
        let x = rng.vec(rows * heads * hd);
        let positions: Vec<u32> = vec![0, 5, 17, 31];
        let mut want = x.clone();
        let half = hd / 2;
        for (row, &p) in positions.iter().enumerate() {
            for h in 0..heads {
                for i in 0..half {
                    let base = row * heads * hd + h * hd;
                    let (a, b) = if interleaved == 1 { (2 * i, 2 * i + 1) } else { (i, i + half) };
                    let (c, sn) = (table.cos[p as usize * half + i], table.sin[p as usize * half + i]);
                    let (x0, x1) = (x[base + a], x[base + b]);
                    want[base + a] = x0 * c - x1 * sn;
                    want[base + b] = x0 * sn + x1 * c;
                }
            }
        }
        let mut dx = dev!(s.clone_htod(&x));
        let (dp, dc, ds) =
            (dev!(s.clone_htod(&positions)), dev!(s.clone_htod(&table.cos)), dev!(s.clone_htod(&table.sin)));
        let k = f("rope")?;
        let (h32, hd32) = (heads as i32, hd as i32);
        unsafe {
            s.launch_builder(&k)
                .arg(&mut dx)
                .arg(&dp)
                .arg(&dc)
                .arg(&ds)
                .arg(&h32)
                .arg(&hd32)
                .arg(&interleaved)
                .launch(cfg((rows as u32, 1), 128))
        }
        .map_err(|e| anyhow!("rope: {e:?}"))?;
        let name = if interleaved == 1 { "rope (interleaved)" } else { "rope (halves)" };
        out.push(Check { name: name.into(), error: rel_error(&dev!(s.clone_dtoh(&dx)), &want), tolerance: 1e-5 });
    }

    // KV write and paged attention (grouped-query), against a scalar softmax attention over
    // f16-rounded keys and values.
    let (heads, kv_heads, hd, bs) = (4usize, 2usize, 64usize, 16usize);
    let width = kv_heads * hd;
    let lens = [37usize, 5];
    let tables: Vec<Vec<u32>> = vec![vec![3, 0, 5], vec![1]];
    let mut batch = crate::engine::backend::ForwardBatch::default();
    let tokens: Vec<Vec<u32>> = lens.iter().map(|&l| (0..l as u32).collect()).collect();
    for (i, t) in tokens.iter().enumerate() {
        batch.push_sequence(t, 0, &tables[i], bs, true);
    }
    let rows = batch.len();
    let (q, kk, vv) = (rng.vec(rows * heads * hd), rng.vec(rows * width), rng.vec(rows * width));
    let slots_total = 8 * bs;
    let (mut kc, mut vc) =
        (dev!(s.alloc_zeros::<u16>(slots_total * width)), dev!(s.alloc_zeros::<u16>(slots_total * width)));
    let (dk, dv, dslots) = (dev!(s.clone_htod(&kk)), dev!(s.clone_htod(&vv)), dev!(s.clone_htod(&batch.slots)));
    let k = f("write_kv")?;
    let w32 = width as i32;
    unsafe {
        s.launch_builder(&k)
            .arg(&dk)
            .arg(&dv)
            .arg(&dslots)
            .arg(&mut kc)
            .arg(&mut vc)
            .arg(&w32)
            .launch(cfg((rows as u32, 1), 128))
    }
    .map_err(|e| anyhow!("write_kv: {e:?}"))?;
    let bt = super::layout::BlockTables::from_batch(&batch);
    let (dq, dtab, drs, dpos) = (
        dev!(s.clone_htod(&q)),
        dev!(s.clone_htod(&bt.tables)),
        dev!(s.clone_htod(&bt.row_seq)),
        dev!(s.clone_htod(&batch.positions)),
    );
    let mut dout = dev!(s.alloc_zeros::<f32>(rows * heads * hd));
    let k = f("paged_attention")?;
    let scale = 1.0 / (hd as f32).sqrt();
    let (h32, kvh32, hd32, bs32, mb32) = (heads as i32, kv_heads as i32, hd as i32, bs as i32, bt.max_blocks as i32);
    unsafe {
        s.launch_builder(&k)
            .arg(&dq)
            .arg(&kc)
            .arg(&vc)
            .arg(&dtab)
            .arg(&drs)
            .arg(&dpos)
            .arg(&mut dout)
            .arg(&h32)
            .arg(&kvh32)
            .arg(&hd32)
            .arg(&bs32)
            .arg(&mb32)
            .arg(&scale)
            .launch(LaunchConfig {
                grid_dim: (rows as u32, heads as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            })
    }
    .map_err(|e| anyhow!("paged_attention: {e:?}"))?;
    let got = dev!(s.clone_dtoh(&dout));
    let f16 = |v: f32| half::f16::from_f32(v).to_f32();
    let mut want = vec![0f32; rows * heads * hd];
    for seq in &batch.seqs {
        for r in seq.start..seq.start + seq.len {
            for h in 0..heads {
                let kvh = h / (heads / kv_heads);
                let qh = &q[r * heads * hd + h * hd..][..hd];
                let keys: Vec<usize> = (seq.start..=r).collect();
                let scores: Vec<f32> = keys
                    .iter()
                    .map(|&j| (0..hd).map(|d| qh[d] * scale * f16(kk[j * width + kvh * hd + d])).sum())
                    .collect();
                let m = scores.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for d in 0..hd {
                    want[r * heads * hd + h * hd + d] =
                        keys.iter().zip(&e).map(|(&j, w)| w * f16(vv[j * width + kvh * hd + d])).sum::<f32>() / z;
                }
            }
        }
    }
    out.push(Check { name: "write_kv + paged_attention".into(), error: rel_error(&got, &want), tolerance: 1e-4 });

    // Token bitmask, softmax, log-softmax, argmax and sampling on a 152k vocabulary.
    let vocab = 151_936usize;
    let rows = 3usize;
    let logits: Vec<f32> = (0..rows * vocab).map(|_| rng.next() * 8.0).collect();
    let words = vocab.div_ceil(32);
    let mut mask = vec![0u32; words];
    for t in (0..vocab).step_by(7) {
        mask[t / 32] |= 1 << (t % 32);
    }
    let packed = super::layout::MaskRows::pack(&[Some(&mask), None, Some(&mask)], vocab)?;
    let mut dl = dev!(s.clone_htod(&logits));
    let (dm, dmr) = (dev!(s.clone_htod(&packed.data)), dev!(s.clone_htod(&packed.rows)));
    let k = f("apply_token_bitmask")?;
    let (v32, wd32) = (vocab as i32, words as i32);
    unsafe {
        s.launch_builder(&k)
            .arg(&mut dl)
            .arg(&dm)
            .arg(&dmr)
            .arg(&v32)
            .arg(&wd32)
            .launch(cfg((vocab.div_ceil(256) as u32, rows as u32), 256))
    }
    .map_err(|e| anyhow!("apply_token_bitmask: {e:?}"))?;
    let masked = dev!(s.clone_dtoh(&dl));
    let mut wrong = 0usize;
    for r in 0..rows {
        for t in 0..vocab {
            let allowed = r == 1 || t % 7 == 0;
            let v = masked[r * vocab + t];
            if allowed != (v == logits[r * vocab + t]) || (!allowed && v != f32::NEG_INFINITY) {
                wrong += 1;
            }
        }
    }
    out.push(Check { name: "apply_token_bitmask".into(), error: wrong as f64, tolerance: 0.0 });

    let k = f("argmax_rows")?;
    let mut dam = dev!(s.alloc_zeros::<u32>(rows));
    unsafe { s.launch_builder(&k).arg(&dl).arg(&mut dam).arg(&v32).launch(cfg((rows as u32, 1), 1024)) }
        .map_err(|e| anyhow!("argmax_rows: {e:?}"))?;
    let am = dev!(s.clone_dtoh(&dam));
    let want_am: Vec<u32> = (0..rows)
        .map(|r| {
            let row = &masked[r * vocab..(r + 1) * vocab];
            let mut best = 0;
            for (i, &v) in row.iter().enumerate() {
                if v > row[best] {
                    best = i;
                }
            }
            best as u32
        })
        .collect();
    out.push(Check {
        name: "argmax_rows".into(),
        error: am.iter().zip(&want_am).filter(|(a, b)| a != b).count() as f64,
        tolerance: 0.0,
    });

    let k = f("softmax_rows")?;
    let temperature = 0.7f32;
    let mut dlp = dev!(s.alloc_zeros::<f32>(rows * vocab));
    let one = 1i32;
    unsafe {
        s.launch_builder(&k)
            .arg(&dl)
            .arg(&mut dlp)
            .arg(&v32)
            .arg(&temperature)
            .arg(&one)
            .launch(cfg((rows as u32, 1), 1024))
    }
    .map_err(|e| anyhow!("softmax_rows: {e:?}"))?;
    let lp = dev!(s.clone_dtoh(&dlp));
    let mut want = vec![f32::NEG_INFINITY; rows * vocab];
    for r in 0..rows {
        let row = &masked[r * vocab..(r + 1) * vocab];
        let m = row.iter().map(|v| v / temperature).fold(f32::NEG_INFINITY, f32::max);
        let lse = m + row.iter().map(|v| (v / temperature - m).exp()).sum::<f32>().ln();
        for t in 0..vocab {
            want[r * vocab + t] = row[t] / temperature - lse;
        }
    }
    let finite = |v: &[f32]| -> Vec<f32> { v.iter().map(|x| if x.is_finite() { *x } else { -1e4 }).collect() };
    out.push(Check {
        name: "softmax_rows (log)".into(),
        error: rel_error(&finite(&lp), &finite(&want)),
        tolerance: 1e-4,
    });

    let zero = 0i32;
    let mut dp = dev!(s.alloc_zeros::<f32>(rows * vocab));
    unsafe {
        s.launch_builder(&k)
            .arg(&dl)
            .arg(&mut dp)
            .arg(&v32)
            .arg(&temperature)
            .arg(&zero)
            .launch(cfg((rows as u32, 1), 1024))
    }
    .map_err(|e| anyhow!("softmax_rows: {e:?}"))?;
    let probs = dev!(s.clone_dtoh(&dp));
    // Sampling: top_k = 1 must give the argmax; with u fixed, no limits, the inverse CDF pick.
    let k = f("sample_rows")?;
    let mut picks = dev!(s.alloc_zeros::<u32>(rows));
    let uniform = vec![0.5f32, 0.25, 0.9];
    let du = dev!(s.clone_htod(&uniform));
    let (top1, no_k, p1, no_min) = (1i32, 0i32, 1.0f32, 0.0f32);
    unsafe {
        s.launch_builder(&k)
            .arg(&dp)
            .arg(&du)
            .arg(&mut picks)
            .arg(&v32)
            .arg(&top1)
            .arg(&p1)
            .arg(&no_min)
            .launch(cfg((rows as u32, 1), 1024))
    }
    .map_err(|e| anyhow!("sample_rows: {e:?}"))?;
    let got = dev!(s.clone_dtoh(&picks));
    out.push(Check {
        name: "sample_rows (top_k = 1)".into(),
        error: got.iter().zip(&want_am).filter(|(a, b)| a != b).count() as f64,
        tolerance: 0.0,
    });
    unsafe {
        s.launch_builder(&k)
            .arg(&dp)
            .arg(&du)
            .arg(&mut picks)
            .arg(&v32)
            .arg(&no_k)
            .arg(&p1)
            .arg(&no_min)
            .launch(cfg((rows as u32, 1), 1024))
    }
    .map_err(|e| anyhow!("sample_rows: {e:?}"))?;
    let got = dev!(s.clone_dtoh(&picks));
    let mut misses = 0usize;
    for r in 0..rows {
        // The pick's CDF interval must contain u (within float rounding of the mass).
        let row = &probs[r * vocab..(r + 1) * vocab];
        let total: f64 = row.iter().map(|&p| p as f64).sum();
        let before: f64 = row[..got[r] as usize].iter().map(|&p| p as f64).sum();
        let target = uniform[r] as f64 * total;
        if !(before <= target + 1e-4 && target <= before + row[got[r] as usize] as f64 + 1e-4) {
            misses += 1;
        }
    }
    out.push(Check { name: "sample_rows (inverse CDF)".into(), error: misses as f64, tolerance: 0.0 });
    s.synchronize().context("synchronize")?;
    Ok((arch, out))
}
