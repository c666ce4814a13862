//! Scheduling: start cycles for every piece so that no tile's send port or
//! receive port carries two pieces at once, with a short horizon.
//!
//! The core is an event-driven list scheduler over ports. Each tile has a
//! send port and a receive port; a piece needs its source's send port and
//! every destination's receive port for `words` consecutive cycles. Time
//! advances from event to event (a port becoming free or becoming ready).
//! At each event the freed ports are taken in order of criticality
//! (remaining words plus a learned bonus, highest first) and each one starts
//! the pending piece, among those whose other ports are all free, whose most
//! critical other port has the most remaining work. Serving the port with
//! the most work left first is the classic rule for open-shop schedules; it
//! keeps the ports that bound the horizon busy.
//!
//! The issue constraint of `xtab` (table slot i of a tile issues at `c + i`)
//! is enforced during the construction: pieces start in nondecreasing time,
//! so a tile that has taken `k` slots can start the next descriptor no
//! earlier than `c + k`, or `c + k + 1` when it is strided (its prefix
//! comes first). Lowering only ever merges descriptors, and a merge never
//! takes more slots than its parts, so the constraint still holds on the
//! final tables.
//!
//! Improvement (squeaky wheel): after each construction, every port that
//! finished after the lower bound gets a priority bonus equal to its lateness,
//! and the construction reruns; the best schedule over all rounds is kept.
//! The driver also runs the whole search for several piece sizes (see
//! `coalesce::split`) in parallel and keeps the best result. Everything is
//! deterministic: ties break by port and piece index, never by hash order or
//! wall-clock time, and the number of rounds depends only on the phase size.

use crate::coalesce::{Job, Piece};
use std::cell::Cell;
use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};

/// A piece with its start cycle (after the exchange phase start `T0`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Placed {
    /// Start cycle.
    pub start: u64,
    /// The piece.
    pub piece: Piece,
}

/// A complete schedule of the pieces of one phase.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    /// Every piece exactly once, sorted by (start, job, offset).
    pub placed: Vec<Placed>,
    /// End of the last piece (cycles after `T0`); 0 for an empty phase.
    pub horizon: u64,
}

/// Send port of a tile.
fn send_port(tile: u32) -> usize {
    2 * tile as usize
}
/// Receive port of a tile.
fn recv_port(tile: u32) -> usize {
    2 * tile as usize + 1
}

/// One construction of the list scheduler.
///
/// Data structures (ports are indexed by 2 * tile + side):
/// - Classes: the pieces whose jobs have the same destination tile set form
///   a class, named by its receive ports. A piece's ports are its send port
///   and its class's receive ports. `class_busy[c]` counts the ports of class
///   `c` that are not idle, so whether all receive ports of a piece are free
///   is one lookup instead of a walk over its destinations. Multicast phases
///   have few classes (on SigLIP attention: one per head and key split for
///   K^T and V rows, and one per head and query block for Q rows), so a port
///   only ever examines the pieces of classes whose receivers are all idle.
/// - `class_pieces[c]`: the pending pieces of class `c`, grouped by send
///   port; `send_pieces[p]`: the pending pieces of send port `p`, grouped by
///   class. A scan tests each group's sender or class once and skips the
///   group when it is busy: on SigLIP-shaped attention phases a class holds
///   hundreds of pieces from a few dozen senders. Entries of started pieces
///   are dropped lazily.
/// - `adj[p]`, only for ports all of whose pieces are unicast: `(other port,
///   piece)` sorted, for every piece of `p`; a started piece's entries get
///   the piece [`DEAD`] in place and are dropped lazily. For lists long
///   enough to be walked, `adj_index[p]` gives by counterpart tile the
///   position of its first entry, so a lookup costs one load instead of a
///   binary search (the walk does millions of them on all-to-all phases),
///   and a bit per counterpart tile saying whether it has an entry at all:
///   most idle ports the walk meets have none, and the bits of a port fit
///   in three cache lines where its positions take 6 KB at 1472 tiles.
/// - `idle[side]`: the ports of that side that are free, ready (issue
///   constraint) and have work left at the current cycle, ordered by
///   priority (highest first). A piece can start at `t` only if all its
///   ports are idle. A unicast port whose list is not short looks for work by
///   walking the other side's idle set in priority order and looking each
///   idle port up in its sorted `adj` list, stopping as soon as no better
///   piece can follow; every other port scans the pending pieces of its
///   classes whose receivers are all idle. Both ways choose the same piece
///   (one total order: counterpart priority, then words, then lower piece
///   index), so results do not depend on the way taken.
struct Construction<'a> {
    pieces: &'a [Piece],
    piece_words: Vec<u32>,
    /// Pieces whose source tile is also a destination: they add two
    /// descriptors to one tile at the same cycle.
    self_loop: Vec<bool>,
    /// Send port of each piece.
    piece_send: Vec<u32>,
    /// Class of each piece.
    piece_class: Vec<u32>,
    /// Receive ports of class c: `class_list[class_start[c]..class_start[c + 1]]`.
    class_start: Vec<u32>,
    class_list: Vec<u32>,
    /// Ports of each class that are not idle.
    class_busy: Vec<u32>,
    /// Pending pieces of each class, grouped by send port.
    class_pieces: Vec<Grouped>,
    /// Classes of each receive port, ascending (empty for send ports).
    port_classes: Vec<Vec<u32>>,
    /// Pending pieces of each send port, grouped by class.
    send_pieces: Vec<Grouped>,
    issue_offset: u64,
    bonus: &'a [u64],
    /// Cycle from which each port is free.
    free: Vec<u64>,
    /// Words still to be scheduled on each port.
    remaining: Vec<u64>,
    /// Table slots already taken on each tile.
    started: Vec<u64>,
    /// The most slots taken on any tile of each class: a strided piece
    /// waits for the latest issue cycle among its tiles, and offers ask for
    /// it far more often than pieces start.
    class_started: Vec<u64>,
    /// Slots each descriptor of a piece may take: 2 for a piece of whole
    /// runs of a strided job (its prefix first), else 1.
    piece_slots: Vec<u8>,
    /// The last piece of each piece's job when the pieces are in job order
    /// (as `coalesce::split` makes them), else the piece itself: the walk
    /// skips the rest of a job's entries after offering its first live one.
    job_last: Vec<u32>,
    /// Only filled for ports in `all_unicast`.
    adj: Vec<Vec<AdjEntry>>,
    /// Entries of started pieces still in `adj[p]`.
    dead: Vec<u32>,
    /// Position in `adj[p]` of the first entry of each counterpart tile, or
    /// [`NO_ENTRY`]; empty for lists that are never walked.
    adj_index: Vec<AdjIndex>,
    /// Position of each unicast piece's entry in `adj` of its send port
    /// (index 0) and of its receive port (index 1), where those are kept,
    /// so that starting a piece marks its entries without a search.
    adj_pos: Vec<[u32; 2]>,
    /// True when every piece of the port has one destination.
    all_unicast: Vec<bool>,
    /// Idle ports by side (0 = send, 1 = receive), highest priority first.
    idle: [BTreeSet<(Reverse<u64>, u32)>; 2],
    /// The key under which an idle port sits in `idle`, or [`NOT_IDLE`].
    idle_key: Vec<u64>,
    start: Vec<u64>,
    /// Whether `idle[side]` is kept: only a unicast port of the other side
    /// ever walks it, and keeping it costs a tree update per idle change.
    track_idle: [bool; 2],
    events: Calendar,
    /// Tests only: choose by the plain rule (every pending piece of the
    /// port, every other port of it tested for idleness) instead of the
    /// class counters, the walk and its index, to check they agree.
    reference_search: bool,
}

