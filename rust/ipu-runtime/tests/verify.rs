//! Verification against the host reference: a correct package passes; a
//! deliberately broken kernel is caught and the checkpoint re-run names the
//! operation (`z`), the tile (1) and the kernel (`add_f32_short`).

mod common;

use expect_test::expect;
use ipu_runtime::verify::{verify_package, VerifyOptions};
use ipu_runtime::{DeviceOptions, FeedSpec, Generate, RunOptions};

fn options(generate: Generate) -> VerifyOptions {
    VerifyOptions {
        run: RunOptions {
            device: DeviceOptions::simulator(2),
            feeds: FeedSpec {
                generate,
                ..FeedSpec::default()
            },
            ..RunOptions::default()
        },
        diagnose: true,
        check_checkpoints: false,
    }
}

#[test]
fn a_correct_package_passes() {
    let report = verify_package(
        common::package(common::Options::default()),
        &options(Generate::Gaussian { seed: 7 }),
    )
    .unwrap();
    assert!(report.passed(), "{report}");
    assert!(report.diagnosis.is_none());
    assert_eq!(report.outputs[0].comparison.checks, 16);
    assert!(report
        .to_string()
        .starts_with("verification of `add_chain` passed\n"));
}

#[test]
fn a_broken_kernel_is_caught_and_localised() {
    let report = verify_package(
        common::package(common::Options {
            broken: true,
            ..common::Options::default()
        }),
        &options(Generate::Gaussian { seed: 7 }),
    )
    .unwrap();
    assert!(!report.passed());
    let out = &report.outputs[0];
    // The short kernel leaves the last pair of row 1 unwritten.
    assert_eq!(out.comparison.mismatches, 2);
    assert_eq!(out.bad_tiles, [1]);
    let d = report.diagnosis.as_ref().expect("a diagnosis");
    assert_eq!(d.value, "z");
    assert_eq!(d.operation, "add");
    assert_eq!(d.local_failed, Some(true));
    assert_eq!(d.check.bad_tiles, [1]);
    assert_eq!(d.kernels, ["add_f32_short"]);
    assert_eq!(d.trail, [("y".to_string(), true), ("z".to_string(), false)]);
    expect![[r#"
        verification of `add_chain` FAILED
        call `initialize`: 649 device cycles (host link: 4 cycles in, 0 out)
        call `run`: 1600 device cycles (host link: 4 cycles in, 3 out)
        output `z`: checks=16 mismatches=2 expected=[-0.306273, 5.963216] max_error=0.829743 at [1, 6] first_mismatch=[1, 6] device=0 reference=0.8297427296638489 cosine=0.996294
          tolerance: |device - reference| <= 6.004963e-7 + 2.384186e-7 * |reference|
          expected: elements in [-3.062729e-1, 5.963216e0]
          largest error at [1, 6]
          first mismatch at [1, 6]: device 0 reference 0.8297427296638489
          mismatches by column (column:count): 6:1 7:1
          tiles holding mismatches: [1]
        first diverging operation: `z` = add(...) on tiles [1], kernel add_f32_short (recomputed from the device's own operands, it still differs)
          `z`: checks=16 mismatches=2 expected=[-0.306273, 5.963216] max_error=0.829743 at [1, 6] first_mismatch=[1, 6] device=0 reference=0.8297427296638489 cosine=0.996294
          checkpoints in order: y:ok z:BAD
        compositional check FAILED at z (each checked against the exact computation from the device's own values before it)
    "#]]
    .assert_eq(&report.to_string());
}

#[test]
fn without_checkpoints_the_report_says_why_there_is_no_diagnosis() {
    let report = verify_package(
        common::package(common::Options {
            broken: true,
            checkpoints: false,
            ..common::Options::default()
        }),
        &options(Generate::Gaussian { seed: 1 }),
    )
    .unwrap();
    assert!(!report.passed());
    assert!(report.diagnosis.is_none());
    assert_eq!(
        report.diagnosis_note.as_deref(),
        Some("the package has no checkpoints.json entry for the `run` call, so intermediate values cannot be read")
    );
}

#[test]
fn the_constant_check_gives_exact_values() {
    // All-ones input, and (rank-2 parameter) b = 1/fan_in = 1/2: z = 2 * 1.5.
    let report = verify_package(
        common::package(common::Options::default()),
        &options(Generate::Constant),
    )
    .unwrap();
    assert!(report.passed(), "{report}");
    assert_eq!(
        report.outputs[0].comparison.expected,
        ipu_reference::Expected::Constant(3.0)
    );
}

#[test]
fn a_package_without_the_model_cannot_be_verified() {
    let e = verify_package(
        common::package(common::Options {
            model: false,
            ..common::Options::default()
        }),
        &options(Generate::Constant),
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "cannot verify: the package has no `model.ipug` member (the compiler embeds the model text there)"
    );
}
