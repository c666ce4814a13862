//! The compiler reads kernels from a Bazel `*.library.json` index (the
//! output format of the lead's `ipu_kernel_library` rule), and the tile
//! images it links are the same as with kernels assembled from device/.

use ipu_compiler::{compile, Accumulation, CompileOptions, KernelSource};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo or bazel sets it"))
        .join("../..")
}

/// Assembles `source` with `params` into `dir/<name>.o` and `.json`, as `ipu-as` does for Bazel.
fn assemble(dir: &Path, name: &str, source: &str, params: &[(&str, i64)]) -> serde_json::Value {
    let mut opts = ipu_asm::Options {
        name: Some(name.to_string()),
        ..Default::default()
    };
    for (k, v) in params {
        opts.defines.insert(k.to_string(), *v);
    }
    let out = ipu_asm::assemble_file(&root().join("device").join(source), &opts)
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(
        dir.join(format!("{name}.o")),
        out.object.to_bytes().unwrap(),
    )
    .unwrap();
    std::fs::write(dir.join(format!("{name}.json")), out.metadata.to_json()).unwrap();
    serde_json::json!({
        "name": name,
        "arch": "ipu21",
        "source": format!("device/{source}"),
        "object": format!("{name}.o"),
        "metadata": format!("{name}.json"),
        "params": params.iter().map(|(k, v)| (k.to_string(), serde_json::json!(v.to_string()))).collect::<serde_json::Map<_, _>>(),
    })
}

