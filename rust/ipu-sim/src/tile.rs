//! One tile: memory, decoded-code cache, seven contexts, the round-robin
//! issue model and the interpreter.
//!
//! Time: every issue happens at an exact tile cycle. Worker `w` issues only in
//! cycles `t` with `t % 6 == w`; the supervisor issues in a cycle whose slot's
//! worker is idle. Each context's next issue is `t + 6 * issue_slots` after
//! its last one. The tile processes issues in cycle order (there are never
//! two issues in one cycle), so memory effects are deterministic.

use crate::amp::AmpState;
use crate::error::{FaultKind, SimError};
use crate::fpu;
use ipu_arch::{Region, REGION0_BASE, REGION0_END, SRAM_BASE, SRAM_END, TILE_SRAM_BYTES};
use ipu_isa::numerics::Prng;
use ipu_isa::{
    decode_bundle_bytes, AddrMode, Bundle, ContextClass, Instruction, LdStKind, LoadKind, MReg,
    Reg, Slot, SpecialReg, StoreKind,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Index of the supervisor context.
pub const SUPERVISOR: usize = 6;
const WORKERS: usize = ipu_arch::WORKER_CONTEXTS as usize;
const INTERVAL: u64 = ipu_arch::CONTEXT_ISSUE_INTERVAL as u64;

/// Symbols of a tile image: address to name.
pub type SymbolMap = BTreeMap<u32, String>;

#[derive(Clone, Copy, Debug)]
struct HwLoop {
    start: u32,
    end: u32,
    remaining: u32,
}

#[derive(Clone)]
pub(crate) struct Context {
    pub(crate) running: bool,
    pub(crate) pc: u32,
    pub(crate) m: [u32; 16],
    pub(crate) a: [u32; 16],
    pub(crate) next_issue: u64,
    /// Workers: the first cycle in which the supervisor may use this slot after the worker exited.
    free_from: u64,
    hw_loop: Option<HwLoop>,
    prng: Prng,
}

impl Context {
    fn new(tile: u32, index: u32) -> Context {
        Context {
            running: false,
            pc: 0,
            m: [0; 16],
            a: [0; 16],
            next_issue: 0,
            free_from: 0,
            hw_loop: None,
            prng: Prng::for_context(tile, index),
        }
    }
    #[inline]
    fn set_m(&mut self, r: MReg, v: u32) {
        if r.0 != 15 {
            self.m[r.0 as usize] = v;
        }
    }
    #[inline]
    fn get_m(&self, r: MReg) -> u32 {
        self.m[r.0 as usize]
    }
}

/// A transfer recorded by an exchange instruction.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Transfer {
    pub(crate) address: u32,
    pub(crate) words: u32,
    /// Start cycle relative to the exchange phase start.
    pub(crate) start: u64,
    /// `None` for a send, the source tile for a receive.
    pub(crate) source: Option<u32>,
    /// pc of the instruction that issued it, for error reports.
    pub(crate) pc: u32,
}

/// How a phase of a tile ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PhaseEnd {
    Sync { at: u64 },
    Hsync { at: u64 },
    Exit { at: u64 },
    Xend { at: u64 },
}

/// Per-tile counters of the current phase.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PhaseCounters {
    pub(crate) bundles: u64,
    pub(crate) instructions: u64,
}

enum Flow {
    Next,
    Jump(u32),
    Call(u32),
    Rpt {
        count: u32,
        len: u16,
    },
    Exit,
    Run {
        entry: u32,
        state: u32,
    },
    Wsync,
    Sync,
    Hsync,
    Xend,
    Transfer {
        address: u32,
        words: u32,
        source: Option<u32>,
        start: u32,
    },
    Xtab {
        table: u32,
        count: u32,
    },
}

/// A decoded bundle with the facts the interpreter needs on every issue.
#[derive(Clone, Copy)]
struct Decoded {
    bundle: Bundle,
    size: u32,
    slots: u64,
    /// Instructions other than `nop`.
    count: u8,
    /// Whether a worker may issue it (no supervisor-only instruction).
    worker_ok: bool,
    /// Whether the supervisor may issue it (no arithmetic instruction).
    supervisor_ok: bool,
}

impl Decoded {
    fn new(bundle: Bundle, size: u32) -> Decoded {
        let class = |k: ContextClass| bundle.instructions().any(|i| i.context_class() == k);
        Decoded {
            bundle,
            size,
            slots: bundle.issue_slots() as u64,
            count: bundle
                .instructions()
                .filter(|i| **i != Instruction::Nop)
                .count() as u8,
            worker_ok: !class(ContextClass::SupervisorOnly),
            supervisor_ok: !class(ContextClass::WorkerOnly),
        }
    }
}

