//! A readable listing of an object: sections with disassembly, symbols and
//! relocations. Filetests snapshot it; `ipu-as --dump` prints it.

use crate::object::{Object, SectionKind};
use ipu_isa::decode_bundle_bytes;
use std::fmt::Write;

/// Renders `obj` as text. Code is disassembled with ipu-isa; a word that
/// does not decode is shown as `.word` with the decoder's reason.
pub fn dump_object(obj: &Object) -> String {
    let mut out = String::new();
    for (si, s) in obj.sections.iter().enumerate() {
        let _ = writeln!(
            out,
            "section {si} {} {} align={} region={} size={}",
            s.name, s.kind, s.align, s.region, s.size
        );
        let relocs: Vec<_> = obj
            .relocations
            .iter()
            .filter(|r| r.section as usize == si)
            .collect();
        let symbols_at = |off: u32| {
            obj.symbols
                .iter()
                .filter(move |y| y.section == Some(si as u32) && y.offset == off)
        };
        let reloc_text = |off: u32| {
            relocs
                .iter()
                .filter(|r| r.offset == off)
                .map(|r| {
                    let name = obj
                        .symbols
                        .get(r.symbol as usize)
                        .map_or("?", |y| y.name.as_str());
                    if r.addend == 0 {
                        format!("  ; {:?} {name}", r.kind)
                    } else {
                        format!("  ; {:?} {name}{:+}", r.kind, r.addend)
                    }
                })
                .collect::<String>()
        };
        match s.kind {
            SectionKind::Code => {
                let mut off = 0usize;
                while off < s.bytes.len() {
                    for y in symbols_at(off as u32) {
                        let _ = writeln!(out, "  {}:", y.name);
                    }
                    match decode_bundle_bytes(&s.bytes[off..]) {
                        Ok((b, n)) => {
                            let mut text = String::new();
                            for w in 0..n / 4 {
                                text.push_str(&reloc_text((off + 4 * w) as u32));
                            }
                            let _ = writeln!(out, "    {off:04x}: {b}{text}");
                            off += n;
                        }
                        Err(e) => {
                            let w = s
                                .bytes
                                .get(off..off + 4)
                                .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                            let _ = writeln!(out, "    {off:04x}: .word {w:#010x}  ; {e}");
                            off += 4;
                        }
                    }
                }
                for y in symbols_at(s.size) {
                    let _ = writeln!(out, "  {}:", y.name);
                }
            }
            SectionKind::Data => {
                let mut off = 0usize;
                while off < s.bytes.len() {
                    for y in symbols_at(off as u32) {
                        let _ = writeln!(out, "  {}:", y.name);
                    }
                    let end = (off + 4).min(s.bytes.len());
                    let hex: Vec<String> = s.bytes[off..end]
                        .iter()
                        .map(|b| format!("{b:02x}"))
                        .collect();
                    let _ = writeln!(
                        out,
                        "    {off:04x}: {}{}",
                        hex.join(" "),
                        reloc_text(off as u32)
                    );
                    off = end;
                }
            }
            SectionKind::Bss => {}
        }
    }
    if !obj.symbols.is_empty() {
        let _ = writeln!(out, "symbols:");
        for y in &obj.symbols {
            let place = match y.section {
                Some(i) => {
                    let name = obj
                        .sections
                        .get(i as usize)
                        .map_or("?", |s| s.name.as_str());
                    format!("{name}+{:#x}", y.offset)
                }
                None => "undefined".to_string(),
            };
            let _ = writeln!(
                out,
                "  {} {:?} {:?} {place} size={}",
                y.name, y.binding, y.kind, y.size
            );
        }
    }
    out
}