#[test]
fn compiles_from_a_bazel_kernel_library_index() {
    let dir = tempfile::tempdir().unwrap();
    let entries = vec![
        assemble(dir.path(), "gemm_f16", "gemm_f16.S", &[]),
        assemble(dir.path(), "gemm_f16_acc32", "gemm_f16.S", &[("ACC", 32)]),
        assemble(dir.path(), "reduce_f32", "reduce_f32.S", &[]),
        assemble(
            dir.path(),
            "reduce_f32_out32",
            "reduce_f32.S",
            &[("OUT", 32)],
        ),
        // The f16-partials reduce that sums bounded f16 chains.
        assemble(
            dir.path(),
            "reduce_f32_in16",
            "reduce_f32.S",
            &[("EPI", 0), ("IN", 16), ("OUT", 16)],
        ),
        // Its f16 sum (ACC=16), which the compiler prefers without an
        // epilogue; the ACC=32 object above must still match only its own
        // requests (they name ACC).
        assemble(
            dir.path(),
            "reduce_f32_acc16",
            "reduce_f32.S",
            &[("ACC", 16), ("EPI", 0), ("IN", 16), ("OUT", 16)],
        ),
        // The f16 sum with two partials per load, which a streamed GEMM's
        // reduce-scatter takes where it is faster (PAIRS=1; every other
        // object records PAIRS=0).
        assemble(
            dir.path(),
            "reduce_f32_acc16_pairs",
            "reduce_f32.S",
            &[
                ("ACC", 16),
                ("EPI", 0),
                ("IN", 16),
                ("OUT", 16),
                ("PAIRS", 1),
            ],
        ),
        // The supervisor runtime, which every tile links.
        assemble(dir.path(), "supervisor", "supervisor.S", &[]),
    ];
    let index = dir.path().join("kernels.library.json");
    std::fs::write(
        &index,
        serde_json::to_string_pretty(&serde_json::json!({"kernels": entries})).unwrap(),
    )
    .unwrap();

    let cache = tempfile::tempdir().unwrap();
    for model in ["models/gemm_small.ipug", "models/gemm.ipug"] {
        let from_index = compile(&CompileOptions::new(
            root().join(model),
            16,
            KernelSource::Index(index.clone()),
        ))
        .unwrap();
        let from_sources = compile(&CompileOptions::new(
            root().join(model),
            16,
            KernelSource::Sources {
                device_dir: root().join("device"),
                cache_dir: Some(cache.path().to_path_buf()),
            },
        ))
        .unwrap();
        assert_eq!(
            from_index.package.tiles, from_sources.package.tiles,
            "{model}"
        );
        assert_eq!(
            from_index.package.info, from_sources.package.info,
            "{model}"
        );
    }

    // An index without the specialisation a GEMM needs is an error naming both.
    let only16 = dir.path().join("only16.library.json");
    std::fs::write(
        &only16,
        serde_json::json!({"kernels": [entries[0].clone()]}).to_string(),
    )
    .unwrap();
    let e = match compile(&CompileOptions::new(
        root().join("models/gemm.ipug"),
        16,
        KernelSource::Index(only16),
    )) {
        Ok(_) => panic!("compiled without the ACC=32 specialisation"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("gemm_f16 ACC=32") && e.contains("only16.library.json"),
        "{e}"
    );
}

/// The compiler uses a specialisation when the library has one and plans
/// without it otherwise, naming it in the report: a streamed f16 GEMM
/// splits K over tiles only with reduce_f32 IN=16, and sums the K parts in
/// f16 with ACC=16.
#[test]
fn the_report_names_specialisations_that_would_help() {
    let dir = tempfile::tempdir().unwrap();
    let base = vec![
        assemble(dir.path(), "gemm_f16", "gemm_f16.S", &[]),
        assemble(dir.path(), "supervisor", "supervisor.S", &[]),
    ];
    let with = {
        let mut v = base.clone();
        v.push(assemble(
            dir.path(),
            "reduce_f32_in16",
            "reduce_f32.S",
            &[("IN", 16)],
        ));
        v
    };
    let with_sum = {
        let mut v = with.clone();
        v.push(assemble(
            dir.path(),
            "reduce_f32_acc16",
            "reduce_f32.S",
            &[("ACC", 16), ("IN", 16)],
        ));
        v
    };
    let model = root().join("models/gemm_stream_small.ipug");
    let mut reports = Vec::new();
    for (name, entries) in [("without", base), ("with", with), ("with_sum", with_sum)] {
        let index = dir.path().join(format!("{name}.library.json"));
        std::fs::write(&index, serde_json::json!({"kernels": entries}).to_string()).unwrap();
        let mut opts = CompileOptions::new(&model, 64, KernelSource::Index(index));
        opts.accumulation = Accumulation::F16;
        let out = compile(&opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        reports.push(out.report);
    }
    let helps = &reports[0]["specialisations_that_would_help"];
    assert_eq!(helps.as_array().map(Vec::len), Some(1), "{helps}");
    assert!(
        helps[0]["kernel"].as_str().unwrap().contains("IN=16"),
        "{helps}"
    );
    assert_eq!(
        reports[0]["operations"][0]["chosen"]["stream"]["k_parts"],
        1
    );
    // With the f32 sum of f16 partials the plan splits K, and the report
    // names the f16 sum (ACC=16) that would sum them faster; with both,
    // nothing is missing.
    let helps = &reports[1]["specialisations_that_would_help"];
    assert_eq!(helps.as_array().map(Vec::len), Some(1), "{helps}");
    assert!(
        helps[0]["kernel"].as_str().unwrap().contains("ACC=16"),
        "{helps}"
    );
    assert_eq!(
        reports[2]["specialisations_that_would_help"],
        serde_json::json!([])
    );
    for report in &reports[1..] {
        assert!(
            report["operations"][0]["chosen"]["stream"]["k_parts"]
                .as_u64()
                .unwrap()
                > 1
        );
    }
    assert!(reports[2]["operations"][0]["kernel"]
        .as_str()
        .unwrap()
        .contains("ACC=16"));
}

/// Assembled from sources, a request naming a parameter its source does
/// not declare is missing (the assembler takes any -D as a constant and
/// would otherwise build the default code under the request's name).
#[test]
fn sources_refuse_a_parameter_the_source_does_not_declare() {
    use ipu_compiler::library::{KernelLibrary, KernelRequest};
    let cache = tempfile::tempdir().unwrap();
    let mut library = KernelLibrary::open(&KernelSource::Sources {
        device_dir: root().join("device"),
        cache_dir: Some(cache.path().to_path_buf()),
    })
    .unwrap();
    let request = |params: &[(&str, i64)]| KernelRequest {
        entry: "copy64".into(),
        source: "copy64.S".into(),
        params: params.iter().map(|&(k, v)| (k.to_string(), v)).collect(),
    };
    library.get(&request(&[])).unwrap_or_else(|e| panic!("{e}"));
    let e = match library.get(&request(&[("ACC", 16)])) {
        Ok(k) => panic!("copy64 ACC=16 loaded {}", k.origin),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("copy64") && e.contains("ACC=16"), "{e}");
}

/// A library without a kernel that the column attention layout needs costs
/// the attention that layout, and the report says which kernel and why
/// (a Bazel library listed by hand once left out fill32, and every Bazel
/// package then took the row layout without a word in its report).
#[test]
fn a_missing_column_layout_kernel_is_named_in_the_report() {
    let without = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(root().join("device")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        let is_source = path.extension().is_some_and(|e| e == "S" || e == "inc");
        if is_source && name != "fill32.S" {
            std::fs::copy(&path, without.path().join(name)).unwrap();
        }
    }
    let model = root().join("models/attention_stream_small.ipug");
    let cache = tempfile::tempdir().unwrap();
    let report = |device_dir: PathBuf| {
        let mut opts = CompileOptions::new(
            &model,
            64,
            KernelSource::Sources {
                device_dir,
                cache_dir: Some(cache.path().to_path_buf()),
            },
        );
        // Row plans that accumulate P V into O (session 60) edge out the
        // column layout by the attention's own estimate here; with the
        // merge the column layout wins, which is what this test needs.
        opts.attention_accumulate = Some(false);
        compile(&opts).unwrap_or_else(|e| panic!("{e}")).report
    };
    let whole = report(root().join("device"));
    assert_eq!(whole["attention"]["chosen"]["layout"], "columns");
    assert_eq!(
        whole["specialisations_that_would_help"],
        serde_json::json!([])
    );
    let lacking = report(without.path().to_path_buf());
    assert_eq!(lacking["attention"]["chosen"]["layout"], "rows");
    let helps = &lacking["specialisations_that_would_help"];
    assert_eq!(helps.as_array().map(Vec::len), Some(1), "{helps}");
    assert_eq!(helps[0]["kernel"], "fill32", "{helps}");
    assert_eq!(helps[0]["value"], "o", "{helps}");
    assert!(
        helps[0]["why"]
            .as_str()
            .unwrap()
            .contains("column attention layout"),
        "{helps}"
    );
}

/// Under Bazel, the real //device:kernels library gives the packages that
/// kernels assembled from device/ give: every kernel the compiler asks of
/// these models is in the library with the parameters it asks for (the
/// library once lacked fill32, and Bazel-built attention silently took the
/// row layout). Outside Bazel there is no built library to read, and the
/// test says so and checks nothing.
#[test]
fn the_bazel_library_builds_what_device_sources_build() {
    if std::env::var_os("TEST_SRCDIR").is_none() {
        eprintln!("not under Bazel: //device:kernels is not built, nothing to compare");
        return;
    }
    // The index names its files by execution-root paths
    // (bazel-out/<config>/bin/device/...); in the test's runfiles they sit
    // at device/..., so the test writes an index with those paths.
    let built = root().join("device/kernels.library.json");
    let mut index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&built).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (the test's data must include //device:kernels)",
                built.display()
            )
        }))
        .unwrap();
    let runfile = |p: &serde_json::Value| -> serde_json::Value {
        let p = p.as_str().expect("a path");
        let short = p.split_once("/bin/").map_or(p, |(_, s)| s);
        serde_json::json!(root()
            .join(short)
            .canonicalize()
            .unwrap_or_else(|e| panic!("{short}: {e}")))
    };
    let kernels = index["kernels"].as_array_mut().expect("a kernel list");
    assert!(kernels.len() > 60, "{} kernels", kernels.len());
    for k in kernels {
        k["object"] = runfile(&k["object"]);
        k["metadata"] = runfile(&k["metadata"]);
    }
    let dir = tempfile::tempdir().unwrap();
    let rewritten = dir.path().join("kernels.library.json");
    std::fs::write(&rewritten, index.to_string()).unwrap();
    let cache = tempfile::tempdir().unwrap();
    for (model, tiles) in [
        ("models/attention_stream_small.ipug", 64),
        ("models/attention_causal_small.ipug", 64),
        ("models/vit_block_small.ipug", 64),
        ("models/mlp_small_fp8.ipug", 64),
        ("models/gemm_stream_small.ipug", 64),
    ] {
        let from_library = compile(&CompileOptions::new(
            root().join(model),
            tiles,
            KernelSource::Index(rewritten.clone()),
        ))
        .unwrap_or_else(|e| panic!("{model}: {e}"));
        let from_sources = compile(&CompileOptions::new(
            root().join(model),
            tiles,
            KernelSource::Sources {
                device_dir: root().join("device"),
                cache_dir: Some(cache.path().to_path_buf()),
            },
        ))
        .unwrap_or_else(|e| panic!("{model}: {e}"));
        assert_eq!(
            from_library.report["specialisations_that_would_help"],
            serde_json::json!([]),
            "{model}"
        );
        assert!(
            from_library.package.tiles == from_sources.package.tiles,
            "{model}: the Bazel library's tile images differ from device/'s"
        );
        assert_eq!(
            from_library.package.info, from_sources.package.info,
            "{model}"
        );
    }
}
