//! A self-contained HTML view of a profile (`ipu profile html`): the calls,
//! a BSP timeline of every call's steps, a per-tile BSP view (compute,
//! sync, exchange and host time of every tile in every step), the cycles
//! grouped by operation, kernel, phase and tile, memory per tile by region
//! and category, and a table of the steps.
//!
//! The page is one file with inline CSS and SVG and no script, so that it
//! opens anywhere (no network on the machines that run the simulator) and
//! the same profile always gives the same bytes. Every name taken from the
//! profile is escaped: operation and phase names come from the model.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use ipu_arch::Region;

use super::{GroupBy, Profile, ProfileStep, QueryRow};

/// Width of the plots' drawing area in pixels.
const PLOT_WIDTH: f64 = 1100.0;
/// Left margin of the plots (row labels).
const LEFT: f64 = 70.0;
/// At most this many rows in a per-tile BSP view; more tiles share a row.
const MAX_TILE_ROWS: usize = 256;
/// At most this many columns in a memory chart; more tiles share a column.
const MAX_MEMORY_COLUMNS: usize = 368;
/// Height of a memory chart's bars at full region capacity.
const MEMORY_HEIGHT: f64 = 180.0;

const COMPUTE: &str = "#3e9e4a";
const SYNC: &str = "#d7d7d7";
const EXCHANGE: &str = "#2f6fd0";
const HOST: &str = "#e8912d";