/// The pending events (a port to examine at a cycle), as a calendar queue:
/// every event lies in `base..base + buckets.len()` and sits in bucket
/// `time % buckets.len()`. Events are never scheduled before the cycle being
/// processed, so popping advances `base` monotonically; the window doubles
/// when an event lies beyond it.
struct Calendar {
    base: u64,
    buckets: Vec<Vec<u32>>,
    pending: usize,
}

impl Calendar {
    fn new() -> Self {
        Calendar {
            base: 0,
            buckets: vec![Vec::new(); 64],
            pending: 0,
        }
    }

    fn push(&mut self, time: u64, port: u32) {
        debug_assert!(
            time >= self.base,
            "event at {time} before cycle {}",
            self.base
        );
        if time - self.base >= self.buckets.len() as u64 {
            self.grow(time);
        }
        let n = self.buckets.len() as u64;
        self.buckets[(time % n) as usize].push(port);
        self.pending += 1;
    }

    fn grow(&mut self, time: u64) {
        let old_len = self.buckets.len() as u64;
        let mut n = old_len;
        while time - self.base >= n {
            n *= 2;
        }
        let old = std::mem::replace(&mut self.buckets, vec![Vec::new(); n as usize]);
        for (i, bucket) in old.into_iter().enumerate() {
            // Bucket i held the one time in the old window congruent to i.
            let offset = (i as u64 + old_len - self.base % old_len) % old_len;
            self.buckets[((self.base + offset) % n) as usize] = bucket;
        }
    }

    /// Moves the ports of the earliest pending cycle into `batch` (in no
    /// particular order) and returns that cycle.
    fn pop(&mut self, batch: &mut Vec<u32>) -> Option<u64> {
        if self.pending == 0 {
            return None;
        }
        let n = self.buckets.len() as u64;
        loop {
            let bucket = &mut self.buckets[(self.base % n) as usize];
            if !bucket.is_empty() {
                self.pending -= bucket.len();
                batch.append(bucket);
                return Some(self.base);
            }
            self.base += 1;
        }
    }
}

const UNSCHEDULED: u64 = u64::MAX;
/// The piece of an `adj` entry whose piece has started.
const DEAD: u32 = u32::MAX;
/// An `adj_index` entry for a tile with no entry in the list.
const NO_ENTRY: u32 = u32::MAX;
/// Lists up to this long are scanned, never walked, and get no index.
const SHORT_LIST: usize = 16;

/// An `adj` entry: (other port, piece or [`DEAD`]).
type AdjEntry = (u32, u32);

/// Records in `positions` where each live piece of port `port`'s `adj` list is.
fn record_positions(list: &[AdjEntry], port: usize, positions: &mut [[u32; 2]]) {
    for (i, &(_, q)) in list.iter().enumerate() {
        if q != DEAD {
            positions[q as usize][port & 1] = i as u32;
        }
    }
}

/// Where the entries of each counterpart tile start in a port's `adj` list.
#[derive(Default)]
struct AdjIndex {
    /// Position of the first entry of each counterpart tile, or [`NO_ENTRY`].
    first: Vec<u32>,
    /// Bit `t` is set when `first[t]` is not [`NO_ENTRY`].
    has: Vec<u64>,
    /// Bits set in `has`: the counterparts with a live entry.
    counterparts: usize,
}

