//! The CUDA side of the engine, built with no CUDA toolkit: cudarc loads the driver and NVRTC
//! at run time, so this compiles and its host-side parts run on any machine.
//!
//! What is here:
//! - [`KERNELS`], the CUDA C source of every kernel the CUDA backend runs (embedding gather,
//!   RMSNorm fused with the residual add, RoPE in both layouts, SiLU-and-multiply, KV-cache
//!   write by slot, paged attention for decode, chunk and prefill rows alike, the token
//!   bitmask, softmax and log-softmax, argmax, and top-k/top-p/min-p sampling without a sort);
//! - [`nvrtc`]: compiling that source straight to CUBIN for a device architecture, cached on
//!   disk by source hash, architecture and NVRTC version;
//! - [`layout`]: the host-side data layouts the kernels take (mask rows, padded block tables,
//!   CUDA-graph batch buckets), tested here.
//!
//! Not here yet (never run on a GPU): the `Backend` implementation over these kernels and
//! cuBLAS, graph capture, and `--device`. `scripts/gpu-check.sh` is the script to run on a
//! machine with a GPU to check them; see the note in that script.

pub mod check;
pub mod layout;
pub mod nvrtc;

/// The CUDA C source of the kernels.
pub const KERNELS: &str = include_str!("kernels.cu");

/// The entry points [`KERNELS`] defines, in source order.
pub const KERNEL_NAMES: [&str; 11] = [
    "embedding_gather",
    "rms_norm_residual",
    "rope",
    "silu_mul",
    "add_assign",
    "write_kv",
    "paged_attention",
    "apply_token_bitmask",
    "softmax_rows",
    "argmax_rows",
    "sample_rows",
];

/// Whether the CUDA driver library (`libcuda.so`) can be loaded. cudarc panics on first use
/// without it, so callers check this first.
pub fn driver_available() -> bool {
    // SAFETY: only tries to load the library; no CUDA call is made.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether the NVRTC library (`libnvrtc.so`) can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to load the library; no NVRTC call is made.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}