/// Colours for operations and memory categories, picked by index so that
/// the same names always get the same colours.
const PALETTE: [&str; 12] = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac", "#86bcb6", "#d37295",
];

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}\
h1{font-size:1.4em}h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ccc}\
h3{font-size:1em}table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0}\
td,th{border:1px solid #ddd;padding:2px 6px;text-align:right;vertical-align:top}\
th{background:#f3f3f3}td.k,th.k{text-align:left;max-width:60em;overflow-wrap:anywhere}\
.bar{display:inline-block;height:0.8em;background:#4e79a7}\
.legend span{display:inline-block;margin-right:1.2em}\
.sw{display:inline-block;width:0.9em;height:0.9em;margin-right:0.3em;vertical-align:-0.1em}\
svg{display:block;margin:0.4em 0}svg text{font-size:10px;fill:#444}\
p.note{font-size:0.85em;color:#555;max-width:70em}";

/// Escapes text for HTML element content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A number with thousands separators, as the page (and the docs) write
/// cycle counts.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A pixel coordinate with one decimal: enough for a plot, and the same
/// text on every machine (no float formatting differences in the last
/// digits).
fn px(x: f64) -> String {
    format!("{:.1}", (x * 10.0).round() / 10.0)
}

/// A pixel coordinate in tenths of a pixel, so that bars of equal
/// rounded extent compare equal.
fn tenths(x: f64) -> i64 {
    (x * 10.0).round() as i64
}

/// The text of a coordinate in tenths of a pixel.
fn from_tenths(t: i64) -> String {
    format!("{}.{}", t / 10, t % 10)
}

/// The tiles that share one row or column when `count` tiles must fit in
/// `max` rows: consecutive ranges of `per` tiles.
fn tile_groups(count: usize, max: usize) -> (usize, usize) {
    let per = count.div_ceil(max.max(1)).max(1);
    (per, count.div_ceil(per))
}

/// Steps in runs of one call name (`load`, each call, `exit`), in order.
fn call_runs(steps: &[ProfileStep]) -> Vec<&[ProfileStep]> {
    let mut runs = Vec::new();
    let mut start = 0;
    for i in 1..=steps.len() {
        if i == steps.len() || steps[i].call != steps[start].call {
            if i > start {
                runs.push(&steps[start..i]);
            }
            start = i;
        }
    }
    runs
}

/// A short label for a step: its operation, or its phase's first item.
fn step_label(s: &ProfileStep) -> String {
    if let Some(op) = &s.operation {
        return op.clone();
    }
    match &s.phase {
        Some(phase) => phase.split(';').next().unwrap_or("").trim().to_string(),
        None => s.kind.clone(),
    }
}

/// The tile whose compute is the step's longest (the lowest such tile).
fn slowest_tile(s: &ProfileStep) -> Option<(usize, u64)> {
    s.compute
        .iter()
        .copied()
        .enumerate()
        .filter(|&(_, c)| c > 0)
        .fold(None, |best, (t, c)| match best {
            Some((_, b)) if b >= c => best,
            _ => Some((t, c)),
        })
}

/// The whole page.
pub fn render_html(p: &Profile) -> String {
    let mut h = String::new();
    let model = escape(&p.model);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n\
         <title>Profile of {model}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n\
         <h1>Execution profile of <code>{model}</code></h1>\n"
    );
    summary(&mut h, p);
    calls(&mut h, p);
    let _ = writeln!(h, "<h2>BSP steps</h2>");
    let _ = writeln!(
        h,
        "<p class=\"note\">For each call, its steps in order along the cycles (coloured by \
         operation), and below them every tile's time in each step: compute from the step's \
         start, then waiting for the slowest tile and the sync, then the exchange (or the host \
         transfer of a host sync) up to the step's end. White is a tile with nothing to do in \
         the step. Hover over a step for its figures.</p>"
    );
    legend(
        &mut h,
        &[
            (COMPUTE, "compute"),
            (SYNC, "waiting and sync"),
            (EXCHANGE, "exchange"),
            (HOST, "host transfer"),
        ],
    );
    let order = operation_colours(p);
    let by_colour: Vec<(&str, &str)> = order.iter().map(|(op, c)| (*c, op.as_str())).collect();
    let _ = writeln!(
        h,
        "<p class=\"note\">Steps by operation (the step's graph value, else its phase):</p>"
    );
    legend(&mut h, &by_colour);
    let colours: BTreeMap<String, &'static str> = order.iter().cloned().collect();
    for run in call_runs(&p.steps) {
        bsp_view(&mut h, p, run, &colours);
    }
    for (title, by, top, note) in [
        (
            "Cycles by operation",
            GroupBy::Operation,
            None,
            "cycles: the durations of the operation's steps",
        ),
        (
            "Cycles by kernel",
            GroupBy::Kernel,
            None,
            "cycles: the slowest of the kernel's tiles in each step, summed",
        ),
        (
            "Cycles by phase",
            GroupBy::Phase,
            None,
            "cycles: the durations of the phase's steps",
        ),
        (
            "Busiest tiles",
            GroupBy::Tile,
            Some(16),
            "cycles: the tile's compute, sync, exchange and host time over all steps",
        ),
    ] {
        query_table(&mut h, title, note, &p.query(by, top));
    }
    estimates(&mut h, p);
    memory(&mut h, p);
    liveness(&mut h, p);
    step_table(&mut h, p);
    if !p.notes.is_empty() {
        let _ = writeln!(h, "<h2>Notes</h2>\n<ul>");
        for n in &p.notes {
            let _ = writeln!(h, "<li>{}</li>", escape(n));
        }
        let _ = writeln!(h, "</ul>");
    }
    h.push_str("</body>\n</html>\n");
    h
}

fn summary(h: &mut String, p: &Profile) {
    let _ = writeln!(h, "<table>");
    for (k, v) in [
        ("device", escape(&p.device)),
        (
            "package digest (BLAKE3 of the manifest)",
            escape(&p.package_digest),
        ),
        ("tiles", grouped(p.tile_count as u64)),
        ("device cycles in the profile", grouped(p.total_cycles)),
        (
            "clock for host link cycles",
            format!("{} Hz", grouped(p.clock_hz)),
        ),
        ("BSP steps", grouped(p.steps.len() as u64)),
        ("memory figures from", escape(&p.memory_source)),
    ] {
        let _ = writeln!(
            h,
            "<tr><th class=\"k\">{k}</th><td class=\"k\">{v}</td></tr>"
        );
    }
    let _ = writeln!(h, "</table>");
}

fn calls(h: &mut String, p: &Profile) {
    let _ = writeln!(
        h,
        "<h2>Calls</h2>\n<table>\n<tr><th class=\"k\">call</th><th>steps</th>\
         <th>device cycles</th><th>host link in</th><th>host link out</th>\
         <th>device time</th></tr>"
    );
    for c in &p.calls {
        let micros = if p.clock_hz > 0 {
            format!("{:.1} µs", c.device_cycles as f64 * 1e6 / p.clock_hz as f64)
        } else {
            String::new()
        };
        let _ = writeln!(
            h,
            "<tr><td class=\"k\">{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&c.call),
            if c.checkpoint { " (checkpoints)" } else { "" },
            c.end_step.saturating_sub(c.first_step),
            grouped(c.device_cycles),
            grouped(c.host_in_cycles),
            grouped(c.host_out_cycles),
            micros
        );
    }
    let _ = writeln!(h, "</table>");
}

fn legend(h: &mut String, items: &[(&str, &str)]) {
    let _ = write!(h, "<p class=\"legend\">");
    for (colour, name) in items {
        let _ = write!(
            h,
            "<span><span class=\"sw\" style=\"background:{colour}\"></span>{}</span>",
            escape(name)
        );
    }
    let _ = writeln!(h, "</p>");
}

/// Step labels in order of first appearance, each with its palette colour.
fn operation_colours(p: &Profile) -> Vec<(String, &'static str)> {
    let mut colours: Vec<(String, &'static str)> = Vec::new();
    for s in &p.steps {
        let label = step_label(s);
        if !colours.iter().any(|(l, _)| *l == label) {
            colours.push((label, PALETTE[colours.len() % PALETTE.len()]));
        }
    }
    colours
}

/// Axis ticks at multiples of 1, 2 or 5 times a power of ten, about six
/// over `span` cycles.
fn ticks(span: u64) -> Vec<u64> {
    let span = span.max(1);
    let mut step = 1u64;
    'outer: loop {
        for m in [1, 2, 5] {
            if span / (step * m) <= 6 {
                step *= m;
                break 'outer;
            }
        }
        step *= 10;
    }
    (0..=span / step).map(|i| i * step).collect()
}

/// One call's timeline and per-tile view.
fn bsp_view(
    h: &mut String,
    p: &Profile,
    run: &[ProfileStep],
    colours: &BTreeMap<String, &'static str>,
) {
    let t0 = run[0].start_cycle;
    let span = run
        .last()
        .map(|s| s.end_cycle)
        .unwrap_or(t0)
        .saturating_sub(t0)
        .max(1);
    let x = |cycle: u64| LEFT + (cycle.saturating_sub(t0)) as f64 * PLOT_WIDTH / span as f64;
    let tiles = p.tile_count as usize;
    let (per_row, rows) = tile_groups(tiles, MAX_TILE_ROWS);
    let row_px = (480.0 / rows.max(1) as f64).floor().clamp(2.0, 8.0);
    let timeline_y = 4.0;
    let timeline_h = 22.0;
    let tiles_y = timeline_y + timeline_h + 22.0;
    let height = tiles_y + rows as f64 * row_px + 4.0;
    let _ = writeln!(
        h,
        "<h3>{}: {} cycles, {} steps</h3>",
        escape(&run[0].call),
        grouped(span),
        run.len()
    );
    let _ = writeln!(
        h,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-size=\"10\">",
        px(LEFT + PLOT_WIDTH + 10.0),
        px(height)
    );
    // The timeline: one bar per step.
    for s in run {
        let (x0, x1) = (x(s.start_cycle), x(s.end_cycle));
        let label = step_label(s);
        let colour = colours.get(&label).copied().unwrap_or(PALETTE[0]);
        let _ = writeln!(
            h,
            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{colour}\" stroke=\"#fff\" stroke-width=\"0.5\"><title>{}</title></rect>",
            px(x0),
            px(timeline_y),
            px((x1 - x0).max(0.2)),
            px(timeline_h),
            step_tooltip(s)
        );
        // Name the step on its bar when the name fits (about 6 pixels a
        // character at this font size).
        if (x1 - x0) > 6.0 * label.chars().count() as f64 + 6.0 {
            let _ = writeln!(
                h,
                "<text x=\"{}\" y=\"{}\" fill=\"#fff\" style=\"fill:#fff\" pointer-events=\"none\">{}</text>",
                px(x0 + 3.0),
                px(timeline_y + 14.0),
                escape(&label)
            );
        }
    }
    let axis_y = timeline_y + timeline_h + 12.0;
    for t in ticks(span) {
        let _ = writeln!(
            h,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
            px(x(t0 + t)),
            px(axis_y),
            grouped(t)
        );
    }
    let _ = writeln!(
        h,
        "<text x=\"2\" y=\"{}\">steps</text>\n<text x=\"2\" y=\"{}\">tiles</text>",
        px(timeline_y + 14.0),
        px(tiles_y + 10.0)
    );
    if per_row > 1 {
        let _ = writeln!(
            h,
            "<text x=\"2\" y=\"{}\">{} a row</text>",
            px(tiles_y + 22.0),
            per_row
        );
    }
    // The per-tile view: for each step, rows of tiles with equal bars are
    // drawn as one rectangle, so that a step in which most tiles do the
    // same adds a few elements, not one per tile.
    for s in run {
        let (x0, x1) = (x(s.start_cycle), x(s.end_cycle));
        let wall = (s.end_cycle - s.start_cycle).max(1) as f64;
        let cells: Vec<Option<[i64; 3]>> = (0..rows)
            .map(|row| {
                let ts = row * per_row..((row + 1) * per_row).min(tiles);
                let at = |v: &[u64], t: usize| v.get(t).copied().unwrap_or(0);
                let active = ts.clone().any(|t| {
                    at(&s.compute, t) + at(&s.sync, t) + at(&s.exchange, t) + at(&s.host, t) > 0
                });
                if !active {
                    return None;
                }
                let n = ts.len() as f64;
                let mean = |v: &[u64]| ts.clone().map(|t| at(v, t)).sum::<u64>() as f64 / n;
                let w = x1 - x0;
                let share = |v: &[u64]| w * (mean(v) / wall).min(1.0);
                let compute_end = x0 + share(&s.compute);
                let exchange_start = (x1 - share(&s.exchange)).max(x0);
                let host_start = (exchange_start - share(&s.host)).max(x0);
                Some([compute_end, host_start, exchange_start].map(tenths))
            })
            .collect();
        let mut r = 0;
        while r < rows {
            let mut end = r + 1;
            while end < rows && cells[end] == cells[r] {
                end += 1;
            }
            if let Some([compute_end, host_start, exchange_start]) = cells[r] {
                let y = tiles_y + r as f64 * row_px;
                let height = (end - r) as f64 * row_px;
                let (start, stop) = (tenths(x0), tenths(x1));
                for (from, to, colour) in [
                    (start, stop, SYNC),
                    (start, compute_end, COMPUTE),
                    (host_start, exchange_start, HOST),
                    (exchange_start, stop, EXCHANGE),
                ] {
                    if to > from {
                        let _ = writeln!(
                            h,
                            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{colour}\"/>",
                            from_tenths(from),
                            px(y),
                            from_tenths(to - from),
                            px(height)
                        );
                    }
                }
            }
            r = end;
        }
        // A transparent cover over the step's column carries its figures.
        let _ = writeln!(
            h,
            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" pointer-events=\"all\"><title>{}</title></rect>",
            px(x0),
            px(tiles_y),
            px((x1 - x0).max(0.2)),
            px(rows as f64 * row_px),
            step_tooltip(s)
        );
    }
    let _ = writeln!(h, "</svg>");
}

/// The figures of one step, for a tooltip (escaped).
fn step_tooltip(s: &ProfileStep) -> String {
    let mut t = format!(
        "step {} ({} step {}, {}): {} cycles",
        s.index,
        s.call,
        s.call_step,
        s.kind,
        grouped(s.end_cycle - s.start_cycle)
    );
    if let Some(op) = &s.operation {
        let _ = write!(t, "\noperation: {op}");
    }
    if let Some(phase) = &s.phase {
        let _ = write!(t, "\nphase: {phase}");
    }
    for k in &s.kernels {
        let _ = write!(t, "\nkernel {} on {} tiles", k.kernel, k.tiles.len());
    }
    if let Some((tile, c)) = slowest_tile(s) {
        let active = s.compute.iter().filter(|&&c| c > 0).count().max(1);
        let mean = s.compute.iter().sum::<u64>() / active as u64;
        let _ = write!(
            t,
            "\ncompute: slowest tile {tile} {} cycles, mean {} over {active} tiles",
            grouped(c),
            grouped(mean)
        );
    }
    let exchange = s.exchange.iter().copied().max().unwrap_or(0);
    let words = s.words_received.iter().copied().max().unwrap_or(0);
    if exchange > 0 {
        let _ = write!(
            t,
            "\nexchange: {} cycles, at most {} words received by a tile",
            grouped(exchange),
            grouped(words)
        );
    }
    let host = s.host.iter().copied().max().unwrap_or(0);
    if host > 0 {
        let _ = write!(t, "\nhost link: {} cycles", grouped(host));
    }
    if let Some(e) = s.estimated_cycles {
        let _ = write!(
            t,
            "\nestimate: {} cycles ({} against the simulator's {} device cycles)",
            grouped(e),
            error_text(e, device_cycles(s)),
            grouped(device_cycles(s))
        );
    }
    escape(&t)
}

/// A step's device cycles: its length less the host link time at a host
/// sync (the chip waits for the host there; the estimate counts device
/// time only, as the calls' device cycles do).
fn device_cycles(s: &ProfileStep) -> u64 {
    s.device_cycles()
}

/// The estimate's error against `simulated` as a signed percentage.
fn error_text(estimate: u64, simulated: u64) -> String {
    if simulated == 0 {
        return "-".into();
    }
    format!(
        "{:+.1}%",
        (estimate as f64 - simulated as f64) * 100.0 / simulated as f64
    )
}

/// The compiler's estimates (`schedule.json` format 2) beside the
/// simulated cycles, by call and by operation.
fn estimates(h: &mut String, p: &Profile) {
    if p.steps.iter().all(|s| s.estimated_cycles.is_none()) {
        return;
    }
    let _ = writeln!(
        h,
        "<h2>Estimate against the simulator</h2>\n<p class=\"note\">The compiler's cost model \
         per BSP step (the slowest tile's compute steps, the exchange, and the call's final \
         host sync) summed over the steps that have an estimate, beside those steps' \
         simulated device cycles (a host sync's host link time left out).</p>"
    );
    for (what, key) in [
        (
            "call",
            &(|s: &ProfileStep| s.call.clone()) as &dyn Fn(&ProfileStep) -> String,
        ),
        ("operation", &|s: &ProfileStep| {
            s.operation.clone().unwrap_or_else(|| "(none)".into())
        }),
    ] {
        let mut rows: Vec<(String, u64, u64, usize)> = Vec::new();
        for s in p.steps.iter() {
            let Some(e) = s.estimated_cycles else {
                continue;
            };
            let k = key(s);
            let i = match rows.iter().position(|r| r.0 == k) {
                Some(i) => i,
                None => {
                    rows.push((k, 0, 0, 0));
                    rows.len() - 1
                }
            };
            rows[i].1 += e;
            rows[i].2 += device_cycles(s);
            rows[i].3 += 1;
        }
        let _ = writeln!(
            h,
            "<table>\n<tr><th class=\"k\">{what}</th><th>steps</th><th>estimated</th>\
             <th>simulated</th><th>error</th></tr>"
        );
        for (k, e, sim, n) in rows {
            let _ = writeln!(
                h,
                "<tr><td class=\"k\">{}</td><td>{n}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&k),
                grouped(e),
                grouped(sim),
                error_text(e, sim)
            );
        }
        let _ = writeln!(h, "</table>");
    }
}

fn query_table(h: &mut String, title: &str, note: &str, rows: &[QueryRow]) {
    let _ = writeln!(h, "<h2>{}</h2>\n<p class=\"note\">{}; compute, sync, exchange and host: tile-cycles summed over the group's steps and tiles.</p>", escape(title), escape(note));
    let max = rows.iter().map(|r| r.cycles).max().unwrap_or(0).max(1);
    let _ = writeln!(
        h,
        "<table>\n<tr><th class=\"k\">group</th><th>cycles</th><th></th><th>compute</th>\
         <th>sync</th><th>exchange</th><th>host</th><th>steps</th><th>tiles</th></tr>"
    );
    for r in rows {
        let _ = writeln!(
            h,
            "<tr><td class=\"k\">{}</td><td>{}</td><td class=\"k\"><span class=\"bar\" style=\"width:{}px\"></span></td>\
             <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&r.key),
            grouped(r.cycles),
            px(120.0 * r.cycles as f64 / max as f64),
            grouped(r.compute),
            grouped(r.sync),
            grouped(r.exchange),
            grouped(r.host),
            r.steps,
            r.tiles
        );
    }
    let _ = writeln!(h, "</table>");
}

/// The capacity of a region named as in the profile's memory entries.
fn region_capacity(name: &str) -> Option<u64> {
    let region = match name {
        "region0" => Region::Standard,
        "region1" => Region::Interleaved,
        _ => return None,
    };
    let r = region.range();
    Some((r.end - r.start) as u64)
}

fn memory(h: &mut String, p: &Profile) {
    let _ = writeln!(h, "<h2>Memory per tile</h2>");
    if p.memory.is_empty() {
        let _ = writeln!(
            h,
            "<p class=\"note\">The profile has no memory figures.</p>"
        );
        return;
    }
    let tiles = p.tile_count as usize;
    // region -> category -> bytes per tile
    let mut by_region: BTreeMap<&str, BTreeMap<&str, Vec<u64>>> = BTreeMap::new();
    for m in &p.memory {
        let per_tile = by_region
            .entry(m.region.as_str())
            .or_default()
            .entry(m.category.as_str())
            .or_insert_with(|| vec![0; tiles]);
        if let Some(b) = per_tile.get_mut(m.tile as usize) {
            *b += m.bytes;
        }
    }
    let (per_column, columns) = tile_groups(tiles, MAX_MEMORY_COLUMNS);
    let column_px = PLOT_WIDTH / columns.max(1) as f64;
    let _ = writeln!(
        h,
        "<p class=\"note\">Each column is {} of its region's capacity (the line); \
         the categories are the compiler's when the package has a compile report.</p>",
        if per_column > 1 {
            format!("the fullest of {per_column} neighbouring tiles, its bytes by category, against the top")
        } else {
            "one tile, its bytes by category, against the top".to_string()
        }
    );
    for (region, categories) in &by_region {
        let totals: Vec<u64> = (0..tiles)
            .map(|t| categories.values().map(|v| v[t]).sum())
            .collect();
        let fullest = totals.iter().copied().max().unwrap_or(0);
        let capacity = region_capacity(region);
        let scale_to = capacity.unwrap_or(fullest).max(fullest).max(1) as f64;
        // Categories largest first over all tiles, then by name.
        let mut order: Vec<(&str, u64)> = categories
            .iter()
            .map(|(c, v)| (*c, v.iter().sum()))
            .collect();
        order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let colour = |i: usize| PALETTE[i % PALETTE.len()];
        let fullest_tile = totals.iter().position(|&b| b == fullest).unwrap_or(0);
        let _ = writeln!(
            h,
            "<h3>{}{}: fullest tile {} with {} bytes</h3>",
            escape(region),
            capacity
                .map(|c| format!(" ({} bytes a tile)", grouped(c)))
                .unwrap_or_default(),
            fullest_tile,
            grouped(fullest)
        );
        let items: Vec<(&str, &str)> = order
            .iter()
            .enumerate()
            .map(|(i, (c, _))| (colour(i), *c))
            .collect();
        legend(h, &items);
        let top = 6.0;
        let height = top + MEMORY_HEIGHT + 16.0;
        let _ = writeln!(
            h,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-size=\"10\">",
            px(LEFT + PLOT_WIDTH + 10.0),
            px(height)
        );
        let base = top + MEMORY_HEIGHT;
        for col in 0..columns {
            let ts = col * per_column..((col + 1) * per_column).min(tiles);
            let Some(t) = ts
                .clone()
                .max_by_key(|&t| (totals[t], std::cmp::Reverse(t)))
            else {
                continue;
            };
            if totals[t] == 0 {
                continue;
            }
            let parts: Vec<(u64, &str, String)> = order
                .iter()
                .enumerate()
                .map(|(i, (c, _))| {
                    let b = categories[c][t];
                    (
                        b,
                        colour(i),
                        format!("tile {t}: {} {} bytes", escape(c), grouped(b)),
                    )
                })
                .collect();
            let x0 = LEFT + col as f64 * column_px;
            stacked_bar(h, (x0, column_px.max(0.5)), base, scale_to, &parts);
        }
        close_chart(
            h,
            base,
            capacity.map(|c| base - MEMORY_HEIGHT * c as f64 / scale_to),
            ("tile 0".into(), format!("tile {}", tiles.saturating_sub(1))),
        );
        let _ = writeln!(
            h,
            "<table>\n<tr><th class=\"k\">category</th><th>bytes on all tiles</th>\
             <th>tiles</th><th>most on one tile</th><th>that tile</th></tr>"
        );
        for (c, total) in &order {
            let v = &categories[c];
            let most = v.iter().copied().max().unwrap_or(0);
            let at = v.iter().position(|&b| b == most).unwrap_or(0);
            let _ = writeln!(
                h,
                "<tr><td class=\"k\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(c),
                grouped(*total),
                v.iter().filter(|&&b| b > 0).count(),
                grouped(most),
                at
            );
        }
        let _ = writeln!(
            h,
            "<tr><th class=\"k\">all</th><th>{}</th><th>{}</th><th>{}</th><th>{}</th></tr>\n</table>",
            grouped(totals.iter().sum()),
            totals.iter().filter(|&&b| b > 0).count(),
            grouped(fullest),
            fullest_tile
        );
    }
}

/// One column of a stacked bar chart of bytes: `parts` (bytes, colour,
/// title) from `base` upwards, the chart's full height standing for
/// `scale_to` bytes; `(x, width)` in pixels. Empty parts draw nothing.
fn stacked_bar(
    h: &mut String,
    (x0, width): (f64, f64),
    base: f64,
    scale_to: f64,
    parts: &[(u64, &str, String)],
) {
    let mut y = base;
    for (bytes, colour, title) in parts {
        if *bytes == 0 {
            continue;
        }
        let hh = MEMORY_HEIGHT * *bytes as f64 / scale_to;
        y -= hh;
        let _ = writeln!(
            h,
            "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{colour}\"><title>{title}</title></rect>",
            px(x0),
            px(y),
            px(width),
            px(hh)
        );
    }
}

/// Ends a bar chart's SVG: the capacity line at `capacity_y` (when there
/// is one), the first and last columns' labels under the `base` line.
fn close_chart(
    h: &mut String,
    base: f64,
    capacity_y: Option<f64>,
    (first, last): (String, String),
) {
    if let Some(y) = capacity_y {
        let _ = writeln!(
            h,
            "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#c00\" stroke-width=\"1\"/>",
            px(LEFT),
            px(y),
            px(LEFT + PLOT_WIDTH),
            px(y)
        );
    }
    let _ = writeln!(
        h,
        "<text x=\"2\" y=\"{}\">{first}</text>\n<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{last}</text>\n</svg>",
        px(base + 12.0),
        px(LEFT + PLOT_WIDTH),
        px(base + 12.0)
    );
}

/// Colours of the liveness chart: always-live bytes, the others.
const ALWAYS_LIVE: &str = "#7a5195";
const STEP_LIVE: &str = "#f0a35e";

/// Liveness per step, as PopVision shows it for Poplar programs: for every
/// step the package's schedule gives live bytes for, the fullest tile's
/// bytes (always live, and live in that step), against a tile's memory.
fn liveness(h: &mut String, p: &Profile) {
    let steps: Vec<(&ProfileStep, crate::members::StepLive)> = p
        .steps
        .iter()
        .filter_map(|s| s.live.map(|l| (s, l)))
        .collect();
    let _ = writeln!(h, "<h2>Liveness per step</h2>");
    if steps.is_empty() {
        let _ = writeln!(
            h,
            "<p class=\"note\">The package's schedule has no live bytes (compiled before the liveness phase).</p>"
        );
        return;
    }
    let capacity = (ipu_arch::REGION0_END - ipu_arch::REGION0_BASE + ipu_arch::REGION1_END
        - ipu_arch::REGION1_BASE) as u64;
    let fullest = steps.iter().map(|(_, l)| l.bytes).max().unwrap_or(0);
    let (peak_step, peak) = steps
        .iter()
        .find(|(_, l)| l.bytes == fullest)
        .map(|(s, l)| (s.index, *l))
        .expect("steps is not empty");
    let _ = writeln!(
        h,
        "<p class=\"note\">A buffer is live from the first step that touches it (a kernel's \
         state, an exchange, the host) to the last; parameters, constants and zero padding from the \
         load are always live. Each bar is the fullest tile of the \
         step; the line is a tile's memory ({} bytes). Peak: {} bytes on tile {} at step {}.</p>",
        grouped(capacity),
        grouped(peak.bytes),
        peak.tile,
        peak_step
    );
    legend(
        h,
        &[
            (ALWAYS_LIVE, "always live"),
            (STEP_LIVE, "live in the step"),
        ],
    );
    let top = 6.0;
    let height = top + MEMORY_HEIGHT + 16.0;
    let scale_to = capacity.max(fullest).max(1) as f64;
    let column_px = PLOT_WIDTH / steps.len() as f64;
    let _ = writeln!(
        h,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-size=\"10\">",
        px(LEFT + PLOT_WIDTH + 10.0),
        px(height)
    );
    let base = top + MEMORY_HEIGHT;
    for (i, (s, l)) in steps.iter().enumerate() {
        let always = l.always.min(l.bytes);
        let title = format!(
            "step {} ({} {}): tile {} {} live bytes, {} always live",
            s.index,
            escape(&s.call),
            s.call_step,
            l.tile,
            grouped(l.bytes),
            grouped(always)
        );
        let x0 = LEFT + i as f64 * column_px;
        stacked_bar(
            h,
            (x0, (column_px * 0.9).max(0.5)),
            base,
            scale_to,
            &[
                (always, ALWAYS_LIVE, title.clone()),
                (l.bytes - always, STEP_LIVE, title),
            ],
        );
    }
    close_chart(
        h,
        base,
        Some(base - MEMORY_HEIGHT * capacity as f64 / scale_to),
        (
            format!("step {}", steps.first().map_or(0, |(s, _)| s.index)),
            format!("step {}", steps.last().map_or(0, |(s, _)| s.index)),
        ),
    );
    let _ = writeln!(
        h,
        "<table>\n<tr><th>step</th><th class=\"k\">call</th><th>fullest tile</th><th>live bytes</th>\
         <th>region 0</th><th>region 1</th><th>always live</th><th>all tiles</th><th class=\"k\">phase</th></tr>"
    );
    for (s, l) in &steps {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"k\">{} {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"k\">{}</td></tr>",
            s.index,
            escape(&s.call),
            s.call_step,
            l.tile,
            grouped(l.bytes),
            grouped(l.region0),
            grouped(l.region1),
            grouped(l.always),
            grouped(l.all_tiles),
            escape(s.phase.as_deref().unwrap_or(""))
        );
    }
    let _ = writeln!(h, "</table>");
}

fn step_table(h: &mut String, p: &Profile) {
    let _ = writeln!(
        h,
        "<h2>Steps</h2>\n<table>\n<tr><th>step</th><th class=\"k\">call</th><th>kind</th>\
         <th>start</th><th>cycles</th><th>estimate</th><th>slowest compute (tile)</th><th>exchange</th>\
         <th>words received (most)</th><th>instructions</th><th class=\"k\">operation</th>\
         <th class=\"k\">kernels</th><th class=\"k\">phase</th></tr>"
    );
    for s in &p.steps {
        let slowest = slowest_tile(s)
            .map(|(t, c)| format!("{} ({t})", grouped(c)))
            .unwrap_or_default();
        let kernels: Vec<String> = s
            .kernels
            .iter()
            .map(|k| format!("{} ({})", escape(&k.kernel), k.tiles.len()))
            .collect();
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"k\">{} {}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>{}</td><td class=\"k\">{}</td><td class=\"k\">{}</td><td class=\"k\">{}</td></tr>",
            s.index,
            escape(&s.call),
            s.call_step,
            escape(&s.kind),
            grouped(s.start_cycle),
            grouped(s.end_cycle - s.start_cycle),
            s.estimated_cycles
                .map(|e| format!(
                    "{} ({})",
                    grouped(e),
                    error_text(e, device_cycles(s))
                ))
                .unwrap_or_default(),
            slowest,
            grouped(s.exchange.iter().copied().max().unwrap_or(0)),
            grouped(s.words_received.iter().copied().max().unwrap_or(0)),
            grouped(s.instructions.iter().sum()),
            escape(s.operation.as_deref().unwrap_or("")),
            kernels.join(", "),
            escape(s.phase.as_deref().unwrap_or(""))
        );
    }
    let _ = writeln!(h, "</table>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            escape("a<b & \"c\" 'd'>"),
            "a&lt;b &amp; &quot;c&quot; &#39;d&#39;&gt;"
        );
    }

    #[test]
    fn groups_digits() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(128626), "128,626");
        assert_eq!(grouped(1234567), "1,234,567");
    }

    #[test]
    fn tiles_share_rows_only_when_they_must() {
        assert_eq!(tile_groups(64, 256), (1, 64));
        assert_eq!(tile_groups(256, 256), (1, 256));
        assert_eq!(tile_groups(257, 256), (2, 129));
        assert_eq!(tile_groups(1472, 256), (6, 246));
    }

    fn step(index: usize, cycles: (u64, u64), compute: &[u64], exchange: &[u64]) -> ProfileStep {
        let wall = cycles.1 - cycles.0;
        let n = compute.len();
        ProfileStep {
            index,
            kind: "sync".into(),
            start_cycle: cycles.0,
            end_cycle: cycles.1,
            call: "run".into(),
            call_step: index,
            phase: Some("gemm <y>; reduce y".into()),
            operation: Some("<y>".into()),
            kernels: vec![crate::members::KernelTiles {
                kernel: "gemm_f16".into(),
                tiles: vec![0, 1],
            }],
            estimated_cycles: Some(900),
            host_stop: false,
            live: None,
            compute: compute.to_vec(),
            sync: (0..n)
                .map(|t| {
                    if compute[t] + exchange[t] == 0 {
                        0
                    } else {
                        wall - compute[t] - exchange[t]
                    }
                })
                .collect(),
            exchange: exchange.to_vec(),
            host: vec![0; n],
            instructions: compute.to_vec(),
            words_sent: vec![0; n],
            words_received: exchange.to_vec(),
        }
    }

    fn profile() -> Profile {
        Profile {
            format: super::super::FORMAT.into(),
            version: super::super::VERSION,
            model: "m<&>".into(),
            package_digest: "d".into(),
            device: "simulator ipu21 tiles=3".into(),
            tile_count: 3,
            clock_hz: 1_500_000_000,
            total_cycles: 1000,
            calls: vec![],
            steps: vec![step(0, (0, 1000), &[500, 250, 0], &[200, 200, 0])],
            memory: vec![
                super::super::MemoryEntry {
                    tile: 0,
                    region: "region1".into(),
                    category: "gemm_weight".into(),
                    bytes: 212_992,
                },
                super::super::MemoryEntry {
                    tile: 1,
                    region: "region1".into(),
                    category: "gemm_weight".into(),
                    bytes: 1000,
                },
                super::super::MemoryEntry {
                    tile: 1,
                    region: "region1".into(),
                    category: "code".into(),
                    bytes: 24,
                },
            ],
            memory_source: "report.json".into(),
            notes: vec![],
        }
    }

    #[test]
    fn per_tile_view_draws_each_tiles_share_of_the_step() {
        let page = render_html(&profile());
        // 1000 cycles over 1100 pixels from x = 70; rows of 8 pixels from
        // y = 48. Tile 0 computes half the step, tile 1 a quarter; both
        // exchange the last fifth; tile 2 is idle and left white.
        for rect in [
            "<rect x=\"70.0\" y=\"48.0\" width=\"1100.0\" height=\"8.0\" fill=\"#d7d7d7\"/>",
            "<rect x=\"70.0\" y=\"48.0\" width=\"550.0\" height=\"8.0\" fill=\"#3e9e4a\"/>",
            "<rect x=\"950.0\" y=\"48.0\" width=\"220.0\" height=\"8.0\" fill=\"#2f6fd0\"/>",
            "<rect x=\"70.0\" y=\"56.0\" width=\"275.0\" height=\"8.0\" fill=\"#3e9e4a\"/>",
            "<rect x=\"950.0\" y=\"56.0\" width=\"220.0\" height=\"8.0\" fill=\"#2f6fd0\"/>",
        ] {
            assert!(page.contains(rect), "{rect} missing");
        }
        assert!(!page.contains("y=\"64.0\""), "the idle tile has bars");
    }

    #[test]
    fn estimates_stand_beside_the_simulated_cycles() {
        let page = render_html(&profile());
        assert!(page.contains(
            "estimate: 900 cycles (-10.0% against the simulator&#39;s 1,000 device cycles)"
        ));
        assert!(page.contains(
            "<tr><td class=\"k\">run</td><td>1</td><td>900</td><td>1,000</td><td>-10.0%</td></tr>"
        ));
        assert!(page.contains("<td>900 (-10.0%)</td>"));
        let mut p = profile();
        p.steps[0].estimated_cycles = None;
        assert!(!render_html(&p).contains("Estimate against the simulator"));
    }

    #[test]
    fn liveness_charts_each_steps_fullest_tile_against_a_tiles_memory() {
        let mut p = profile();
        assert!(render_html(&p).contains("has no live bytes"));
        p.steps
            .push(step(1, (1000, 1500), &[100, 100, 0], &[0, 0, 0]));
        p.steps[0].live = Some(crate::members::StepLive {
            tile: 1,
            bytes: 319_488,
            region0: 100_000,
            region1: 219_488,
            always: 159_744,
            all_tiles: 400_000,
        });
        p.steps[1].live = Some(crate::members::StepLive {
            tile: 0,
            bytes: 200_000,
            region0: 50_000,
            region1: 150_000,
            always: 159_744,
            all_tiles: 300_000,
        });
        let page = render_html(&p);
        assert!(page.contains("Peak: 319,488 bytes on tile 1 at step 0."));
        // Half a tile's 638,976 bytes is 90 of the chart's 180 pixels, a
        // quarter always live; two steps share 1,100 pixels.
        assert!(page.contains(
            "<rect x=\"70.0\" y=\"141.0\" width=\"495.0\" height=\"45.0\" fill=\"#7a5195\">"
        ));
        assert!(page.contains(
            "<rect x=\"70.0\" y=\"96.0\" width=\"495.0\" height=\"45.0\" fill=\"#f0a35e\">"
        ));
        assert!(page.contains(
            "<tr><td>1</td><td class=\"k\">run 1</td><td>0</td><td>200,000</td><td>50,000</td>\
             <td>150,000</td><td>159,744</td><td>300,000</td>"
        ));
    }

    #[test]
    fn rows_of_equal_tiles_are_one_rectangle() {
        let mut p = profile();
        p.steps = vec![step(0, (0, 1000), &[500, 500, 500], &[200, 200, 200])];
        let page = render_html(&p);
        assert!(page.contains(
            "<rect x=\"70.0\" y=\"48.0\" width=\"550.0\" height=\"24.0\" fill=\"#3e9e4a\"/>"
        ));
        assert_eq!(page.matches("fill=\"#3e9e4a\"/>").count(), 1);
    }

    #[test]
    fn names_from_the_model_are_escaped_and_memory_is_tabulated() {
        let page = render_html(&profile());
        assert!(!page.contains("<y>") && !page.contains("m<&>"));
        assert!(page.contains("Execution profile of <code>m&lt;&amp;&gt;</code>"));
        assert!(page.contains("operation: &lt;y&gt;"));
        // Region 1 holds 425,984 bytes a tile; tile 0's 212,992 bytes fill
        // half the chart's height (180 pixels from y = 186).
        assert!(page.contains("region1 (425,984 bytes a tile): fullest tile 0 with 212,992 bytes"));
        assert!(
            page.contains("x=\"70.0\" y=\"96.0\" width=\"366.7\" height=\"90.0\""),
            "{page}"
        );
        assert!(page.contains(
            "<tr><th class=\"k\">all</th><th>214,016</th><th>2</th><th>212,992</th><th>0</th></tr>"
        ));
    }

    #[test]
    fn ticks_are_round_and_cover_the_span() {
        assert_eq!(ticks(8490), vec![0, 2000, 4000, 6000, 8000]);
        assert_eq!(ticks(5), vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(
            ticks(128626),
            vec![0, 20000, 40000, 60000, 80000, 100000, 120000]
        );
    }
}