impl AdjIndex {
    fn new(list: &[AdjEntry], tiles: u32) -> Self {
        let mut index = AdjIndex {
            first: vec![NO_ENTRY; tiles as usize],
            has: vec![0; (tiles as usize).div_ceil(64)],
            counterparts: 0,
        };
        index.record(list);
        index
    }

    /// Records the first position of each counterpart in `list`.
    fn record(&mut self, list: &[AdjEntry]) {
        for (i, &(o, _)) in list.iter().enumerate() {
            if i == 0 || list[i - 1].0 != o {
                let tile = o as usize / 2;
                self.first[tile] = i as u32;
                self.set(tile);
            }
        }
    }

    /// Forgets every counterpart of `list`, before `list` changes.
    fn forget(&mut self, list: &[AdjEntry]) {
        for &(o, _) in list {
            let tile = o as usize / 2;
            self.first[tile] = NO_ENTRY;
            self.clear(tile);
        }
    }

    fn set(&mut self, tile: usize) {
        let bit = 1 << (tile % 64);
        self.counterparts += usize::from(self.has[tile / 64] & bit == 0);
        self.has[tile / 64] |= bit;
    }

    fn clear(&mut self, tile: usize) {
        let bit = 1 << (tile % 64);
        self.counterparts -= usize::from(self.has[tile / 64] & bit != 0);
        self.has[tile / 64] &= !bit;
    }

    /// Moves counterpart `other`'s first position past the started entry at
    /// `pos` and the started entries after it, when that entry was its
    /// first; forgets the counterpart when none of its entries is live.
    fn passed(&mut self, list: &[AdjEntry], pos: usize, other: u32) {
        let tile = other as usize / 2;
        if self.first[tile] as usize != pos {
            return;
        }
        let mut i = pos;
        while list.get(i).is_some_and(|&(o, q)| o == other && q == DEAD) {
            i += 1;
        }
        if list.get(i).is_some_and(|&(o, _)| o == other) {
            self.first[tile] = i as u32;
        } else {
            self.first[tile] = NO_ENTRY;
            self.clear(tile);
        }
    }

    /// Position of the first entry of counterpart `tile`, if it has one.
    fn lookup(&self, tile: usize) -> Option<usize> {
        (self.has[tile / 64] >> (tile % 64) & 1 == 1).then(|| self.first[tile] as usize)
    }

    fn is_empty(&self) -> bool {
        self.first.is_empty()
    }
}
const NOT_IDLE: u64 = u64::MAX;

/// Choice key: (counterpart priority, words, lower piece index first).
type Key = (u64, u32, Reverse<u32>);

/// Pieces grouped by a key (a send port or a class), each group best first
/// (most words, then lowest piece: the choice order for pieces of one
/// score), so that a scan tests a group's key once and offers its pending
/// pieces in that order until one is ready. All pieces of a group share
/// their sender and their class, so they have one score: the first ready
/// piece is the best the group has. It is nearly always the first pending
/// one; a piece of several runs of a strided job waits an issue cycle for
/// its prefix where a later piece of one run does not.
#[derive(Clone, Default)]
struct Grouped {
    pieces: Vec<u32>,
    /// Each group: its key, the end of its pieces in `pieces` (they start at
    /// the previous group's end), and the first of them not known to be
    /// started (the entries before it are started pieces, which a group's
    /// scan would otherwise step over again each time).
    groups: Vec<(u32, u32, Cell<u32>)>,
    /// Entries of started pieces still in `pieces`.
    dead: u32,
}

impl Grouped {
    /// Groups `pieces` by `key[piece]`, best first within a group.
    fn new(mut pieces: Vec<u32>, key: &[u32], words: &[u32]) -> Self {
        pieces.sort_unstable_by_key(|&q| (key[q as usize], Reverse(words[q as usize]), q));
        let mut grouped = Grouped {
            pieces,
            groups: Vec::new(),
            dead: 0,
        };
        grouped.index(key);
        grouped
    }

    fn index(&mut self, key: &[u32]) {
        self.groups.clear();
        for (i, &q) in self.pieces.iter().enumerate() {
            let k = key[q as usize];
            match self.groups.last_mut() {
                Some((last, end, _)) if *last == k => *end = i as u32 + 1,
                _ => self.groups.push((k, i as u32 + 1, Cell::new(i as u32))),
            }
        }
    }

    /// Each group's key and its pieces from the first pending one on (empty
    /// when it has none; started pieces may follow it).
    fn pending<'s>(&'s self, start: &'s [u64]) -> impl Iterator<Item = (u32, &'s [u32])> + 's {
        self.groups.iter().map(move |(k, end, first)| {
            let from = first.get();
            let rest = &self.pieces[from as usize..*end as usize];
            let skip = rest
                .iter()
                .position(|&q| start[q as usize] == UNSCHEDULED)
                .unwrap_or(rest.len());
            first.set(from + skip as u32);
            (*k, &rest[skip..])
        })
    }

    /// Counts one more started piece and drops the entries of started
    /// pieces once they are the majority, so that scans stay proportional to
    /// the pending work.
    fn compact(&mut self, start: &[u64], key: &[u32]) {
        self.dead += 1;
        if 2 * self.dead as usize > self.pieces.len() {
            self.pieces.retain(|&q| start[q as usize] == UNSCHEDULED);
            self.index(key);
            self.dead = 0;
        }
    }
}

