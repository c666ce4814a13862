//! Kernel cache tests: hits, misses by parameter and by included file,
//! corrupt entries rebuilt and errors passed through (the log lines are
//! tests/log.rs).

use ipu_kcache::{default_dir_from, KernelCache, KernelSpec};
use std::path::Path;

const SOURCE: &str = "
        .param K, 16
        .include \"common.inc\"
        .text
        .globl k
k:      setzi $m0, K * SCALE
        exit
";

fn setup(dir: &Path, scale: i64) {
    std::fs::write(dir.join("k.S"), SOURCE).unwrap();
    std::fs::write(dir.join("common.inc"), format!(".equ SCALE, {scale}\n")).unwrap();
}

#[test]
fn hit_miss_and_invalidation() {
    let src = tempfile::tempdir().unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    setup(src.path(), 2);
    let cache = KernelCache::open(cache_dir.path()).unwrap();
    let spec = KernelSpec::new(src.path().join("k.S"), "k16").param("K", 16);
    let a = cache.get_or_build(&spec).unwrap();
    assert!(!a.cached);
    assert_eq!(a.key.len(), 64);
    assert_eq!(
        a.object_path,
        cache_dir
            .path()
            .join("kernels")
            .join(&a.key)
            .join("kernel.o")
    );
    assert_eq!(a.metadata.kernel, "k16");
    assert_eq!(a.metadata.parameters["K"], 16);
    let b = cache.get_or_build(&spec).unwrap();
    assert!(b.cached);
    assert_eq!((b.key.as_str(), &b.object), (a.key.as_str(), &a.object));

    // Another specialisation is another entry.
    let c = cache.get_or_build(&spec.clone().param("K", 32)).unwrap();
    assert!(!c.cached);
    assert_ne!(c.key, a.key);

    // Changing an included file changes the key and the code.
    setup(src.path(), 3);
    let d = cache.get_or_build(&spec).unwrap();
    assert!(!d.cached);
    assert_ne!(d.key, a.key);
    assert_ne!(d.object, a.object);
    // Restoring it finds the first entry again.
    setup(src.path(), 2);
    let e = cache.get_or_build(&spec).unwrap();
    assert!(e.cached);
    assert_eq!(e.key, a.key);
}

#[test]
fn corrupt_entries_are_rebuilt() {
    let src = tempfile::tempdir().unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    setup(src.path(), 2);
    let cache = KernelCache::open(cache_dir.path()).unwrap();
    let spec = KernelSpec::new(src.path().join("k.S"), "k");
    let a = cache.get_or_build(&spec).unwrap();
    let mut bytes = std::fs::read(&a.object_path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xFF;
    std::fs::write(&a.object_path, &bytes).unwrap();
    let b = cache.get_or_build(&spec).unwrap();
    assert!(!b.cached, "a corrupt entry must be rebuilt");
    assert_eq!(b.object, a.object);
    std::fs::remove_file(b.object_path.parent().unwrap().join("digest")).unwrap();
    assert!(!cache.get_or_build(&spec).unwrap().cached);
    assert!(cache.get_or_build(&spec).unwrap().cached);
    // No temporary directories are left behind.
    let leftovers: Vec<_> = std::fs::read_dir(cache_dir.path().join("kernels"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".tmp")
        })
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn assembler_errors_pass_through() {
    let src = tempfile::tempdir().unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    std::fs::write(src.path().join("bad.S"), ".text\n  frob $m0\n").unwrap();
    let cache = KernelCache::open(cache_dir.path()).unwrap();
    let e = cache
        .get_or_build(&KernelSpec::new(src.path().join("bad.S"), "bad"))
        .unwrap_err();
    assert!(
        e.to_string()
            .ends_with("bad.S:2:3: error: unknown mnemonic `frob`"),
        "{e}"
    );
}

#[test]
fn default_directory() {
    assert_eq!(
        default_dir_from(Some("/x".into()), Some("/h".into())),
        Some("/x/ipu-stack".into())
    );
    assert_eq!(
        default_dir_from(None, Some("/h".into())),
        Some("/h/.cache/ipu-stack".into())
    );
    assert_eq!(default_dir_from(Some("".into()), None), None);
}
