//! Embeds the guest SDK's sources and the contract's WIT files, so that `dspark plugins new`
//! can write a plugin crate that builds anywhere, against the SDK this binary speaks to.

use std::fmt::Write as _;
use std::path::Path;

fn main() {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest_dir).parent().expect("the server crate is inside the workspace");
    let mut out = String::new();
    for (name, dir, ext) in [("SDK_SOURCES", "guest-sdk/src", "rs"), ("WIT_FILES", "wit/0.1.0", "wit")] {
        let dir = root.join(dir);
        println!("cargo:rerun-if-changed={}", dir.display());
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == ext))
            .collect();
        files.sort();
        writeln!(out, "/// Files of `{}`: (name, contents).", dir.display()).unwrap();
        writeln!(out, "pub const {name}: &[(&str, &str)] = &[").unwrap();
        for f in files {
            let file = f.file_name().and_then(|n| n.to_str()).expect("a UTF-8 file name");
            writeln!(out, "    ({file:?}, include_str!({:?})),", f.display().to_string()).unwrap();
        }
        writeln!(out, "];").unwrap();
    }
    let dest = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("embedded_sdk.rs");
    std::fs::write(&dest, out).expect("write the embedded SDK list");
}