impl<'a> Construction<'a> {
    fn new(jobs: &'a [Job], pieces: &'a [Piece], tiles: u32, c: u64, bonus: &'a [u64]) -> Self {
        let ports = 2 * tiles as usize;
        // Classes are numbered in the order of their first job, which is
        // canonical (see `coalesce`); the map is only looked up, never iterated.
        let mut class_ids: HashMap<Vec<u32>, u32> = HashMap::new();
        let mut class_start = vec![0u32];
        let mut class_list = Vec::new();
        let job_class: Vec<u32> = jobs
            .iter()
            .map(|job| {
                let tiles: Vec<u32> = job.destinations.iter().map(|d| d.tile).collect();
                let next = class_ids.len() as u32;
                *class_ids.entry(tiles).or_insert_with(|| {
                    class_list.extend(job.destinations.iter().map(|d| recv_port(d.tile) as u32));
                    class_start.push(class_list.len() as u32);
                    next
                })
            })
            .collect();
        let classes = class_start.len() - 1;
        let class_ports =
            |k: usize| &class_list[class_start[k] as usize..class_start[k + 1] as usize];
        let mut remaining = vec![0u64; ports];
        let mut all_unicast = vec![true; ports];
        let mut piece_words = Vec::with_capacity(pieces.len());
        let mut self_loop = Vec::with_capacity(pieces.len());
        let mut piece_send = Vec::with_capacity(pieces.len());
        let mut piece_class = Vec::with_capacity(pieces.len());
        let mut piece_slots = Vec::with_capacity(pieces.len());
        let mut class_pieces: Vec<Vec<u32>> = vec![Vec::new(); classes];
        let mut send_pieces: Vec<Vec<u32>> = vec![Vec::new(); ports];
        for (i, p) in pieces.iter().enumerate() {
            let job = &jobs[p.job as usize];
            let w = p.words as u64;
            let s = send_port(job.source);
            let k = job_class[p.job as usize];
            piece_words.push(p.words);
            let strided = p.words > job.run
                && (0..=job.destinations.len()).any(|end| job.stride_at(end).is_some());
            piece_slots.push(1 + u8::from(strided));
            self_loop.push(job.destinations.iter().any(|d| d.tile == job.source));
            piece_send.push(s as u32);
            piece_class.push(k);
            class_pieces[k as usize].push(i as u32);
            send_pieces[s].push(i as u32);
            remaining[s] += w;
            let unicast = job.destinations.len() == 1;
            all_unicast[s] &= unicast;
            for &r in class_ports(k as usize) {
                remaining[r as usize] += w;
                all_unicast[r as usize] &= unicast;
            }
        }
        let class_pieces: Vec<Grouped> = class_pieces
            .into_iter()
            .map(|list| Grouped::new(list, &piece_send, &piece_words))
            .collect();
        let send_pieces: Vec<Grouped> = send_pieces
            .into_iter()
            .map(|list| Grouped::new(list, &piece_class, &piece_words))
            .collect();
        let mut port_classes: Vec<Vec<u32>> = vec![Vec::new(); ports];
        for k in 0..classes {
            for &r in class_ports(k) {
                port_classes[r as usize].push(k as u32);
            }
        }
        // The walk over the other side's idle ports needs, per port, its
        // pieces by counterpart; only unicast ports take that way.
        let mut adj: Vec<Vec<AdjEntry>> = vec![Vec::new(); ports];
        for (i, p) in pieces.iter().enumerate() {
            let job = &jobs[p.job as usize];
            if let [d] = job.destinations.as_slice() {
                let (s, r) = (send_port(job.source), recv_port(d.tile));
                if all_unicast[s] {
                    adj[s].push((r as u32, i as u32));
                }
                if all_unicast[r] {
                    adj[r].push((s as u32, i as u32));
                }
            }
        }
        let mut adj_pos = vec![[0u32; 2]; pieces.len()];
        for (p, list) in adj.iter_mut().enumerate() {
            list.sort_unstable();
            record_positions(list, p, &mut adj_pos);
        }
        // Only a port with many counterparts walks: one with few scans them
        // at one test each (the scans see a counterpart's pieces as one
        // group), however many pieces it has.
        let adj_index: Vec<AdjIndex> = adj
            .iter()
            .map(|list| {
                if list.len() <= SHORT_LIST {
                    return AdjIndex::default();
                }
                let index = AdjIndex::new(list, tiles);
                if index.counterparts > SHORT_LIST {
                    index
                } else {
                    AdjIndex::default()
                }
            })
            .collect();
        let job_order = pieces.windows(2).all(|w| w[0].job <= w[1].job);
        let mut job_last: Vec<u32> = (0..pieces.len() as u32).collect();
        if job_order {
            for i in (1..pieces.len()).rev() {
                if pieces[i - 1].job == pieces[i].job {
                    job_last[i - 1] = job_last[i];
                }
            }
        }
        let class_busy = (0..classes).map(|k| class_ports(k).len() as u32).collect();
        let mut events = Calendar::new();
        for (p, &r) in remaining.iter().enumerate() {
            if r > 0 {
                events.push(c, p as u32);
            }
        }
        // Only a port that may walk reads the other side's idle set (the
        // attention rounds of Llama-2-7B, multicast with some unicast pieces
        // between few tiles, kept both sets for nothing: about half of
        // their construction time went into the trees).
        let walks = |side: usize| (side..ports).step_by(2).any(|p| !adj_index[p].is_empty());
        let track_idle = [walks(1), walks(0)];
        Construction {
            pieces,
            piece_words,
            self_loop,
            piece_send,
            piece_class,
            class_busy,
            class_pieces,
            class_start,
            class_list,
            port_classes,
            send_pieces,
            issue_offset: c,
            bonus,
            free: vec![c; ports],
            remaining,
            started: vec![0; tiles as usize],
            class_started: vec![0; classes],
            piece_slots,
            job_last,
            adj,
            adj_index,
            dead: vec![0; ports],
            adj_pos,
            all_unicast,
            idle: [BTreeSet::new(), BTreeSet::new()],
            idle_key: vec![NOT_IDLE; ports],
            start: vec![UNSCHEDULED; pieces.len()],
            track_idle,
            events,
            reference_search: false,
        }
    }

