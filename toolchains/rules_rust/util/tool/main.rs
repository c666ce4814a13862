//! rules_rust_tool: the process wrapper and Cargo build-script runner of our Rust rules.
//!
//! Bazel runs every action in a directory whose absolute path differs between
//! sandboxes, output bases and machines. Rust outputs must not depend on that
//! path, and build-script results recorded in one action must stay valid in the
//! next. So every path that would be absolute is written as `${pwd}/...` in
//! files and arguments, and this tool replaces `${pwd}` with the action's working
//! directory just before running rustc or a build script.
//!
//! Modes:
//!   rules_rust_tool [--subst-pwd] [--arg-file F]... [--env-file F]... [--env K=V]... -- PROGRAM ARGS...
//!   rules_rust_tool build-script --script S --manifest-dir D --out-dir O --rustc R
//!       --flags-out F --env-out F --dep-env-out F [--links NAME] [--pkg-name N]
//!       [--version V] [--feature F]... [--dep-env-file F]... [--env K=V]...
//!
//! It uses only std, because it is built before any other crate.

use std::collections::BTreeMap;
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{exit, Command, Stdio};

fn die(message: String) -> ! {
    eprintln!("rules_rust_tool: {message}");
    exit(2)
}

fn pwd() -> String {
    env::current_dir()
        .unwrap_or_else(|e| die(format!("cannot read the working directory: {e}")))
        .to_string_lossy()
        .into_owned()
}

fn read(path: &str) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| die(format!("cannot read {path}: {e}")))
}

fn subst(text: &str, pwd: &str) -> String {
    text.replace("${pwd}", pwd)
}

/// Parses `KEY=VALUE` lines; blank lines are skipped.
fn parse_env_lines(text: &str, origin: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| match l.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => die(format!("{origin}: expected KEY=VALUE, found {l:?}")),
        })
        .collect()
}

fn main() {
    let args: Vec<String> = env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("build-script") {
        build_script(&args[1..]);
    } else {
        wrap(&args);
    }
}

fn wrap(args: &[String]) {
    let pwd = pwd();
    let mut extra_args = Vec::new();
    let mut envs: Vec<(String, String)> = Vec::new();
    let mut subst_pwd = false;
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--subst-pwd" => subst_pwd = true,
            "--arg-file" => {
                i += 1;
                extra_args.extend(read(&args[i]).lines().filter(|l| !l.is_empty()).map(String::from));
            }
            "--env-file" => {
                i += 1;
                envs.extend(parse_env_lines(&read(&args[i]), &args[i]));
            }
            "--env" => {
                i += 1;
                envs.extend(parse_env_lines(&args[i], "--env"));
            }
            "--" => {
                i += 1;
                break;
            }
            other => die(format!("unknown argument {other:?}")),
        }
        i += 1;
    }
    if i >= args.len() {
        die("no program after --".into());
    }
    let fix = |s: &str| if subst_pwd { subst(s, &pwd) } else { s.to_string() };
    let program = fix(&args[i]);
    let mut command = Command::new(&program);
    command.args(args[i + 1..].iter().map(|a| fix(a)));
    command.args(extra_args.iter().map(|a| fix(a)));
    for (k, v) in &envs {
        command.env(k, fix(v));
    }
    let status = command
        .status()
        .unwrap_or_else(|e| die(format!("cannot run {program}: {e}")));
    exit(status.code().unwrap_or(1));
}

struct BuildScriptArgs {
    script: String,
    manifest_dir: String,
    out_dir: String,
    rustc: String,
    flags_out: String,
    env_out: String,
    dep_env_out: String,
    links: Option<String>,
    pkg_name: String,
    version: String,
    features: Vec<String>,
    dep_env_files: Vec<String>,
    env: Vec<(String, String)>,
}

