//! Sets `KEEL_LAUNCHER_BUILD`: a hash of this crate's source files (`src/`), the id a sandbox
//! launcher checks against the host's so that a `keel-sandbox-launcher` of another build refuses
//! to run (see `sandbox::LAUNCHER_BUILD`). Deterministic: the same sources give the same id.

use std::hash::{Hash, Hasher};
use std::path::Path;

fn walk(dir: &Path, files: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            walk(&path, files);
        } else {
            files.push(path);
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
    let mut files = Vec::new();
    walk(Path::new("src"), &mut files);
    files.push("Cargo.toml".into());
    files.sort();
    // FNV-1a over path and content: stable across Rust versions, unlike std's hasher.
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    for file in &files {
        file.to_string_lossy().hash(&mut h);
        std::fs::read(file).unwrap_or_default().hash(&mut h);
    }
    println!(
        "cargo:rustc-env=KEEL_LAUNCHER_BUILD={}-{:016x}",
        std::env::var("CARGO_PKG_VERSION").unwrap_or_default(),
        h.0
    );
}

struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}
