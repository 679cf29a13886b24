//! `dspark cuda-check`: the kernels on a GPU against their CPU references.

use std::path::PathBuf;
use std::process::ExitCode;

use dspark_host::engine::backend::cuda::check;
use dspark_host::plugin::RuntimeConfig;

/// Options of `dspark cuda-check`.
#[derive(Debug, clap::Args)]
pub struct CudaCheckArgs {
    /// The CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Where compiled kernels are cached (default: STATE_DIR/cubin).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Only compile the kernels for ARCH into the cache (needs NVRTC, no GPU): how a GPU
    /// machine without NVRTC gets its CUBIN.
    #[arg(long, requires = "arch")]
    compile_only: bool,
    /// The architecture to compile for with --compile-only (sm_80, sm_90, ...).
    #[arg(long)]
    arch: Option<String>,
}

/// Runs the checks; exit 0 only when every kernel is within tolerance.
pub fn run(args: CudaCheckArgs) -> anyhow::Result<ExitCode> {
    let dir = match args.cache_dir {
        Some(d) => d,
        None => RuntimeConfig::default_state_dir()?.join("cubin"),
    };
    if let (true, Some(arch)) = (args.compile_only, &args.arch) {
        let cache = dspark_host::engine::backend::cuda::nvrtc::CubinCache::new(&dir);
        let (cubin, cached) = cache.get_or_compile(dspark_host::engine::backend::cuda::KERNELS, arch)?;
        println!(
            "{} ({} bytes, {})",
            cache.path(dspark_host::engine::backend::cuda::KERNELS, arch)?.display(),
            cubin.len(),
            if cached { "cached" } else { "compiled" }
        );
        return Ok(ExitCode::SUCCESS);
    }
    let (arch, checks) = check::run(args.device, &dir)?;
    println!("device {} ({arch})", args.device);
    println!("{:<32} {:>12} {:>12}  verdict", "kernel", "error", "tolerance");
    let mut ok = true;
    for c in &checks {
        ok &= c.passed();
        println!(
            "{:<32} {:>12.3e} {:>12.1e}  {}",
            c.name,
            c.error,
            c.tolerance,
            if c.passed() { "ok" } else { "FAIL" }
        );
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