fn parse_build_script_args(args: &[String]) -> BuildScriptArgs {
    let mut parsed = BuildScriptArgs {
        script: String::new(),
        manifest_dir: String::new(),
        out_dir: String::new(),
        rustc: String::new(),
        flags_out: String::new(),
        env_out: String::new(),
        dep_env_out: String::new(),
        links: None,
        pkg_name: String::new(),
        version: "0.0.0".into(),
        features: Vec::new(),
        dep_env_files: Vec::new(),
        env: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .unwrap_or_else(|| die(format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--script" => parsed.script = value(),
            "--manifest-dir" => parsed.manifest_dir = value(),
            "--out-dir" => parsed.out_dir = value(),
            "--rustc" => parsed.rustc = value(),
            "--flags-out" => parsed.flags_out = value(),
            "--env-out" => parsed.env_out = value(),
            "--dep-env-out" => parsed.dep_env_out = value(),
            "--links" => parsed.links = Some(value()),
            "--pkg-name" => parsed.pkg_name = value(),
            "--version" => parsed.version = value(),
            "--feature" => parsed.features.push(value()),
            "--dep-env-file" => parsed.dep_env_files.push(value()),
            "--env" => {
                let v = value();
                parsed.env.extend(parse_env_lines(&v, "--env"));
            }
            other => die(format!("build-script: unknown argument {other:?}")),
        }
    }
    parsed
}

/// The CARGO_CFG_* variables Cargo derives from `rustc --print cfg`.
fn cfg_env(rustc: &str, sysroot: &str) -> BTreeMap<String, String> {
    let output = Command::new(rustc)
        .args(["--print", "cfg", "--sysroot", sysroot, "-Copt-level=3"])
        .output()
        .unwrap_or_else(|e| die(format!("cannot run {rustc} --print cfg: {e}")));
    if !output.status.success() {
        die(format!("{rustc} --print cfg failed: {}", String::from_utf8_lossy(&output.stderr)));
    }
    let mut values: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k, v.trim_matches('"').to_string()),
            None => (line, String::new()),
        };
        let entry = values.entry(format!("CARGO_CFG_{}", key.to_uppercase())).or_default();
        if !value.is_empty() {
            entry.push(value);
        }
    }
    values.into_iter().map(|(k, v)| (k, v.join(","))).collect()
}

fn absolute(pwd: &str, path: &str) -> String {
    if Path::new(path).is_absolute() {
        path.to_string()
    } else {
        format!("{pwd}/{path}")
    }
}

/// Writes a path found in build-script output so that it survives a change of sandbox.
fn relocatable(text: &str, pwd: &str) -> String {
    text.replace(pwd, "${pwd}")
}

