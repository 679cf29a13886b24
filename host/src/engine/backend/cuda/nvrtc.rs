//! Run-time compilation of [`super::KERNELS`] to CUBIN with NVRTC, cached on disk.
//!
//! CUBIN, not PTX: PTX is JIT-compiled by the driver, which refuses PTX newer than itself, a
//! classic failure when the NVRTC in use is newer than the installed driver. CUBIN for the
//! device's exact architecture (`sm_90` for an H100/H200) runs on any driver that supports
//! the device. The cache key is the SHA-256 of the source and options, the architecture and
//! the NVRTC version, so a new source, device or NVRTC compiles again and nothing stale loads.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use cudarc::nvrtc::{result, sys};
use sha2::{Digest, Sha256};

/// Options every compile uses: fast math off (sampling and softmax must match the CPU within
/// tolerance), C++17.
pub const OPTIONS: [&str; 2] = ["--std=c++17", "--fmad=true"];

/// The NVRTC version as (major, minor).
pub fn version() -> anyhow::Result<(i32, i32)> {
    if !super::nvrtc_available() {
        bail!(
            "the NVRTC library (libnvrtc.so.12) cannot be loaded; install the CUDA toolkit or the PyPI wheel nvidia-cuda-nvrtc-cu12 and put its lib/ on LD_LIBRARY_PATH"
        );
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }.result().map_err(|e| anyhow!("nvrtcVersion: {e:?}"))?;
    Ok((major, minor))
}

/// Whether `arch` names a real architecture (`sm_80`, `sm_90`, `sm_90a`, ...): CUBIN needs one.
pub fn valid_arch(arch: &str) -> bool {
    arch.strip_prefix("sm_").is_some_and(|n| {
        let digits = n.trim_end_matches('a');
        !digits.is_empty() && digits.len() <= 3 && digits.bytes().all(|b| b.is_ascii_digit())
    })
}

/// Compiles `source` to CUBIN for `arch`; a compile error carries NVRTC's log.
pub fn compile_cubin(source: &str, arch: &str) -> anyhow::Result<Vec<u8>> {
    if !valid_arch(arch) {
        bail!("`{arch}` is not a real GPU architecture (sm_80, sm_90, ...); CUBIN needs one");
    }
    version()?;
    let src = CString::new(source).context("the kernel source holds a NUL byte")?;
    let name = CString::new("dspark_kernels.cu").unwrap_or_default();
    let prog = result::create_program(&src, Some(&name)).map_err(|e| anyhow!("nvrtcCreateProgram: {e:?}"))?;
    let mut options: Vec<String> = OPTIONS.iter().map(|o| o.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    // SAFETY: `prog` is a live program; the option strings outlive the call.
    let compiled = unsafe { result::compile_program(prog, &options) };
    let out = match compiled {
        Err(e) => {
            // SAFETY: `prog` is live; the log is a NUL-terminated buffer NVRTC filled.
            let log = unsafe { result::get_program_log(prog) }
                .map(|raw| unsafe { CStr::from_ptr(raw.as_ptr()) }.to_string_lossy().into_owned())
                .unwrap_or_default();
            Err(anyhow!("NVRTC could not compile the kernels for {arch} ({e:?}):\n{log}"))
        }
        Ok(()) => cubin(prog),
    };
    // SAFETY: `prog` is live and not used after this.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

fn cubin(prog: sys::nvrtcProgram) -> anyhow::Result<Vec<u8>> {
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; `size` is an out-parameter.
    unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }.result().map_err(|e| anyhow!("nvrtcGetCUBINSize: {e:?}"))?;
    if size == 0 {
        bail!("NVRTC produced no CUBIN (was a virtual architecture given?)");
    }
    let mut buf = vec![0u8; size];
    // SAFETY: `buf` has the size NVRTC reported.
    unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast()) }
        .result()
        .map_err(|e| anyhow!("nvrtcGetCUBIN: {e:?}"))?;
    Ok(buf)
}

/// CUBINs on disk, by source hash, architecture, options and NVRTC version.
pub struct CubinCache {
    dir: PathBuf,
}

impl CubinCache {
    /// A cache in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The file a compile of `source` for `arch` by the loaded NVRTC is kept in:
    /// `<hash of source and options>-<arch>-nvrtc<major>.<minor>.cubin`.
    pub fn path(&self, source: &str, arch: &str) -> anyhow::Result<PathBuf> {
        let (major, minor) = version()?;
        Ok(self.dir.join(format!("{}-{arch}-nvrtc{major}.{minor}.cubin", source_hash(source))))
    }

    /// The CUBIN of `source` for `arch`, compiled now or read from the cache; `true` when it
    /// came from the cache. Without NVRTC (a GPU machine with only the driver), a CUBIN of the
    /// same source and architecture compiled elsewhere (`scripts/gpu-check.sh prepare`) is used.
    pub fn get_or_compile(&self, source: &str, arch: &str) -> anyhow::Result<(Vec<u8>, bool)> {
        if !super::nvrtc_available() {
            let prefix = format!("{}-{arch}-nvrtc", source_hash(source));
            let found = std::fs::read_dir(&self.dir).ok().into_iter().flatten().flatten().find_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                (name.starts_with(&prefix) && name.ends_with(".cubin")).then(|| e.path())
            });
            return match found.and_then(|p| std::fs::read(p).ok()).filter(|b| is_elf(b)) {
                Some(bytes) => Ok((bytes, true)),
                None => Err(anyhow!(
                    "no NVRTC to compile the kernels for {arch}, and no CUBIN for them in {}; compile one where NVRTC is (dspark cuda-check --compile-only --arch {arch})",
                    self.dir.display()
                )),
            };
        }
        let path = self.path(source, arch)?;
        if let Ok(bytes) = std::fs::read(&path)
            && is_elf(&bytes)
        {
            return Ok((bytes, true));
        }
        let bytes = compile_cubin(source, arch)?;
        write_atomically(&path, &bytes)?;
        Ok((bytes, false))
    }
}

/// The hash of a source with the compile options, hex, 32 digits.
fn source_hash(source: &str) -> String {
    let mut h = Sha256::new();
    for part in [source, &OPTIONS.join(" ")] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(&h.finalize()[..16])
}

/// CUBIN files are ELF images; anything else in the cache is a torn or foreign file.
fn is_elf(bytes: &[u8]) -> bool {
    bytes.starts_with(b"\x7fELF")
}

fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let dir = path.parent().ok_or_else(|| anyhow!("{} has no parent folder", path.display()))?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot rename {} into place", tmp.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architectures_are_checked_before_nvrtc_is_needed() {
        assert!(valid_arch("sm_90") && valid_arch("sm_90a") && valid_arch("sm_100") && valid_arch("sm_80"));
        assert!(!valid_arch("compute_90") && !valid_arch("sm_") && !valid_arch("sm_9x") && !valid_arch("90"));
        let e = compile_cubin("", "compute_90").unwrap_err();
        assert!(e.to_string().contains("not a real GPU architecture"), "{e}");
    }
}
