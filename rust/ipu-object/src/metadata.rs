//! `kernel.json`: what a kernel source declared (name, entries, parameters,
//! workers, cycle formula) and what the assembler measured (sizes, registers).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Registers a kernel's code reads or writes, by number.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistersUsed {
    /// `$m` registers (0..15).
    pub m: Vec<u8>,
    /// `$a` registers (0..15).
    pub a: Vec<u8>,
}

impl RegistersUsed {
    /// From bit masks over `$m0..$m15` and `$a0..$a15`.
    pub fn from_masks(m: u16, a: u16) -> Self {
        let bits = |x: u16| (0..16u8).filter(|i| x & (1 << i) != 0).collect();
        RegistersUsed {
            m: bits(m),
            a: bits(a),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelMetadata {
    /// Kernel name (from `--name`, else `.kernel`, else the source file stem).
    pub kernel: String,
    /// Target architecture, e.g. "ipu21".
    pub target: String,
    /// Entry symbols (from `.entry`, else every global code symbol).
    pub entries: Vec<String>,
    /// Parameters the object was specialised with, by name.
    pub parameters: BTreeMap<String, i64>,
    pub code_bytes: u32,
    pub data_bytes: u32,
    pub bss_bytes: u32,
    /// Worker contexts the vertex uses (`.workers`), if declared.
    pub workers: Option<u32>,
    pub registers: RegistersUsed,
    /// The declared cycle-estimate formula (`.cycles "..."`), if any.
    pub cycles: Option<String>,
    /// blake3 (hex) of the source and every included file, in inclusion order.
    pub source_digest: String,
    pub toolchain_version: String,
}

impl KernelMetadata {
    /// Pretty JSON with a final newline; byte-identical for equal values.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("metadata always serialises");
        s.push('\n');
        s
    }

    pub fn from_json(text: &str) -> Result<KernelMetadata, serde_json::Error> {
        serde_json::from_str(text)
    }
}
