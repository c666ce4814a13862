//! Fuzz-style robustness: thousands of seeded mutations and truncations of a
//! valid package, at the compressed level and at the tar level. Every one must
//! give an error or, if the mutation only touched bytes the format ignores,
//! exactly the original package; none may panic.

mod common;

use ipu_package::Package;

fn mutate(rng: &mut common::Rng, bytes: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    match rng.index(5) {
        0 => {
            let i = rng.index(b.len());
            b[i] ^= 1 << rng.index(8);
        }
        1 => {
            for _ in 0..1 + rng.index(8) {
                let i = rng.index(b.len());
                b[i] = rng.next_u64() as u8;
            }
        }
        2 => b.truncate(rng.index(b.len())),
        3 => {
            let i = rng.index(b.len());
            let n = 1 + rng.index(16);
            b.splice(i..i, (0..n).map(|_| rng.next_u64() as u8));
        }
        _ => {
            let i = rng.index(b.len());
            let n = (1 + rng.index(64)).min(b.len() - i);
            b.drain(i..i + n);
        }
    }
    b
}

#[test]
fn mutated_packages_fail_cleanly() {
    let original = common::sample();
    let compressed = original.to_bytes().unwrap();
    let tar = original.to_tar().unwrap();
    let mut rng = common::Rng(0x1234_5678);
    let (mut errors, mut benign) = (0, 0);
    for _ in 0..3000 {
        match Package::from_bytes(&mutate(&mut rng, &compressed)) {
            Err(e) => {
                assert!(!e.to_string().is_empty());
                errors += 1;
            }
            Ok(p) => {
                assert!(
                    p == original,
                    "a mutation was accepted as a different package"
                );
                benign += 1;
            }
        }
    }
    // The zstd frame checksum covers the whole archive.
    assert!(
        errors > 2990,
        "compressed: {errors} errors, {benign} benign"
    );

    let (mut errors, mut benign) = (0, 0);
    for _ in 0..3000 {
        match Package::from_tar(&mutate(&mut rng, &tar)) {
            Err(_) => errors += 1,
            Ok(p) => {
                assert!(
                    p == original,
                    "a mutation was accepted as a different package"
                );
                benign += 1;
            }
        }
    }
    // Mutations of tar padding and of unchecked header fields (mtime, owner)
    // are benign; everything else must be caught.
    assert!(errors > 1500, "tar: {errors} errors, {benign} benign");
}

#[test]
fn every_truncation_fails() {
    let compressed = common::sample().to_bytes().unwrap();
    for len in 0..compressed.len() {
        assert!(
            Package::from_bytes(&compressed[..len]).is_err(),
            "truncated to {len} bytes was accepted"
        );
    }
    let tar = common::sample().to_tar().unwrap();
    // The tar ends with two zero blocks that carry no data; cutting into the
    // last member's data or earlier must fail.
    let data_end = tar.len() - 1024;
    for len in (0..data_end).step_by(7) {
        assert!(
            Package::from_tar(&tar[..len]).is_err(),
            "tar truncated to {len} bytes was accepted"
        );
    }
}