    /// The first cycle at which `tile` may start a contiguous descriptor:
    /// the issue cycle of its next slot.
    fn ready_at(&self, tile: usize) -> u64 {
        self.issue_offset + self.started[tile]
    }

    fn priority(&self, port: usize) -> u64 {
        self.remaining[port] + self.bonus[port]
    }

    fn is_idle(&self, port: usize) -> bool {
        self.idle_key[port] != NOT_IDLE
    }

    fn make_idle(&mut self, p: usize) {
        if self.idle_key[p] == NOT_IDLE {
            let k = self.priority(p);
            self.idle_key[p] = k;
            if self.track_idle[p & 1] {
                self.idle[p & 1].insert((Reverse(k), p as u32));
            }
            for &k in &self.port_classes[p] {
                self.class_busy[k as usize] -= 1;
            }
        }
    }

    fn make_busy(&mut self, p: usize) {
        let k = std::mem::replace(&mut self.idle_key[p], NOT_IDLE);
        if k != NOT_IDLE {
            if self.track_idle[p & 1] {
                self.idle[p & 1].remove(&(Reverse(k), p as u32));
            }
            for &k in &self.port_classes[p] {
                self.class_busy[k as usize] += 1;
            }
        }
    }

    fn class_ports(&self, k: u32) -> &[u32] {
        &self.class_list
            [self.class_start[k as usize] as usize..self.class_start[k as usize + 1] as usize]
    }

    /// Highest priority among the receive ports of class `k`, except `except`.
    fn class_priority(&self, k: u32, except: usize) -> u64 {
        self.class_ports(k)
            .iter()
            .filter(|&&x| x as usize != except)
            .map(|&x| self.priority(x as usize))
            .max()
            .unwrap_or(0)
    }

    /// The schedule, or `None` when `stop` said so (it is asked every
    /// [`STOP_POLL`] events).
    fn run(mut self, stop: &dyn Fn() -> bool) -> Option<Schedule> {
        let mut batch: Vec<u32> = Vec::new();
        let mut events = 0u32;
        loop {
            events = events.wrapping_add(1);
            if events.is_multiple_of(STOP_POLL) && stop() {
                return None;
            }
            batch.clear();
            let Some(t) = self.events.pop(&mut batch) else {
                break;
            };
            batch.sort_unstable();
            batch.dedup();
            // Every port of the batch that is free, ready and has work becomes
            // idle before any of them chooses, so that each sees all the others.
            batch.retain(|&p| {
                let p = p as usize;
                if self.remaining[p] == 0 || self.free[p] > t {
                    // A busy port has its own event at the cycle it becomes free.
                    return false;
                }
                let ready_at = self.ready_at(p / 2);
                if ready_at > t {
                    self.events.push(ready_at, p as u32);
                    return false;
                }
                true
            });
            for &p in &batch {
                self.make_idle(p as usize);
            }
            batch.sort_by_key(|&p| (Reverse(self.priority(p as usize)), p));
            for &p in &batch {
                if self.is_idle(p as usize) {
                    self.try_port(p as usize, t);
                }
            }
        }
        let mut placed = Vec::with_capacity(self.start.len());
        let mut horizon = 0;
        for (i, &s) in self.start.iter().enumerate() {
            // Every piece is started: the last of its ports to become free and
            // ready raises an event that examines it, and an idle port only
            // declines a startable piece by starting another one.
            assert_ne!(s, UNSCHEDULED, "list scheduler left piece {i} unscheduled");
            horizon = horizon.max(s + self.piece_words[i] as u64);
            placed.push(Placed {
                start: s,
                piece: self.pieces[i],
            });
        }
        placed.sort_unstable();
        Some(Schedule { placed, horizon })
    }

    /// Offers piece `q`, whose ports other than the chooser are all idle, with
    /// the highest priority among them `score`. False when `q` must wait
    /// for a later issue cycle (then `retry` holds the earliest).
    fn offer(&self, q: u32, score: u64, t: u64, best: &mut Option<Key>, retry: &mut u64) -> bool {
        let slots = self.piece_slots[q as usize] as u64;
        if slots > 1 {
            // A strided piece's descriptors issue a slot after their
            // prefixes, on every tile of the piece (its ports are idle, so
            // ready for a contiguous descriptor already).
            let qi = q as usize;
            let sender = self.piece_send[qi] as usize / 2;
            let class_most = self.issue_offset + self.class_started[self.piece_class[qi] as usize];
            let ready_at = self.ready_at(sender).max(class_most) + slots - 1;
            if ready_at > t {
                *retry = (*retry).min(ready_at);
                return false;
            }
        }
        if self.self_loop[q as usize] {
            // The tile's receive issues after its send (and after its
            // prefix when strided).
            let source = self.piece_send[q as usize] as usize / 2;
            let ready_at = self.ready_at(source) + 2 * slots - 1;
            if ready_at > t {
                *retry = (*retry).min(ready_at);
                return false;
            }
        }
        let key = (score, self.piece_words[q as usize], Reverse(q));
        if best.is_none_or(|b| key > b) {
            *best = Some(key);
        }
        true
    }

