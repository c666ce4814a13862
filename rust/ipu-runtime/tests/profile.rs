//! Execution profiles: written by a run, read back, consistent with the
//! simulator's counters, attributed to calls, phases, operations and
//! kernels, and queried.

mod common;

use expect_test::expect;
use ipu_runtime::profile::html::grouped;
use ipu_runtime::profile::{render, GroupBy, Profile};
use ipu_runtime::{run, DeviceOptions, FeedSpec, Generate, RunOptions};

fn profile_of(o: common::Options) -> (Profile, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let package = common::write(dir.path(), "p.ipupkg", &common::package(o));
    let out = dir.path().join("p.ipuprofile");
    let options = RunOptions {
        device: DeviceOptions::simulator(2),
        feeds: FeedSpec {
            generate: Generate::Gaussian { seed: 3 },
            ..FeedSpec::default()
        },
        profile: Some(out.clone()),
        ..RunOptions::default()
    };
    let report = run(&package, &options).unwrap();
    let read = Profile::read(&out).unwrap();
    assert_eq!(Some(&read), report.profile.as_ref());
    (read, dir)
}

#[test]
fn profile_is_consistent_with_the_step_counters() {
    let (p, dir) = profile_of(common::Options::default());
    assert_eq!(p.format, "ipuprofile");
    assert_eq!(p.tile_count, 2);
    // The digest is the package's own manifest digest member.
    let pkg = ipu_package::Package::read(&dir.path().join("p.ipupkg")).unwrap();
    let tar_digest = blake3::hash(
        format!(
            "{}\n",
            serde_json::to_string_pretty(&pkg.manifest().unwrap()).unwrap()
        )
        .as_bytes(),
    );
    assert_eq!(p.package_digest, tar_digest.to_hex().to_string());
    // Steps are contiguous from cycle 0 and add up to the total.
    let mut at = 0;
    for s in &p.steps {
        assert_eq!(s.start_cycle, at, "step {}", s.index);
        at = s.end_cycle;
        // The slowest tile accounts for the whole step.
        let slowest = (0..2)
            .map(|t| s.compute[t] + s.sync[t] + s.exchange[t] + s.host[t])
            .max()
            .unwrap();
        assert_eq!(slowest, s.end_cycle - s.start_cycle, "step {}", s.index);
    }
    assert_eq!(at, p.total_cycles);
    // load (idle hsync), initialize (1 step), run (2 steps).
    let calls: Vec<(&str, usize, Option<&str>, Option<&str>)> = p
        .steps
        .iter()
        .map(|s| {
            (
                s.call.as_str(),
                s.call_step,
                s.phase.as_deref(),
                s.operation.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("load", 0, None, None),
            ("initialize", 0, Some("upload parameters"), None),
            ("run", 0, Some("add y"), Some("y")),
            ("run", 1, Some("add z"), Some("z")),
        ]
    );
    // Host cycles appear exactly at the host syncs that moved bytes:
    // load's idle hsync carries b (64 B) + 2 command words.
    assert_eq!(
        p.steps[0].host[0],
        ipu_arch::host_transfer_cycles(72, p.clock_hz)
    );
    assert_eq!(p.steps[2].host, [0, 0]);
    assert_eq!(p.memory_source, "package images");
    assert!(p
        .memory
        .iter()
        .any(|m| m.tile == 1 && m.region == "region0" && m.category == "image"));
    // Rows of x, b and z: 3 x 32 bytes.
    assert!(p
        .memory
        .iter()
        .any(|m| m.tile == 0 && m.region == "region1" && m.category == "host_io" && m.bytes == 96));
    assert!(p.notes.is_empty(), "{:?}", p.notes);
}

#[test]
fn queries_group_by_kernel_operation_phase_and_tile() {
    let (p, _dir) = profile_of(common::Options {
        broken: true,
        ..common::Options::default()
    });
    let kernels = p.query(GroupBy::Kernel, None);
    let names: Vec<&str> = kernels.iter().map(|r| r.key.as_str()).collect();
    assert!(
        names.contains(&"add_f32") && names.contains(&"add_f32_short"),
        "{names:?}"
    );
    let short = kernels.iter().find(|r| r.key == "add_f32_short").unwrap();
    assert_eq!((short.steps, short.tiles), (1, 1));
    // The short kernel does one iteration fewer than add_f32 on tile 0 in
    // the same step, so it takes fewer compute cycles.
    let step_z = &p.steps[3];
    assert!(step_z.compute[1] < step_z.compute[0]);
    let ops = p.query(GroupBy::Operation, None);
    assert_eq!(
        ops.iter().map(|r| r.key.as_str()).collect::<Vec<_>>().len(),
        3,
        "y, z and (none): {ops:?}"
    );
    let total: u64 = p.query(GroupBy::Call, None).iter().map(|r| r.cycles).sum();
    assert_eq!(total, p.total_cycles);
    let top = p.query(GroupBy::Tile, Some(1));
    assert_eq!(top.len(), 1);
    assert_eq!(top[0].cycles, p.total_cycles);
    let phases = render(&p.query(GroupBy::Phase, Some(2)));
    assert_eq!(phases.lines().count(), 3);
    expect![[r#"
        group                                  cycles        compute           sync       exchange           host  steps  tiles
    "#]]
    .assert_eq(phases.lines().next().map(|l| format!("{l}\n")).as_deref().unwrap());
}

#[test]
fn a_schedule_that_does_not_match_is_reported_not_guessed() {
    let mut package = common::package(common::Options::default());
    package.members.insert(
        "schedule.json".to_string(),
        br#"{"format_version": 1, "calls": [{"call": "run", "steps": [{"operation": "y"}]}]}"#
            .to_vec(),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = common::write(dir.path(), "p.ipupkg", &package);
    let out = dir.path().join("p.ipuprofile");
    run(
        &path,
        &RunOptions {
            device: DeviceOptions::simulator(2),
            profile: Some(out.clone()),
            ..RunOptions::default()
        },
    )
    .unwrap();
    let p = Profile::read(&out).unwrap();
    assert_eq!(
        p.notes,
        ["call `run`: schedule.json lists 1 steps but the run took 2; operations and kernels not attributed"]
    );
    assert!(p.steps.iter().all(|s| s.operation.is_none()));
}

#[test]
fn bad_profile_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.ipuprofile");
    std::fs::write(&path, "{}").unwrap();
    let e = Profile::read(&path).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "profile {}: not an ipuprofile: missing field",
            path.display()
        )),
        "{e}"
    );
    // Version 1 (before the steps' estimates) still reads; a later one
    // does not.
    let (p, _dir) = profile_of(common::Options::default());
    let mut json: serde_json::Value = serde_json::from_str(&p.to_json()).unwrap();
    json["version"] = 1.into();
    std::fs::write(&path, json.to_string()).unwrap();
    assert_eq!(Profile::read(&path).unwrap().version, 1);
    json["version"] = 3.into();
    std::fs::write(&path, json.to_string()).unwrap();
    let e = Profile::read(&path).unwrap_err().to_string();
    assert!(
        e.contains("version 3 is not ipuprofile version 1 to 2"),
        "{e}"
    );
}