/// One simulated tile.
#[derive(Clone)]
pub struct Tile {
    pub(crate) id: u32,
    mem: Vec<u8>,
    /// Per region-0 word: 0 = not decoded, else 1 + index into `decoded`.
    code_index: Vec<u32>,
    decoded: Vec<Decoded>,
    /// Address range [lo, hi) covering every decoded bundle, so that data
    /// stores elsewhere skip the cache invalidation.
    code_lo: u32,
    code_hi: u32,
    ctx: Vec<Context>,
    amp: Vec<AmpState>,
    pub(crate) active: bool,
    pub(crate) exited: bool,
    sup_waiting_workers: bool,
    pub(crate) exchange_mode: bool,
    pub(crate) exchange_t0: u64,
    pub(crate) transfers: Vec<Transfer>,
    pub(crate) counters: PhaseCounters,
    pub(crate) step: u64,
    pub(crate) syncs_done: u32,
    pub(crate) now: u64,
    pub(crate) symbols: Option<Arc<SymbolMap>>,
}

/// A number naming the memory element of an address (distinct per region);
/// `u32::MAX` outside SRAM, where the access itself faults.
#[inline]
fn element_key(address: u32) -> u32 {
    match Region::element_of(address) {
        Some((Region::Standard, e)) => e,
        Some((Region::Interleaved, e)) => 0x1000 + e,
        None => u32::MAX,
    }
}

fn bad_range(address: u32, bytes: u32) -> FaultKind {
    FaultKind::OutOfRange { address, bytes }
}

impl Tile {
    pub(crate) fn new(id: u32) -> Tile {
        Tile {
            id,
            // Zeroed allocations are mapped lazily by the OS, so untouched
            // tiles cost little real memory.
            mem: vec![0u8; TILE_SRAM_BYTES as usize],
            code_index: vec![0u32; ((REGION0_END - REGION0_BASE) / 4) as usize],
            decoded: Vec::new(),
            code_lo: u32::MAX,
            code_hi: 0,
            ctx: (0..7).map(|c| Context::new(id, c)).collect(),
            amp: vec![AmpState::default(); WORKERS],
            active: false,
            exited: false,
            sup_waiting_workers: false,
            exchange_mode: false,
            exchange_t0: 0,
            transfers: Vec::new(),
            counters: PhaseCounters::default(),
            step: 0,
            syncs_done: 0,
            now: 0,
            symbols: None,
        }
    }

    /// Makes the supervisor start at `pc` at tile cycle `at`.
    pub(crate) fn start(&mut self, pc: u32, at: u64) {
        let s = &mut self.ctx[SUPERVISOR];
        s.running = true;
        s.pc = pc;
        s.next_issue = at;
        self.active = true;
        self.exited = false;
        self.now = at;
    }

    /// Continues the supervisor no earlier than `at` (after a sync).
    pub(crate) fn resume_at(&mut self, at: u64) {
        let s = &mut self.ctx[SUPERVISOR];
        s.next_issue = s.next_issue.max(at);
        self.now = self.now.max(at);
    }

    pub(crate) fn supervisor_pc(&self) -> u32 {
        self.ctx[SUPERVISOR].pc
    }

    // ---- memory ----

    fn offset(address: u32, bytes: u32) -> Result<usize, FaultKind> {
        if address < SRAM_BASE || address as u64 + bytes as u64 > SRAM_END as u64 {
            return Err(bad_range(address, bytes));
        }
        Ok((address - SRAM_BASE) as usize)
    }

    /// Host or loader write (no alignment rule).
    pub(crate) fn write_bytes(&mut self, address: u32, data: &[u8]) -> Result<(), FaultKind> {
        let off = Self::offset(address, data.len() as u32)?;
        self.mem[off..off + data.len()].copy_from_slice(data);
        self.invalidate(address, data.len() as u32);
        Ok(())
    }

    /// Host read.
    pub(crate) fn read_bytes(&self, address: u32, len: u32) -> Result<&[u8], FaultKind> {
        let off = Self::offset(address, len)?;
        Ok(&self.mem[off..off + len as usize])
    }

    #[inline]
    fn invalidate(&mut self, address: u32, len: u32) {
        if address >= self.code_hi || address + len <= self.code_lo || len == 0 {
            return;
        }
        // A pair's second word belongs to the bundle that starts one word earlier.
        let first = (address.max(REGION0_BASE + 4) - 4 - REGION0_BASE) / 4;
        let last = ((address + len - 1).min(REGION0_END - 1) - REGION0_BASE) / 4;
        for w in first..=last {
            self.code_index[w as usize] = 0;
        }
    }

