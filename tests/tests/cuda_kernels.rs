//! The CUDA kernels compile with NVRTC to CUBIN for the GPUs dspark targets, with no GPU and
//! no CUDA toolkit: NVRTC comes from the PyPI wheel that scripts/test.sh fetches
//! (scripts/fetch-nvrtc.sh) and puts on LD_LIBRARY_PATH.

use dspark_host::engine::backend::cuda::nvrtc::{CubinCache, compile_cubin};
use dspark_host::engine::backend::cuda::{KERNEL_NAMES, KERNELS, nvrtc_available};

fn need_nvrtc() {
    assert!(
        nvrtc_available(),
        "libnvrtc.so.12 cannot be loaded: run scripts/test.sh, which fetches it (scripts/fetch-nvrtc.sh) and puts build/nvrtc/lib on LD_LIBRARY_PATH"
    );
}

#[test]
fn every_kernel_compiles_to_cubin_for_ampere_and_hopper() {
    need_nvrtc();
    for arch in ["sm_80", "sm_90"] {
        let cubin = compile_cubin(KERNELS, arch).unwrap_or_else(|e| panic!("{arch}: {e:#}"));
        assert!(cubin.starts_with(b"\x7fELF"), "{arch}: a CUBIN is an ELF image");
        for name in KERNEL_NAMES {
            let found =
                cubin.windows(name.len() + 1).any(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0);
            assert!(found, "{arch}: the CUBIN has no entry point `{name}`");
        }
    }
}

#[test]
fn compile_errors_carry_the_nvrtc_log_and_the_cache_recompiles_what_is_stale() {
    need_nvrtc();
    let e = compile_cubin("extern \"C\" __global__ void k() { undefined_thing(); }", "sm_90").unwrap_err();
    let text = format!("{e:#}");
    assert!(text.contains("NVRTC could not compile") && text.contains("undefined_thing"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let cache = CubinCache::new(dir.path());
    let src = "extern \"C\" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }";
    let (first, cached) = cache.get_or_compile(src, "sm_90").unwrap();
    assert!(!cached);
    let (again, cached) = cache.get_or_compile(src, "sm_90").unwrap();
    assert!(cached && again == first);
    // Another architecture or another source is another entry.
    assert_ne!(cache.path(src, "sm_80").unwrap(), cache.path(src, "sm_90").unwrap());
    assert_ne!(cache.path(src, "sm_90").unwrap(), cache.path(KERNELS, "sm_90").unwrap());
    // The file name says what it holds.
    let name = cache.path(src, "sm_90").unwrap().file_name().unwrap().to_string_lossy().into_owned();
    assert!(name.contains("-sm_90-nvrtc12.") && name.ends_with(".cubin"), "{name}");
    // A torn file is not loaded: it is compiled again and replaced.
    std::fs::write(cache.path(src, "sm_90").unwrap(), b"garbage").unwrap();
    let (fixed, cached) = cache.get_or_compile(src, "sm_90").unwrap();
    assert!(!cached && fixed == first);
}