/// Checks that every element of `page` is closed in order (the page is
/// written as XHTML-compatible markup: void elements end with `/>`), and
/// returns the number of elements.
fn balanced_elements(page: &str) -> usize {
    let mut open: Vec<&str> = Vec::new();
    let mut count = 0;
    let mut rest = page;
    while let Some(i) = rest.find('<') {
        rest = &rest[i + 1..];
        let end = rest.find('>').expect("a tag is closed");
        let tag = &rest[..end];
        rest = &rest[end + 1..];
        if tag.starts_with('!') {
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            let top = open
                .pop()
                .unwrap_or_else(|| panic!("</{name}> closes nothing"));
            assert_eq!(top, name, "</{name}> closes <{top}>");
        } else {
            count += 1;
            let name = tag.split([' ', '/']).next().unwrap();
            assert!(!name.is_empty(), "an empty tag: <{tag}>");
            if !tag.ends_with('/') {
                open.push(name);
            }
        }
    }
    assert!(open.is_empty(), "left open: {open:?}");
    count
}

#[test]
fn the_html_view_shows_every_call_step_group_and_memory_total() {
    let (p, dir) = profile_of(common::Options::default());
    let page = ipu_runtime::profile::html::render_html(&p);
    assert!(balanced_elements(&page) > 50);
    // The same profile, read back from its file, gives the same page.
    let again = Profile::read(&dir.path().join("p.ipuprofile")).unwrap();
    assert_eq!(ipu_runtime::profile::html::render_html(&again), page);
    for c in &p.calls {
        assert!(
            page.contains(&format!("<tr><td class=\"k\">{}</td>", c.call)),
            "call {}",
            c.call
        );
    }
    for s in &p.steps {
        let tooltip = format!(
            "step {} ({} step {}, {}): {} cycles",
            s.index,
            s.call,
            s.call_step,
            s.kind,
            grouped(s.end_cycle - s.start_cycle)
        );
        assert!(page.contains(&tooltip), "{tooltip}");
    }
    for by in [GroupBy::Operation, GroupBy::Kernel, GroupBy::Phase] {
        for row in p.query(by, None) {
            assert!(
                page.contains(&format!(
                    "<tr><td class=\"k\">{}</td><td>{}</td>",
                    row.key,
                    grouped(row.cycles)
                )),
                "{by:?} row {}",
                row.key
            );
        }
    }
    // Each region's total row adds up the profile's memory entries.
    for region in ["region0", "region1"] {
        let total: u64 = p
            .memory
            .iter()
            .filter(|m| m.region == region)
            .map(|m| m.bytes)
            .sum();
        if total == 0 {
            continue;
        }
        let at = page.find(&format!("<h3>{region}")).unwrap();
        let row = &page[at..][page[at..].find("<th class=\"k\">all</th>").unwrap()..];
        let figure = row["<th class=\"k\">all</th><th>".len()..]
            .split('<')
            .next()
            .unwrap();
        assert_eq!(
            figure.replace(',', "").parse::<u64>().unwrap(),
            total,
            "{region}"
        );
    }
}