    /// Offers the pending pieces of a group (best first, all of one score)
    /// until one is ready: the later ones cannot beat it.
    fn offer_group(
        &self,
        pieces: &[u32],
        score: u64,
        t: u64,
        best: &mut Option<Key>,
        retry: &mut u64,
    ) {
        for &q in pieces {
            if self.start[q as usize] == UNSCHEDULED && self.offer(q, score, t, best, retry) {
                return;
            }
        }
    }

    fn try_port(&mut self, p: usize, t: u64) {
        let mut best: Option<Key> = None;
        let mut retry = u64::MAX;
        let list = &self.adj[p];
        let live = list.len() - self.dead[p] as usize;
        let opposite = &self.idle[(p & 1) ^ 1];
        // Walking the idle set in priority order usually stops after about
        // (ports of the other side / live counterparts) lookups; scanning
        // costs about one test per live counterpart (the scans see a
        // counterpart's pieces as one group). But when few of the port's
        // counterparts are idle the walk meets no entry and runs through the
        // whole set, so it gives up after that many lookups and the scan
        // decides. Counterparts, not entries: a phase cut into fine pieces
        // has thousands of entries for each of a few counterparts (a
        // Llama-2-7B reduce-scatter in 17-word pieces walked all 1,472 idle
        // ports at nearly every choice, 7.5 s a construction). Both ways
        // choose the same piece. Only a port that had more than SHORT_LIST
        // counterparts at the start has an index and walks; the others, and
        // lists grown short, are scanned.
        let counterparts = self.adj_index[p].counterparts;
        let walked = !self.reference_search
            && !self.adj_index[p].is_empty()
            && live > SHORT_LIST
            && opposite.len() < counterparts * 64
            && {
                let index = &self.adj_index[p];
                let mut lookups = 0;
                let mut done = true;
                for &(Reverse(pr), o) in opposite {
                    if best.is_some_and(|b| pr < b.0) {
                        break;
                    }
                    lookups += 1;
                    if lookups > counterparts {
                        done = false;
                        break;
                    }
                    let Some(mut i) = index.lookup(o as usize / 2) else {
                        continue;
                    };
                    while let Some(&(other, q)) = list.get(i) {
                        if other != o {
                            break;
                        }
                        i += 1;
                        if q == DEAD {
                            continue;
                        }
                        // `o` is idle (it is in the idle set) and is q's only other port.
                        if !self.offer(q, pr, t, &mut best, &mut retry) {
                            // A later piece of the job may take fewer slots
                            // and be ready (one run of a strided job).
                            continue;
                        }
                        // The later pieces of q's job have q's ports and
                        // score, no more words and higher indices, so none
                        // is a better choice than q: skip past the job's
                        // last entry when it sits where the job's pieces,
                        // in order, put it (only started ones ever leave
                        // the list, and the list is sorted by piece).
                        let last = self.job_last[q as usize];
                        let end = i + (last - q) as usize;
                        if last != q && list.get(end - 1) == Some(&(o, last)) {
                            i = end;
                        }
                    }
                }
                done
            };
        // A walk that gave up may have offered some pieces already; the scan
        // offers them again among all the others, which choose the same.
        if walked {
        } else if self.reference_search {
            self.reference_choice(p, t, &mut best, &mut retry);
        } else if p & 1 == 1 {
            // A receive port: the pieces of its classes whose receivers are
            // all idle (itself included), whose send port is idle too.
            for &k in &self.port_classes[p] {
                if self.class_busy[k as usize] != 0 {
                    continue;
                }
                let receivers = self.class_priority(k, p);
                for (s, pending) in self.class_pieces[k as usize].pending(&self.start) {
                    if !pending.is_empty() && self.is_idle(s as usize) {
                        let score = receivers.max(self.priority(s as usize));
                        self.offer_group(pending, score, t, &mut best, &mut retry);
                    }
                }
            }
        } else {
            // A send port: its pieces whose class's receivers are all idle.
            for (k, pending) in self.send_pieces[p].pending(&self.start) {
                if !pending.is_empty() && self.class_busy[k as usize] == 0 {
                    let score = self.class_priority(k, p);
                    self.offer_group(pending, score, t, &mut best, &mut retry);
                }
            }
        }
        if let Some((_, _, Reverse(q))) = best {
            self.begin(q, t);
        } else if retry != u64::MAX {
            // Only a self-loop or strided piece waits for a later issue cycle; nothing
            // else would wake this port then.
            self.events.push(retry, p as u32);
        }
    }