fn build_script(args: &[String]) {
    let a = parse_build_script_args(args);
    let pwd = pwd();
    let rustc = absolute(&pwd, &a.rustc);
    let sysroot = Path::new(&rustc)
        .parent()
        .and_then(Path::parent)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let out_dir = absolute(&pwd, &a.out_dir);
    let manifest_dir = absolute(&pwd, &a.manifest_dir);
    fs::create_dir_all(&out_dir).unwrap_or_else(|e| die(format!("cannot create {out_dir}: {e}")));

    let mut command = Command::new(absolute(&pwd, &a.script));
    command.current_dir(&manifest_dir);
    command.stdin(Stdio::null());
    let target = "x86_64-unknown-linux-gnu";
    let (major, minor, patch, pre) = split_version(&a.version);
    let prefix_map = format!("-ffile-prefix-map={pwd}=.");
    let mut env: BTreeMap<String, String> = BTreeMap::from([
        ("CARGO".into(), "cargo".into()),
        ("CARGO_MANIFEST_DIR".into(), manifest_dir.clone()),
        ("CARGO_PKG_NAME".into(), a.pkg_name.clone()),
        ("CARGO_PKG_VERSION".into(), a.version.clone()),
        ("CARGO_PKG_VERSION_MAJOR".into(), major),
        ("CARGO_PKG_VERSION_MINOR".into(), minor),
        ("CARGO_PKG_VERSION_PATCH".into(), patch),
        ("CARGO_PKG_VERSION_PRE".into(), pre),
        ("CARGO_PKG_AUTHORS".into(), String::new()),
        ("CARGO_PKG_DESCRIPTION".into(), String::new()),
        ("CARGO_ENCODED_RUSTFLAGS".into(), String::new()),
        ("OUT_DIR".into(), out_dir.clone()),
        ("TARGET".into(), target.into()),
        ("HOST".into(), target.into()),
        ("NUM_JOBS".into(), "1".into()),
        ("OPT_LEVEL".into(), "3".into()),
        ("DEBUG".into(), "false".into()),
        ("PROFILE".into(), "release".into()),
        ("RUSTC".into(), rustc.clone()),
        ("RUSTC_WRAPPER".into(), String::new()),
        ("RUSTDOC".into(), String::new()),
        // C compiled by build scripts (blake3, zstd-sys) must not embed the
        // sandbox path either.
        ("CFLAGS".into(), prefix_map.clone()),
        ("CXXFLAGS".into(), prefix_map.clone()),
        ("ASMFLAGS".into(), prefix_map),
    ]);
    if let Some(links) = &a.links {
        env.insert("CARGO_MANIFEST_LINKS".into(), links.clone());
    }
    env.extend(cfg_env(&rustc, &sysroot));
    for feature in &a.features {
        env.insert(
            format!("CARGO_FEATURE_{}", feature.to_uppercase().replace('-', "_")),
            "1".into(),
        );
    }
    for file in &a.dep_env_files {
        for (k, v) in parse_env_lines(&read(file), file) {
            env.insert(k, subst(&v, &pwd));
        }
    }
    for (k, v) in &a.env {
        env.insert(k.clone(), subst(v, &pwd));
    }
    command.envs(&env);
    let output = command
        .output()
        .unwrap_or_else(|e| die(format!("cannot run build script {}: {e}", a.script)));
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        eprintln!("{stdout}");
        eprintln!("{}", String::from_utf8_lossy(&output.stderr));
        die(format!("build script of {} failed with {}", a.pkg_name, output.status));
    }

    let mut flags = Vec::new();
    let mut rustc_env = vec![format!("OUT_DIR=${{pwd}}/{}", a.out_dir)];
    let mut dep_env = Vec::new();
    let links_prefix = a
        .links
        .as_ref()
        .map(|l| format!("DEP_{}_", l.to_uppercase().replace('-', "_")));
    for line in stdout.lines() {
        let Some(rest) = line.strip_prefix("cargo::").or_else(|| line.strip_prefix("cargo:")) else {
            continue;
        };
        let Some((key, value)) = rest.split_once('=') else { continue };
        let value = relocatable(value, &pwd);
        match key {
            "rustc-cfg" => flags.push(format!("--cfg={value}")),
            "rustc-check-cfg" | "rerun-if-changed" | "rerun-if-env-changed" => {}
            "rustc-link-lib" => flags.push(format!("-l{value}")),
            "rustc-link-search" => flags.push(format!("-L{value}")),
            "rustc-flags" => flags.extend(value.split_whitespace().map(String::from)),
            "rustc-env" => rustc_env.push(value),
            "rustc-link-arg" | "rustc-link-arg-bins" | "rustc-link-arg-tests"
            | "rustc-link-arg-benches" | "rustc-link-arg-examples" | "rustc-cdylib-link-arg" => {
                // Link arguments apply to the final binary; libraries carry none.
            }
            "warning" => eprintln!("warning ({}): {value}", a.pkg_name),
            "error" => die(format!("build script of {}: {value}", a.pkg_name)),
            "metadata" => {
                if let (Some(prefix), Some((k, v))) = (&links_prefix, value.split_once('=')) {
                    dep_env.push(format!("{prefix}{}={v}", k.to_uppercase().replace('-', "_")));
                }
            }
            other => {
                // The old single-colon form `cargo:KEY=VALUE` is metadata too.
                if let Some(prefix) = &links_prefix {
                    dep_env.push(format!("{prefix}{}={value}", other.to_uppercase().replace('-', "_")));
                }
            }
        }
    }
    write(&a.flags_out, &flags);
    write(&a.env_out, &rustc_env);
    write(&a.dep_env_out, &dep_env);
}

fn write(path: &str, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    if let Some(parent) = PathBuf::from(path).parent() {
        let _ = fs::create_dir_all(parent);
    }
    fs::write(path, text).unwrap_or_else(|e| die(format!("cannot write {path}: {e}")));
}

fn split_version(version: &str) -> (String, String, String, String) {
    let core = version.split('+').next().unwrap_or("");
    let (core, pre) = core.split_once('-').unwrap_or((core, ""));
    let mut parts = core.split('.').map(String::from);
    (
        parts.next().unwrap_or_else(|| "0".into()),
        parts.next().unwrap_or_else(|| "0".into()),
        parts.next().unwrap_or_else(|| "0".into()),
        pre.to_string(),
    )
}
