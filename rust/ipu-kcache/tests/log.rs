//! The kernel cache's log lines read like the seed log's. A test binary
//! of its own: tests that run on other threads of one process register
//! the same log callsites without a subscriber, and one that registers a
//! callsite first can leave it cached as uninteresting, so this test's
//! log lost lines (CI in session 21, a local run in session 26).

use ipu_kcache::{KernelCache, KernelSpec};
use std::io::Write;
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);
impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn logs_like_the_seed() {
    let src = tempfile::tempdir().unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    std::fs::write(
        src.path().join("k.S"),
        ".text\n        .globl k\nk:      setzi $m0, 2\n        exit\n",
    )
    .unwrap();
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        // A callsite keeps the interest cached when it was registered;
        // rebuilding the cache with this subscriber in scope asks it.
        tracing::callsite::rebuild_interest_cache();
        let cache = KernelCache::open(cache_dir.path()).unwrap();
        cache
            .get_or_build(&KernelSpec::new(src.path().join("k.S"), "k"))
            .unwrap();
    });
    let log = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("compiling kernel") && log.contains("name=k") && log.contains("target=ipu21"),
        "{log}"
    );
    assert!(
        log.contains("kernel artifact created")
            && log.contains("/kernel.o")
            && log.contains("/kernel.json"),
        "{log}"
    );
}