    /// The plain rule that the class counters, the walk and the index
    /// implement: among the pending pieces of `p` whose other ports are all
    /// idle, the best by [`Key`].
    fn reference_choice(&self, p: usize, t: u64, best: &mut Option<Key>, retry: &mut u64) {
        let pieces: Vec<u32> = if p & 1 == 0 {
            self.send_pieces[p].pieces.clone()
        } else {
            self.port_classes[p]
                .iter()
                .flat_map(|&k| self.class_pieces[k as usize].pieces.iter().copied())
                .collect()
        };
        'pieces: for q in pieces {
            let qi = q as usize;
            if self.start[qi] != UNSCHEDULED {
                continue;
            }
            let mut score = 0;
            for i in 0..self.port_count(qi) {
                let x = self.port(qi, i);
                if x != p {
                    if !self.is_idle(x) {
                        continue 'pieces;
                    }
                    score = score.max(self.priority(x));
                }
            }
            self.offer(q, score, t, best, retry);
        }
    }

    /// Number of ports of piece `q` (its send port first, then its class).
    fn port_count(&self, q: usize) -> usize {
        1 + self.class_ports(self.piece_class[q]).len()
    }

    /// Port `i` of piece `q` (0: the send port).
    fn port(&self, q: usize, i: usize) -> usize {
        if i == 0 {
            self.piece_send[q] as usize
        } else {
            self.class_list[self.class_start[self.piece_class[q] as usize] as usize + i - 1]
                as usize
        }
    }

    fn begin(&mut self, q: u32, t: u64) {
        let qi = q as usize;
        self.start[qi] = t;
        let w = self.piece_words[qi] as u64;
        let n = self.port_count(qi);
        for i in 0..n {
            let x = self.port(qi, i);
            self.make_busy(x);
            self.free[x] = t + w;
            self.remaining[x] -= w;
            self.started[x / 2] += self.piece_slots[qi] as u64;
            let started = self.started[x / 2];
            for &k in &self.port_classes[x | 1] {
                let most = &mut self.class_started[k as usize];
                *most = (*most).max(started);
            }
            if self.remaining[x] > 0 {
                self.events.push(t + w, x as u32);
            }
            if self.all_unicast[x] {
                // The piece is unicast: one entry in `adj[x]`, at the
                // position `adj_pos` keeps for its side.
                let list = &mut self.adj[x];
                let pos = self.adj_pos[qi][x & 1] as usize;
                let entry = &mut list[pos];
                debug_assert_eq!(entry.1, q, "adj_pos of piece {q} on port {x}");
                entry.1 = DEAD;
                let other = entry.0;
                self.dead[x] += 1;
                if !self.adj_index[x].is_empty() {
                    // Lookups land on the counterpart's first live entry, not
                    // on the started pieces before it.
                    self.adj_index[x].passed(list, pos, other);
                }
                if 2 * self.dead[x] as usize > list.len() {
                    let index = &mut self.adj_index[x];
                    if !index.is_empty() {
                        index.forget(list);
                    }
                    list.retain(|e| e.1 != DEAD);
                    if !index.is_empty() {
                        index.record(list);
                    }
                    record_positions(list, x, &mut self.adj_pos);
                    self.dead[x] = 0;
                }
            }
        }
        let k = self.piece_class[qi] as usize;
        self.class_pieces[k].compact(&self.start, &self.piece_send);
        let s = self.piece_send[qi] as usize;
        self.send_pieces[s].compact(&self.start, &self.piece_class);
        // The other port of each tile involved may be idle; a descriptor more
        // on its tile delays the cycle from which it may start anything.
        for i in 0..n {
            let x = self.port(qi, i);
            let other = x ^ 1;
            let ready_at = self.ready_at(x / 2);
            if self.is_idle(other) && ready_at > t {
                self.make_busy(other);
                self.events.push(ready_at, other as u32);
            }
        }
    }
}

/// One construction with the given per-port priority bonus (`2 * tiles`
/// entries: send port of tile t at `2t`, receive port at `2t + 1`).
pub fn construct(
    jobs: &[Job],
    pieces: &[Piece],
    tiles: u32,
    issue_offset: u64,
    bonus: &[u64],
) -> Schedule {
    Construction::new(jobs, pieces, tiles, issue_offset, bonus)
        .run(&|| false)
        .expect("a construction that is never stopped finishes")
}

/// Events between two questions to the `stop` callback of a construction:
/// often enough that a stopped search ends within milliseconds, rarely
/// enough that asking costs nothing measurable.
const STOP_POLL: u32 = 1024;

/// Result of [`improve`]: the first and the best schedule.
#[derive(Clone, Debug)]
pub struct Search {
    /// The first construction (no bonus).
    pub initial: Schedule,
    /// The best schedule found.
    pub best: Schedule,
    /// Rounds whose schedule was strictly better than every earlier one.
    pub improvements: u32,
}

/// Rounds without improvement after which [`improve`] stops.
pub const PATIENCE: u32 = 4;

/// Construction followed by up to `rounds` squeaky-wheel rounds; stops early
/// when the horizon reaches `target` (a lower bound) or after [`PATIENCE`]
/// rounds without improvement. Abandoned (`None`) as soon as `stop` returns
/// true: the driver stops the search of a piece size whose result can no
/// longer be chosen. Whether it stops never changes what a finished search
/// returns.
pub fn improve(
    jobs: &[Job],
    pieces: &[Piece],
    tiles: u32,
    issue_offset: u64,
    rounds: u32,
    target: u64,
    stop: &dyn Fn() -> bool,
) -> Option<Search> {
    let mut bonus = vec![0u64; 2 * tiles as usize];
    let initial = Construction::new(jobs, pieces, tiles, issue_offset, &bonus).run(stop)?;
    let mut best = initial.clone();
    let mut last = initial.clone();
    let mut improvements = 0;
    let mut stale = 0;
    for _ in 0..rounds {
        // Squeaky-wheel rounds that keep failing rarely start succeeding:
        // after PATIENCE rounds without a better horizon the search stops
        // (on the seed-sized attention phase, every round past the first
        // few cost seconds and found nothing).
        if best.horizon <= target || stale >= PATIENCE {
            break;
        }
        // Lateness of each port: how far its last piece ends past the bound.
        let mut end = vec![0u64; 2 * tiles as usize];
        for pl in &last.placed {
            let e = pl.start + pl.piece.words as u64;
            let job = &jobs[pl.piece.job as usize];
            let s = send_port(job.source);
            end[s] = end[s].max(e);
            for d in &job.destinations {
                let r = recv_port(d.tile);
                end[r] = end[r].max(e);
            }
        }
        for (b, &e) in bonus.iter_mut().zip(&end) {
            *b += e.saturating_sub(target);
        }
        last = Construction::new(jobs, pieces, tiles, issue_offset, &bonus).run(stop)?;
        if last.horizon < best.horizon {
            best = last.clone();
            improvements += 1;
            stale = 0;
        } else {
            stale += 1;
        }
    }
    Some(Search {
        initial,
        best,
        improvements,
    })
}