    #[inline]
    fn load(&self, address: u32, bytes: u32) -> Result<&[u8], FaultKind> {
        if !address.is_multiple_of(bytes) {
            return Err(FaultKind::Misaligned { address, bytes });
        }
        let off = Self::offset(address, bytes)?;
        Ok(&self.mem[off..off + bytes as usize])
    }

    /// Reads `N` little-endian words at an address aligned to `4 * N`.
    #[inline]
    fn read_words<const N: usize>(&self, address: u32) -> Result<[u32; N], FaultKind> {
        let bytes = 4 * N as u32;
        if !address.is_multiple_of(bytes) {
            return Err(FaultKind::Misaligned { address, bytes });
        }
        let off = Self::offset(address, bytes)?;
        let mut out = [0u32; N];
        for (i, w) in out.iter_mut().enumerate() {
            let b = &self.mem[off + 4 * i..off + 4 * i + 4];
            *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(out)
    }

    /// Writes `N` little-endian words at an address aligned to `4 * N`.
    #[inline]
    fn write_words<const N: usize>(
        &mut self,
        address: u32,
        words: [u32; N],
    ) -> Result<(), FaultKind> {
        let bytes = 4 * N as u32;
        if !address.is_multiple_of(bytes) {
            return Err(FaultKind::Misaligned { address, bytes });
        }
        let off = Self::offset(address, bytes)?;
        for (i, w) in words.iter().enumerate() {
            self.mem[off + 4 * i..off + 4 * i + 4].copy_from_slice(&w.to_le_bytes());
        }
        self.invalidate(address, bytes);
        Ok(())
    }

    #[inline]
    fn load_u32(&self, address: u32) -> Result<u32, FaultKind> {
        Ok(u32::from_le_bytes(
            self.load(address, 4)?.try_into().unwrap(),
        ))
    }

    #[inline]
    fn store(&mut self, address: u32, data: &[u8]) -> Result<(), FaultKind> {
        let bytes = data.len() as u32;
        if !address.is_multiple_of(bytes) {
            return Err(FaultKind::Misaligned { address, bytes });
        }
        let off = Self::offset(address, bytes)?;
        self.mem[off..off + data.len()].copy_from_slice(data);
        self.invalidate(address, bytes);
        Ok(())
    }

    // ---- code ----

    fn fetch(&mut self, pc: u32) -> Result<usize, FaultKind> {
        if !(REGION0_BASE..REGION0_END).contains(&pc) || !pc.is_multiple_of(4) {
            return Err(FaultKind::BadFetch { pc });
        }
        let w = ((pc - REGION0_BASE) / 4) as usize;
        let idx = self.code_index[w];
        if idx != 0 {
            return Ok(idx as usize - 1);
        }
        let off = (pc - SRAM_BASE) as usize;
        let end = ((REGION0_END - SRAM_BASE) as usize).min(off + 8);
        let (bundle, size) = decode_bundle_bytes(&self.mem[off..end]).map_err(|e| {
            let word = u32::from_le_bytes(self.mem[off..off + 4].try_into().unwrap());
            FaultKind::IllegalInstruction {
                word,
                reason: e.to_string(),
            }
        })?;
        self.decoded.push(Decoded::new(bundle, size as u32));
        self.code_lo = self.code_lo.min(pc);
        self.code_hi = self.code_hi.max(pc + size as u32);
        self.code_index[w] = self.decoded.len() as u32;
        Ok(self.decoded.len() - 1)
    }

    /// Disassembly of the bundle at `pc`, for error messages.
    pub(crate) fn describe(&self, pc: u32) -> Option<String> {
        let off = pc.checked_sub(SRAM_BASE)? as usize;
        let end = self.mem.len().min(off + 8);
        if off >= end {
            return None;
        }
        decode_bundle_bytes(&self.mem[off..end])
            .ok()
            .map(|(b, _)| b.to_string())
    }

    pub(crate) fn symbol_at(&self, pc: u32) -> Option<String> {
        let map = self.symbols.as_ref()?;
        let (addr, name) = map.range(..=pc).next_back()?;
        Some(if *addr == pc {
            name.clone()
        } else {
            format!("{name}+{:#x}", pc - addr)
        })
    }

    pub(crate) fn fault(
        &self,
        context: Option<usize>,
        pc: Option<u32>,
        kind: FaultKind,
    ) -> SimError {
        SimError {
            tile: self.id,
            context: context.map(|c| c as u8),
            pc,
            instruction: pc.and_then(|p| self.describe(p)),
            step: self.step,
            symbol: pc.and_then(|p| self.symbol_at(p)),
            kind,
        }
    }

    // ---- scheduling ----

    /// The earliest cycle at which the supervisor can issue, if any slot is free.
    fn supervisor_candidate(&self) -> Option<u64> {
        let s = &self.ctx[SUPERVISOR];
        if !s.running || self.sup_waiting_workers {
            return None;
        }
        let mut best: Option<u64> = None;
        for (w, c) in self.ctx[..WORKERS].iter().enumerate() {
            if c.running {
                continue;
            }
            let lo = s.next_issue.max(c.free_from).max(self.now);
            let t = lo + (w as u64 + INTERVAL - lo % INTERVAL) % INTERVAL;
            best = Some(best.map_or(t, |b| b.min(t)));
        }
        best
    }

    /// Runs until the supervisor reaches `sync`, `hsync`, `exit` or (in the
    /// exchange phase) `xend`.
    pub(crate) fn run_phase(&mut self, step_limit: u64) -> Result<PhaseEnd, SimError> {
        loop {
            // Pick the context with the earliest possible issue.
            let mut best_t = u64::MAX;
            let mut best = usize::MAX;
            for (w, c) in self.ctx[..WORKERS].iter().enumerate() {
                if c.running && c.next_issue < best_t {
                    best_t = c.next_issue;
                    best = w;
                }
            }
            if self.sup_waiting_workers && best == usize::MAX {
                // Every worker has exited: wsync completes.
                self.sup_waiting_workers = false;
                let last_exit = self.ctx[..WORKERS]
                    .iter()
                    .map(|c| c.free_from)
                    .max()
                    .unwrap_or(0);
                let s = &mut self.ctx[SUPERVISOR];
                s.next_issue = s.next_issue.max(last_exit);
            }
            if let Some(t) = self.supervisor_candidate() {
                if t < best_t {
                    best_t = t;
                    best = SUPERVISOR;
                }
            }
            if best == usize::MAX {
                let pc = self.ctx[SUPERVISOR].pc;
                return Err(self.fault(
                    Some(SUPERVISOR),
                    Some(pc),
                    FaultKind::WorkersStillRunning { running: vec![] },
                ));
            }
            self.counters.bundles += 1;
            if self.counters.bundles > step_limit {
                let pc = self.ctx[best].pc;
                return Err(self.fault(
                    Some(best),
                    Some(pc),
                    FaultKind::StepLimit { limit: step_limit },
                ));
            }
            self.now = best_t;
            if let Some(end) = self.issue(best, best_t)? {
                return Ok(end);
            }
        }
    }

    /// Issues the bundle at the pc of context `c` in cycle `t`.
    fn issue(&mut self, c: usize, t: u64) -> Result<Option<PhaseEnd>, SimError> {
        let pc = self.ctx[c].pc;
        let idx = self
            .fetch(pc)
            .map_err(|k| self.fault(Some(c), Some(pc), k))?;
        let d = self.decoded[idx];
        let (size, slots) = (d.size, d.slots);
        let flow = self
            .execute(c, t, pc, &d)
            .map_err(|k| self.fault(Some(c), Some(pc), k))?;
        let ctx = &mut self.ctx[c];
        ctx.next_issue = t + INTERVAL * slots;
        let mut next_pc = pc + size;
        let mut end = None;
        match flow {
            Flow::Next => {}
            Flow::Jump(target) => next_pc = target,
            Flow::Call(target) => {
                ctx.set_m(ipu_isa::LR, pc + size);
                next_pc = target;
            }
            Flow::Rpt { count, len } => {
                if count > 0 || len > 0 {
                    // Find the end of the body by walking `len` bundles.
                    let mut at = pc + size;
                    for _ in 0..len {
                        let i = self
                            .fetch(at)
                            .map_err(|k| self.fault(Some(c), Some(at), k))?;
                        at += self.decoded[i].size;
                    }
                    let ctx = &mut self.ctx[c];
                    if count == 0 {
                        next_pc = at;
                    } else {
                        ctx.hw_loop = Some(HwLoop {
                            start: pc + size,
                            end: at,
                            remaining: count,
                        });
                    }
                }
            }
            Flow::Exit => {
                if c == SUPERVISOR {
                    let running = self.running_workers();
                    if !running.is_empty() {
                        return Err(self.fault(
                            Some(c),
                            Some(pc),
                            FaultKind::WorkersStillRunning { running },
                        ));
                    }
                    self.ctx[c].running = false;
                    self.exited = true;
                    end = Some(PhaseEnd::Exit { at: t });
                } else {
                    ctx.running = false;
                    ctx.free_from = t + 1;
                }
            }
            Flow::Run { entry, state } => {
                let w = (0..WORKERS)
                    .find(|&w| !self.ctx[w].running)
                    .expect("the supervisor issues only while some worker slot is free");
                let first = t + 1;
                let first = first + (w as u64 + INTERVAL - first % INTERVAL) % INTERVAL;
                let wc = &mut self.ctx[w];
                wc.running = true;
                wc.pc = entry;
                wc.m = [0; 16];
                wc.a = [0; 16];
                wc.m[0] = state;
                wc.m[1] = w as u32;
                wc.hw_loop = None;
                wc.next_issue = first;
                self.amp[w].clear();
            }
            Flow::Wsync => self.sup_waiting_workers = true,
            Flow::Sync | Flow::Hsync => {
                let running = self.running_workers();
                if !running.is_empty() {
                    return Err(self.fault(
                        Some(c),
                        Some(pc),
                        FaultKind::WorkersStillRunning { running },
                    ));
                }
                end = Some(if matches!(flow, Flow::Sync) {
                    PhaseEnd::Sync { at: t }
                } else {
                    PhaseEnd::Hsync { at: t }
                });
            }
            Flow::Xend => end = Some(PhaseEnd::Xend { at: t }),
            Flow::Transfer {
                address,
                words,
                source,
                start,
            } => {
                self.record_transfer(c, pc, t, address, words, source, start as u64)?;
            }
            Flow::Xtab { table, count } => {
                // A stride prefix {STRIDE, run, bytes, 0} makes the next
                // descriptor move runs of `run` words, `bytes` apart, in
                // consecutive cycles from its start (docs/isa.md, section 6).
                let mut stride: Option<(u32, u32, u32)> = None;
                for i in 0..count {
                    let at = table.wrapping_add(16 * i);
                    let mut d = [0u32; 4];
                    for (j, v) in d.iter_mut().enumerate() {
                        *v = self
                            .load_u32(at.wrapping_add(4 * j as u32))
                            .map_err(|k| self.fault(Some(c), Some(pc), k))?;
                    }
                    if d[0] == ipu_arch::XTAB_STRIDE_KIND {
                        if stride.is_some() || d[1] == 0 {
                            let (slot, run) = stride.map_or((i, d[1]), |(s, r, _)| (s, r));
                            return Err(self.fault(
                                Some(c),
                                Some(pc),
                                FaultKind::BadStride { slot, run },
                            ));
                        }
                        stride = Some((i, d[1], d[2]));
                        continue;
                    }
                    let source = (d[0] != ipu_arch::XTAB_SEND_KIND).then_some(d[0]);
                    let issued = t + i as u64;
                    let (address, words, start) = (d[1], d[2], d[3] as u64);
                    match stride.take() {
                        None => {
                            self.record_transfer(c, pc, issued, address, words, source, start)?
                        }
                        Some((_, run, bytes)) => {
                            let mut first = 0;
                            while first < words {
                                let n = run.min(words - first);
                                let a = address.wrapping_add((first / run).wrapping_mul(bytes));
                                self.record_transfer(
                                    c,
                                    pc,
                                    issued,
                                    a,
                                    n,
                                    source,
                                    start + first as u64,
                                )?;
                                first += n;
                            }
                        }
                    }
                }
                if let Some((slot, run, _)) = stride {
                    return Err(self.fault(Some(c), Some(pc), FaultKind::BadStride { slot, run }));
                }
                let slots = (count as u64).div_ceil(INTERVAL).max(1);
                self.ctx[c].next_issue = t + INTERVAL * slots;
            }
        }
        let ctx = &mut self.ctx[c];
        if let Some(l) = ctx.hw_loop.as_mut() {
            if !matches!(flow, Flow::Rpt { .. }) && next_pc == l.end {
                if l.remaining > 1 {
                    l.remaining -= 1;
                    next_pc = l.start;
                } else {
                    ctx.hw_loop = None;
                }
            }
        }
        ctx.pc = next_pc;
        Ok(end)
    }

    fn running_workers(&self) -> Vec<u8> {
        (0..WORKERS)
            .filter(|&w| self.ctx[w].running)
            .map(|w| w as u8)
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn record_transfer(
        &mut self,
        c: usize,
        pc: u32,
        t: u64,
        address: u32,
        words: u32,
        source: Option<u32>,
        start: u64,
    ) -> Result<(), SimError> {
        let issued = t - self.exchange_t0;
        if issued > start {
            return Err(self.fault(Some(c), Some(pc), FaultKind::LateExchange { start, issued }));
        }
        if words > 0 {
            self.transfers.push(Transfer {
                address,
                words,
                start,
                source,
                pc,
            });
        }
        Ok(())
    }

    // ---- execution ----

    fn execute(&mut self, c: usize, t: u64, pc: u32, d: &Decoded) -> Result<Flow, FaultKind> {
        if c == SUPERVISOR {
            if !d.supervisor_ok {
                return Err(FaultKind::FloatInSupervisor);
            }
        } else if !d.worker_ok {
            return Err(FaultKind::SupervisorOnlyInWorker);
        }
        self.counters.instructions += d.count as u64;
        let bundle = &d.bundle;
        match *bundle {
            Bundle::Single(i) => {
                if i.slot() == Slot::Arith {
                    self.arith(c, &i)?;
                    Ok(Flow::Next)
                } else {
                    let old_a = self.ctx[c].a;
                    self.main(c, t, pc, &i, &old_a)
                }
            }
            Bundle::Pair { main, arith } => {
                // All reads of a bundle happen before its writes: the
                // arithmetic instruction reads the float registers first, and
                // the main instruction sees the float values from before it.
                let old_a = self.ctx[c].a;
                self.arith(c, &arith)?;
                self.main(c, t, pc, &main, &old_a)
            }
        }
    }

    fn arith(&mut self, c: usize, i: &Instruction) -> Result<(), FaultKind> {
        let ctx = &mut self.ctx[c];
        match *i {
            Instruction::Nop => {}
            Instruction::Float { ty, op, d, a, b } => fpu::float(&mut ctx.a, ty, op, d, a, b),
            Instruction::Hred { op, d, a } => fpu::hred(&mut ctx.a, op, d, a),
            Instruction::Cvt { op, d, a, scale } => {
                fpu::cvt(&mut ctx.a, &mut ctx.prng, op, d, a, scale)
            }
            Instruction::Shuf { op, d, a, b } => fpu::shuf(&mut ctx.a, op, d, a, b),
            Instruction::Amp { mode, d, x, p } => {
                self.amp[c].step(&mut ctx.a, mode, d, x, p).map_err(|e| {
                    FaultKind::AmpModeMismatch {
                        current: e.current.mnemonic().to_string(),
                        requested: e.requested.mnemonic().to_string(),
                    }
                })?;
            }
            Instruction::AmpW { a, index } => self.amp[c].write_weights(&ctx.a, a, index),
            Instruction::AmpClr => self.amp[c].clear(),
            Instruction::AmpScale { scale } => self.amp[c].set_scale(scale),
            _ => unreachable!("main-slot instruction in the arithmetic slot"),
        }
        Ok(())
    }

    fn effective(ctx: &Context, addr: &ipu_isa::Addr) -> (u32, Option<u32>) {
        let base = ctx.get_m(addr.base);
        match addr.mode {
            AddrMode::Offset(v) => (base.wrapping_add(v as u32), None),
            AddrMode::PostInc(v) => (base, Some(base.wrapping_add(v as u32))),
            AddrMode::Indexed(r) => (base.wrapping_add(ctx.get_m(r)), None),
            AddrMode::PostIncReg(r) => (base, Some(base.wrapping_add(ctx.get_m(r)))),
        }
    }

    fn main(
        &mut self,
        c: usize,
        t: u64,
        pc: u32,
        i: &Instruction,
        old_a: &[u32; 16],
    ) -> Result<Flow, FaultKind> {
        use Instruction::*;
        let exchange_mode = self.exchange_mode;
        if c == SUPERVISOR && exchange_mode {
            let allowed = matches!(
                i,
                Nop | Alu { .. }
                    | AluImm { .. }
                    | Setzi { .. }
                    | Sethi { .. }
                    | MovToA { .. }
                    | MovToM { .. }
                    | Get { .. }
                    | SetSeed { .. }
                    | Load { .. }
                    | Br { .. }
                    | BrRel { .. }
                    | Brz { .. }
                    | Brnz { .. }
                    | Brnzdec { .. }
                    | Call { .. }
                    | CallReg { .. }
                    | Xsend { .. }
                    | Xrecv { .. }
                    | Xtab { .. }
                    | Xend
            );
            if !allowed {
                return Err(FaultKind::NotAllowedInExchangePhase);
            }
        } else if matches!(i, Xsend { .. } | Xrecv { .. } | Xtab { .. } | Xend) {
            return Err(FaultKind::NotInExchangePhase);
        }
        if self.ctx[c].hw_loop.is_some() && i.is_control() {
            return Err(FaultKind::ControlInLoopBody);
        }
        let ctx = &mut self.ctx[c];
        Ok(match *i {
            Nop => Flow::Next,
            Alu { op, d, a, b } => {
                let v = op.eval(ctx.get_m(a), ctx.get_m(b));
                ctx.set_m(d, v);
                Flow::Next
            }
            AluImm { op, d, a, imm } => {
                let v = op.eval(ctx.get_m(a), imm as u32);
                ctx.set_m(d, v);
                Flow::Next
            }
            Setzi { d, imm } | Sethi { d, imm } => {
                let v = if matches!(i, Setzi { .. }) {
                    imm
                } else {
                    imm << 12
                };
                match d {
                    Reg::M(m) => ctx.set_m(m, v),
                    Reg::A(a) => ctx.a[a.first as usize] = v,
                }
                Flow::Next
            }
            MovToA { d, a } => {
                ctx.a[d.first as usize] = ctx.get_m(a);
                Flow::Next
            }
            MovToM { d, a } => {
                let v = old_a[a.first as usize];
                ctx.set_m(d, v);
                Flow::Next
            }
            Get { d, sreg } => {
                let v = match sreg {
                    SpecialReg::TileId => self.id,
                    SpecialReg::ContextId => c as u32,
                    SpecialReg::CycleLo => t as u32,
                    SpecialReg::CycleHi => (t >> 32) as u32,
                    SpecialReg::BspStep => self.syncs_done,
                };
                self.ctx[c].set_m(d, v);
                Flow::Next
            }
            SetSeed { a, b } => {
                ctx.prng = Prng::new(ctx.get_m(a) as u64 | (ctx.get_m(b) as u64) << 32);
                Flow::Next
            }
            Load { kind, d, addr } => {
                let (ea, post) = Self::effective(ctx, &addr);
                if kind == LoadKind::A128 && Region::of(ea) != Some(Region::Interleaved) {
                    return Err(FaultKind::NotInterleaved { address: ea });
                }
                let bytes = kind.bytes();
                let mut buf = [0u8; 16];
                buf[..bytes as usize].copy_from_slice(self.load(ea, bytes)?);
                let ctx = &mut self.ctx[c];
                if let Some(p) = post {
                    ctx.set_m(addr.base, p);
                }
                match d {
                    Reg::M(m) => ctx.set_m(m, u32::from_le_bytes(buf[..4].try_into().unwrap())),
                    Reg::A(a) => {
                        if kind == LoadKind::A16 {
                            ctx.a[a.first as usize] = u16::from_le_bytes([buf[0], buf[1]]) as u32;
                        } else {
                            for k in 0..a.count as usize {
                                ctx.a[a.first as usize + k] =
                                    u32::from_le_bytes(buf[4 * k..4 * k + 4].try_into().unwrap());
                            }
                        }
                    }
                }
                Flow::Next
            }
            Store { kind, s, addr } => {
                let (ea, post) = Self::effective(ctx, &addr);
                let mut buf = [0u8; 8];
                let bytes = kind.bytes() as usize;
                match (kind, s) {
                    (StoreKind::M32, Reg::M(m)) => {
                        buf[..4].copy_from_slice(&ctx.get_m(m).to_le_bytes())
                    }
                    (_, Reg::A(a)) => {
                        for k in 0..a.count as usize {
                            buf[4 * k..4 * k + 4]
                                .copy_from_slice(&old_a[a.first as usize + k].to_le_bytes());
                        }
                    }
                    _ => unreachable!("validated store operands"),
                }
                self.store(ea, &buf[..bytes])?;
                if let Some(p) = post {
                    self.ctx[c].set_m(addr.base, p);
                }
                Flow::Next
            }
            LdSt {
                kind,
                d,
                s,
                base,
                stride,
                pace,
            } => {
                self.ldst(c, kind, d, s, base, stride, pace, old_a)?;
                Flow::Next
            }
            Br { a } | CallReg { a } => {
                let target = ctx.get_m(a);
                if matches!(i, Br { .. }) {
                    Flow::Jump(target)
                } else {
                    Flow::Call(target)
                }
            }
            BrRel { offset } => Flow::Jump(pc.wrapping_add(offset as u32)),
            Call { offset } => Flow::Call(pc.wrapping_add(offset as u32)),
            Brz { a, offset } => {
                if ctx.get_m(a) == 0 {
                    Flow::Jump(pc.wrapping_add(offset as u32))
                } else {
                    Flow::Next
                }
            }
            Brnz { a, offset } => {
                if ctx.get_m(a) != 0 {
                    Flow::Jump(pc.wrapping_add(offset as u32))
                } else {
                    Flow::Next
                }
            }
            Brnzdec { a, offset } => {
                let v = ctx.get_m(a);
                if v != 0 {
                    ctx.set_m(a, v - 1);
                    Flow::Jump(pc.wrapping_add(offset as u32))
                } else {
                    Flow::Next
                }
            }
            Rpt { count, len } => Flow::Rpt {
                count: ctx.get_m(count),
                len,
            },
            RptImm { count, len } => Flow::Rpt {
                count: count as u32,
                len,
            },
            Exit => Flow::Exit,
            Run { entry, state } => Flow::Run {
                entry: ctx.get_m(entry),
                state: ctx.get_m(state),
            },
            Wsync => Flow::Wsync,
            Sync => Flow::Sync,
            Hsync => Flow::Hsync,
            Xend => Flow::Xend,
            Xsend { addr, words, start } => Flow::Transfer {
                address: ctx.get_m(addr),
                words: ctx.get_m(words),
                source: None,
                start: ctx.get_m(start),
            },
            Xrecv {
                addr,
                words,
                src,
                start,
            } => Flow::Transfer {
                address: ctx.get_m(addr),
                words: ctx.get_m(words),
                source: Some(ctx.get_m(src)),
                start: ctx.get_m(start),
            },
            Xtab { table, count } => Flow::Xtab {
                table: ctx.get_m(table),
                count: ctx.get_m(count),
            },
            _ => unreachable!("arithmetic instruction in the main slot"),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn ldst(
        &mut self,
        c: usize,
        kind: LdStKind,
        d: ipu_isa::AReg,
        s: ipu_isa::AReg,
        base: MReg,
        stride: MReg,
        pace: u8,
        old_a: &[u32; 16],
    ) -> Result<(), FaultKind> {
        let ctx = &self.ctx[c];
        let ptr = |i: u8| ctx.get_m(MReg(base.0 + i));
        let sv = ctx.get_m(stride);
        let (p0, p1) = (ptr(0), ptr(1));
        let store_at = if kind == LdStKind::Ld2x64St64 {
            ptr(2)
        } else {
            p1
        };
        let store_key = element_key(store_at);
        let mut loaded = [0u32; 4];
        match kind {
            LdStKind::Ld64St64 => {
                if element_key(p0) == store_key && store_key != u32::MAX {
                    return Err(FaultKind::MemoryConflict {
                        first: p0,
                        second: store_at,
                    });
                }
                let w: [u32; 2] = self.read_words(p0)?;
                loaded[..2].copy_from_slice(&w);
            }
            LdStKind::Ld128St64 => {
                if Region::of(p0) != Some(Region::Interleaved) {
                    return Err(FaultKind::NotInterleaved { address: p0 });
                }
                if element_key(p0) == store_key {
                    return Err(FaultKind::MemoryConflict {
                        first: p0,
                        second: store_at,
                    });
                }
                loaded = self.read_words(p0)?;
            }
            LdStKind::Ld2x64St64 => {
                for a in [p0, p1] {
                    if Region::of(a) != Some(Region::Interleaved) {
                        return Err(FaultKind::NotInterleaved { address: a });
                    }
                    if element_key(a) == store_key {
                        return Err(FaultKind::MemoryConflict {
                            first: a,
                            second: store_at,
                        });
                    }
                }
                // Two loads may share an interleaved element only in different banks (address bit 3).
                if element_key(p0) == element_key(p1) && (p0 ^ p1) & 8 == 0 {
                    return Err(FaultKind::MemoryConflict {
                        first: p0,
                        second: p1,
                    });
                }
                let w0: [u32; 2] = self.read_words(p0)?;
                let w1: [u32; 2] = self.read_words(p1)?;
                loaded = [w0[0], w0[1], w1[0], w1[1]];
            }
        }
        // The store writes the float values from before the bundle.
        let s0 = s.first as usize;
        self.write_words(store_at, [old_a[s0], old_a[s0 + 1]])?;
        let ctx = &mut self.ctx[c];
        let n = d.count as usize;
        ctx.a[d.first as usize..d.first as usize + n].copy_from_slice(&loaded[..n]);
        let natural = [if kind == LdStKind::Ld128St64 { 16 } else { 8 }, 8, 8];
        // Post-increments per pace code.
        for i in 0..kind.address_registers() {
            let inc = match (pace >> (2 * i)) & 3 {
                0 => natural[i as usize],
                1 => sv as u16 as i16 as i32 as u32,
                2 => (sv >> 16) as u16 as i16 as i32 as u32,
                _ => continue,
            };
            let r = MReg(base.0 + i);
            let v = ctx.get_m(r).wrapping_add(inc);
            ctx.set_m(r, v);
        }
        Ok(())
    }
}