#[cfg(test)]
mod tests {
    use super::{construct, Calendar, Construction};
    use crate::coalesce::{coalesce, split};
    use crate::phase::Phase;
    use crate::rng::SplitMix64;
    use crate::synth::{self, PhaseBuilder};
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    /// A phase shaped like attention's exchange: tiles in groups; some rows
    /// multicast to a whole group (K^T and V), some to pairs of tiles (Q),
    /// some unicast, a few sent to the sender's own group (self-loops).
    fn grouped(rng: &mut SplitMix64, tiles: u32, group: u32, rows: u32) -> Phase {
        let mut b = PhaseBuilder::new(tiles);
        for _ in 0..rows {
            let source = rng.below(tiles as u64) as u32;
            let words = 1 + rng.below(8) as u32;
            let dests: Vec<u32> = match rng.below(3) {
                0 => {
                    let g = rng.below((tiles / group) as u64) as u32;
                    (g * group..(g + 1) * group).collect()
                }
                1 => {
                    let a = rng.below(tiles as u64 / 2) as u32 * 2;
                    vec![a, a + 1]
                }
                _ => vec![rng.below(tiles as u64) as u32],
            };
            b.add(source, &dests, words);
        }
        b.finish()
    }

    /// The class counters, the unicast walk with its index, and the lazy
    /// list maintenance choose exactly what the plain rule chooses, with and
    /// without priority bonuses, on multicast, unicast and mixed phases, and
    /// on strided ones whose pieces of several runs wait for their prefix's
    /// issue cycle where a one-run piece of the same job does not.
    #[test]
    fn fast_search_equals_the_plain_rule() {
        let mut rng = SplitMix64(23);
        for case in 0..84 {
            let phase = match case % 7 {
                5 => synth::strided(&mut rng, 9, 40, 12, [2, 5, 17][(case % 3) as usize]),
                6 => synth::scatter(8, 200, 300),
                0 => grouped(&mut rng, 48, 8, 300),
                1 => synth::all_to_all(40, 24, 1, 6, case),
                2 => synth::random(&mut rng, 16, 200, 6, 5),
                3 => synth::broadcast(64, 40, 400, 6, case),
                // Unicast lists long enough to be walked among many idle
                // ports that are not their counterparts: walks that give up
                // and leave the choice to the scan.
                _ => synth::random(&mut rng, 400, 12_000, 6, 1),
            };
            phase.validate().expect("synthetic phases are valid");
            let jobs = coalesce(&phase);
            let pieces = split(
                &jobs,
                match case % 7 {
                    // Pieces of a few runs of a job, and its last of one.
                    5 | 6 => Some(2 + 3 * (case % 5) as u32),
                    _ if case % 3 == 0 => Some(3),
                    _ => None,
                },
            );
            let ports = 2 * phase.tiles as usize;
            let bonus: Vec<u64> = if case % 2 == 0 {
                vec![0; ports]
            } else {
                (0..ports).map(|_| rng.below(20)).collect()
            };
            let fast = construct(&jobs, &pieces, phase.tiles, 12, &bonus);
            let mut reference = Construction::new(&jobs, &pieces, phase.tiles, 12, &bonus);
            reference.reference_search = true;
            assert_eq!(fast, reference.run(&|| false).unwrap(), "case {case}");
        }
    }

    /// The calendar queue yields the same batches as a binary heap, including
    /// across window growth and long jumps in time.
    #[test]
    fn calendar_matches_a_heap() {
        let mut rng = crate::rng::SplitMix64(7);
        for round in 0..50 {
            let mut calendar = Calendar::new();
            let mut heap = BinaryHeap::new();
            let mut now = 0u64;
            for p in 0..20u32 {
                let t = rng.below(8);
                calendar.push(t, p);
                heap.push(Reverse((t, p)));
            }
            let mut batch = Vec::new();
            let mut steps = 0;
            while let Some(t) = calendar.pop(&mut batch) {
                assert!(t >= now, "round {round}: time went back");
                now = t;
                let mut expected = Vec::new();
                while let Some(&Reverse((t2, p))) = heap.peek() {
                    if t2 != t {
                        break;
                    }
                    expected.push(p);
                    heap.pop();
                }
                batch.sort_unstable();
                expected.sort_unstable();
                assert_eq!(batch, expected, "round {round}, cycle {t}");
                // Reschedule some ports, sometimes far ahead (window growth).
                for &p in &batch {
                    if steps < 400 && rng.below(3) != 0 {
                        let delta = match rng.below(10) {
                            0 => 1 + rng.below(5000),
                            _ => 1 + rng.below(40),
                        };
                        calendar.push(t + delta, p);
                        heap.push(Reverse((t + delta, p)));
                        steps += 1;
                    }
                }
                batch.clear();
            }
            assert!(heap.is_empty(), "round {round}: the calendar lost events");
        }
    }
}
