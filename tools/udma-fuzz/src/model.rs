// SPDX-License-Identifier: GPL-2.0
//! The reference model: what the driver must hold for each open file (buffers and their bytes,
//! queues with their ring accounting, fences and events, copies in flight) and the rules that
//! say which bytes are known after which call.
//!
//! Bytes live in *spaces*: every allocated buffer is its own space, and each memory region of
//! the process that imports use (`import.rs`) is one space that all the imports of that region
//! (of either file) view at their own offset. So two imports of the same pages, and an import
//! and the CPU's own writes to the region, alias as they do in the machine.
//!
//! Bytes are `Option<u8>`: `None` where the ABI does not fix the value (a copy lost to a queue
//! reset, writes racing each other without ordering). Every other byte must match exactly.

use crate::dev::Mapping;
use std::collections::{BTreeMap, VecDeque};

/// Buffer slots per file that the operations name.
pub const BUF_SLOTS: usize = 4;
/// Queue slots the operations name; slot `s` is always the same (engine, queue) pair.
pub const QUEUE_SLOTS: usize = 4;
/// Entries of `Sut::queues`: the slots, then the ghosts (`QueueM::gone`) of queue instances
/// that ended with io_uring commands in flight, three per slot (entry `i` is slot `i % 4`).
pub const QUEUE_ENTRIES: usize = 4 * QUEUE_SLOTS;
/// Open files the state machine drives (two: the second's copies must be unaffected by the
/// first's faults and errors).
pub const FILES: usize = 2;
/// Slots kept free on each ring (`ring_reserve_descs`).
pub const RESERVE: u32 = 16;
/// Fences a queue may have in flight (`max_queue_fences`).
pub const MAX_FENCES: u64 = 256;
/// Resets whose dropped fences a queue remembers: older fences may read `EXPIRED` after more.
pub const LOST_RANGES: u32 = 32;
/// Spaces from this one on are the process's memory regions (`REGION_SPACE + region`); below
/// it, a space is the handle of the allocated buffer it holds.
pub const REGION_SPACE: u64 = 1 << 62;

/// A place in the model's memory: (space, byte offset).
pub type Loc = (u64, usize);

/// What a buffer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Host memory (`MEM_ALLOC` host): mappable.
    Host,
    /// Device memory (`MEM_ALLOC` device).
    Device,
    /// The process's own memory (`MEM_IMPORT`).
    Import {
        /// The region it lies in (`Sut::regions`).
        region: usize,
        /// Imported with `NEURON_UDMA_IMPORT_WRITE`.
        writable: bool,
        /// Offsets in the buffer where a new physically contiguous run starts (0 excluded),
        /// from `/proc/self/pagemap`.
        runs: Vec<usize>,
    },
    /// A `DMABUF_IMPORT` of this driver's own `DMABUF_EXPORT` of a device buffer (of either
    /// file): it views that buffer's device memory (one run, reached by device addresses).
    OwnExport {
        /// The exported device buffer's handle (its space).
        dev: u64,
        /// Imported with `NEURON_UDMA_IMPORT_WRITE`.
        writable: bool,
    },
}

/// One buffer of a file.
#[derive(Debug)]
pub struct BufM {
    /// Handle from `MEM_ALLOC` / `MEM_IMPORT`.
    pub handle: u64,
    /// Size in bytes (rounded up to 4 KiB by `MEM_ALLOC`; any size for imports).
    pub size: usize,
    /// What it is.
    pub kind: Kind,
    /// `mmap_offset` from `MEM_ALLOC`.
    pub mmap_offset: u64,
    /// Our mapping, if mapped.
    pub map: Option<Mapping>,
    /// Where byte 0 is in the model's memory.
    pub at: Loc,
}

impl BufM {
    /// A host buffer (mappable).
    pub fn host(&self) -> bool {
        self.kind == Kind::Host
    }
    /// Whether the engine may write it.
    pub fn writable(&self) -> bool {
        !matches!(self.kind, Kind::Import { writable: false, .. } | Kind::OwnExport { writable: false, .. })
    }
    /// Whether its bytes are a space of its own (allocated memory, gone when it is freed),
    /// rather than a view of a region or of another buffer.
    pub fn own_space(&self) -> bool {
        matches!(self.kind, Kind::Host | Kind::Device)
    }
    /// Whether the engine reaches its bytes at device-memory addresses (reads of them without
    /// DMB may pass the queue's unordered writes).
    pub fn device_memory(&self) -> bool {
        matches!(self.kind, Kind::Device | Kind::OwnExport { .. })
    }
    /// Run boundaries of an import (none for driver buffers: contiguous).
    pub fn runs(&self) -> &[usize] {
        match &self.kind {
            Kind::Import { runs, .. } => runs,
            _ => &[],
        }
    }
    /// Where byte `off` of the buffer is.
    pub fn loc(&self, off: usize) -> Loc {
        (self.at.0, self.at.1 + off)
    }
}

/// The pairs a copy of `len` bytes from offset `so` of a buffer with runs `sr` to offset `do_`
/// of one with runs `dr` takes: one per piece that lies within one run of each side.
pub fn pieces(sr: &[usize], so: usize, dr: &[usize], do_: usize, len: usize) -> u32 {
    let mut cuts: Vec<usize> = sr
        .iter()
        .filter(|&&b| b > so && b < so + len)
        .map(|&b| b - so)
        .chain(dr.iter().filter(|&&b| b > do_ && b < do_ + len).map(|&b| b - do_))
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    1 + cuts.len() as u32
}

/// The bytes of every space.
#[derive(Debug, Default)]
pub struct Mem {
    spaces: BTreeMap<u64, Vec<Option<u8>>>,
}

impl Mem {
    /// A new space of `len` bytes, all `init`.
    pub fn add(&mut self, space: u64, len: usize, init: Option<u8>) {
        self.spaces.insert(space, vec![init; len]);
    }
    /// A space with these bytes.
    pub fn insert(&mut self, space: u64, bytes: Vec<Option<u8>>) {
        self.spaces.insert(space, bytes);
    }
    /// Takes a space's bytes out.
    pub fn take(&mut self, space: u64) -> Vec<Option<u8>> {
        self.spaces.remove(&space).unwrap_or_default()
    }
    /// Forgets a space (a freed buffer).
    pub fn remove(&mut self, space: u64) {
        self.spaces.remove(&space);
    }
    /// `len` bytes at `at` (unknown where the space is gone).
    pub fn get(&self, at: Loc, len: usize) -> Vec<Option<u8>> {
        match self.spaces.get(&at.0) {
            Some(v) => v[at.1..at.1 + len].to_vec(),
            None => vec![None; len],
        }
    }
    /// Sets the bytes at `at` (nothing where the space is gone).
    pub fn set(&mut self, at: Loc, data: &[Option<u8>]) {
        if let Some(v) = self.spaces.get_mut(&at.0) {
            v[at.1..at.1 + data.len()].copy_from_slice(data);
        }
    }
    /// Makes `len` bytes at `at` unknown.
    pub fn forget(&mut self, at: Loc, len: usize) {
        if let Some(v) = self.spaces.get_mut(&at.0) {
            v[at.1..at.1 + len].fill(None);
        }
    }
}

/// A copy prepared on a queue whose completion has not been observed yet.
#[derive(Clone, Debug)]
pub struct PendingCopy {
    /// Source and destination handles (what `MEM_FREE` sees as busy).
    pub handles: (u64, u64),
    /// Where the source bytes are.
    pub src: Loc,
    /// Where the destination bytes are.
    pub dst: Loc,
    /// Length in bytes.
    pub len: usize,
    /// The fence that covers it (the first marker after it), 0 while none does.
    pub fence: u64,
    /// Raced by another write or copy without ordering, or on a queue that may have been
    /// reset: its destination is unknown once it lands.
    pub fuzzy: bool,
    /// Reads device memory without DMB: it does not see what earlier copies of its queue
    /// that no fence covers yet wrote there (udma-sim `--unordered-device-reads`).
    pub unordered_read: bool,
    /// The io_uring command (`uring.rs`, its user_data) that prepared it; 0: an ioctl.
    pub tag: u64,
}

impl PendingCopy {
    fn dst_overlaps(&self, at: Loc, len: usize) -> bool {
        overlaps(self.dst, self.len, at, len)
    }
    fn src_overlaps(&self, at: Loc, len: usize) -> bool {
        overlaps(self.src, self.len, at, len)
    }
}

/// Whether two byte ranges overlap.
pub fn overlaps(a: Loc, la: usize, b: Loc, lb: usize) -> bool {
    a.0 == b.0 && a.1 < b.1 + lb && b.1 < a.1 + la
}

/// States a fence may be in (`FENCE_STATUS`), as a bit set.
pub mod fs {
    /// In flight.
    pub const PENDING: u8 = 1;
    /// Done.
    pub const DONE: u8 = 2;
    /// Failed with `EIO` (an engine error).
    pub const FAIL_EIO: u8 = 4;
    /// Failed with `ETIMEDOUT` (no progress for 10 s).
    pub const FAIL_TMO: u8 = 8;
    /// Either failure.
    pub const FAIL: u8 = FAIL_EIO | FAIL_TMO;
    /// Expired (after more than 32 resets).
    pub const EXPIRED: u8 = 16;
    /// A fence of an earlier instance of the queue id (issue 33, S2: `ECANCELED`).
    pub const CANCELED: u8 = 32;
}

/// How a queue instance with io_uring commands in flight ended (its ghost, `QueueM::gone`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gone {
    /// `QUEUE_RELEASE` (S4: its commands complete with `ECANCELED`, or 0 if their copies
    /// completed before).
    Released,
    /// Its file was closed: io_uring holds the file, the instance lives on until the commands
    /// complete (S5: 0 or `EIO`); the queue id stays taken until then.
    Closed,
    /// The device was unbound (S4: `ECANCELED`).
    Unbound,
}

/// A registered eventfd of a queue.
#[derive(Debug)]
pub struct EventFdM {
    /// The eventfd.
    pub fd: std::os::fd::OwnedFd,
    /// Fences settled when it was registered: at least / at most.
    pub base: (u64, u64),
    /// What it has been read to have counted so far.
    pub read: u64,
}

/// One queue taken by a file.
#[derive(Debug)]
pub struct QueueM {
    /// The file that owns it.
    pub owner: usize,
    /// Order of `QUEUE_INIT`s (a file's queues report their events in this order).
    pub serial: u64,
    /// Tx and Rx ring sizes, descriptors.
    pub tx: u32,
    /// See `tx`.
    pub rx: u32,
    /// Prepared, not yet started Tx and Rx descriptors; `None` when a reset the model did not
    /// see may have dropped them.
    pub prep: Option<(u32, u32)>,
    /// Pairs prepared since the newest marker (no fence covers them yet); an upper bound when
    /// `maybe_reset`.
    pub unf: u32,
    /// Fences not known to be retired: (fence, pairs up to its marker, marker included).
    pub groups: VecDeque<(u64, u32)>,
    /// Copies in flight, in ring order.
    pub pending: Vec<PendingCopy>,
    /// The newest fence of the queue: at least / at most (equal unless `maybe_reset`).
    pub newest: (u64, u64),
    /// What each fence (1..) may read now (`fs`).
    pub fences: Vec<u8>,
    /// Newest fence that `QUEUE_EVENTS` reported done / failed (the driver's `reported`).
    pub reported: (u64, u64),
    /// Newest fence the model saw fail (from its own waits): an event the driver must report.
    pub known_failed: u64,
    /// The registered eventfd.
    pub eventfd: Option<EventFdM>,
    /// A fault was injected on its engine: its waits may fail (EIO/ETIMEDOUT) until a wait
    /// with work completes after the faults were cleared.
    pub tainted: bool,
    /// Pairs were prepared on it after the newest fault on its engine, with no fault armed: a
    /// wait that then returns 0 proves the engine ran them, so it is not aborted. Without such pairs a 0
    /// proves nothing: an engine aborted while the queue was idle stays aborted, and the
    /// next copy on any of its queues fails (kselftest `fence_test` `abort_idle_engine`).
    pub since_fault: bool,
    /// A reset the model did not observe may have happened (a fault, with a listener whose
    /// completion engine checks the engine): the ring may be emptier and fences failed.
    pub maybe_reset: bool,
    /// Resets that may have happened (observed or not).
    pub resets: u32,
    /// The instance's first fence (issue 33, S1: numbering continues across the instances of
    /// a queue id of a file); the fences before it are `fs::CANCELED`.
    pub first: u64,
    /// A ghost: the instance ended with io_uring commands in flight (`uring.rs`).
    pub gone: Option<Gone>,
    /// A `Closed` ghost: which close (the closed file holds all its queues until its last
    /// io_uring command completed).
    pub ghost_of: u64,
    /// A ghost: the file that owned the instance while that file is open (its commands hold
    /// it), else `usize::MAX`.
    pub former: usize,
}

impl QueueM {
    /// A queue just taken.
    pub fn new(owner: usize, serial: u64, tx: u32, rx: u32, tainted: bool) -> Self {
        Self {
            owner,
            serial,
            tx,
            rx,
            prep: Some((0, 0)),
            unf: 0,
            groups: VecDeque::new(),
            pending: vec![],
            newest: (0, 0),
            fences: vec![],
            reported: (0, 0),
            known_failed: 0,
            eventfd: None,
            tainted,
            since_fault: false,
            maybe_reset: false,
            resets: 0,
            first: 1,
            gone: None,
            ghost_of: 0,
            former: usize::MAX,
        }
    }
    /// The instance follows one whose newest fence was `base` (S1): its first fence is
    /// `base + 1`, the earlier ones read `CANCELED`.
    pub fn continue_after(mut self, base: u64) -> Self {
        self.first = base + 1;
        self.newest = (base, base);
        self.fences = vec![fs::CANCELED; base as usize];
        self
    }
    /// A fence number as the driver shows it (`COPY_SUBMIT`'s fence, `FENCE_STATUS`'
    /// `submitted`): 0 before the instance's first fence (S1).
    pub fn shown(&self, n: u64) -> u64 {
        if n >= self.first {
            n
        } else {
            0
        }
    }
    /// Pairs the driver keeps available on a fresh queue (`min(tx, rx) - 16`).
    pub fn cap(&self) -> u32 {
        self.tx.min(self.rx) - RESERVE
    }
    /// Upper bound of the pairs handed out and not yet freed (markers included).
    pub fn hi(&self) -> u32 {
        self.unf + self.groups.iter().map(|g| g.1).sum::<u32>()
    }
    /// Lower bound of the same (what no completion can have freed).
    pub fn lo(&self) -> u32 {
        if self.maybe_reset {
            0
        } else {
            self.unf
        }
    }
    /// The states fence `seq` (1..=newest) may read.
    pub fn may(&self, seq: u64) -> u8 {
        if seq < self.first {
            return fs::CANCELED;
        }
        let mut s = self.fences.get(seq as usize - 1).copied().unwrap_or(fs::PENDING | fs::DONE | fs::FAIL);
        if (self.tainted || self.maybe_reset) && s & fs::PENDING != 0 {
            s |= fs::FAIL;
        }
        // The driver expires a fence once the lost range holding it (or a newer one) is the
        // oldest of more than LOST_RANGES: each later range holds a newer fence, so an expired
        // fence has at least LOST_RANGES newer ones (the newest never expires).
        if self.resets > LOST_RANGES && self.newest.1 >= seq + u64::from(LOST_RANGES) {
            s |= fs::EXPIRED;
        }
        s
    }
    /// A wait for the settled fence `seq` answered `EIO`: the driver answers a settled fence's
    /// wait from its state alone (`rust/channel.rs`, `wait_for`), so the fence failed; it
    /// stays failed (or expires), and `QUEUE_EVENTS` owes a failure at least this new.
    pub fn failed_seen(&mut self, seq: u64) {
        let s = self.may(seq) & fs::FAIL;
        self.set_may(seq, if s == 0 { fs::FAIL } else { s });
        self.known_failed = self.known_failed.max(seq);
    }
    /// Sets what fence `seq` may read.
    pub fn set_may(&mut self, seq: u64, s: u8) {
        let i = seq as usize - 1;
        if self.fences.len() <= i {
            self.fences.resize(i + 1, fs::PENDING | fs::DONE | fs::FAIL);
        }
        self.fences[i] = s;
    }
    /// The newest fence known done (everything before it is settled).
    pub fn done_floor(&self) -> u64 {
        (1..=self.fences.len() as u64).rev().find(|&k| self.fences[k as usize - 1] == fs::DONE).unwrap_or(0)
    }
    /// The newest fence that may be done.
    pub fn done_ceiling(&self) -> u64 {
        (1..=self.newest.1).rev().find(|&k| self.may(k) & fs::DONE != 0).unwrap_or(0)
    }
    /// Whether a fence newer than `after` may have failed.
    pub fn may_have_failed_after(&self, after: u64) -> bool {
        (after + 1..=self.newest.1).any(|k| self.may(k) & fs::FAIL != 0)
    }
    /// Every fence up to this one is settled.
    pub fn settled_floor(&self) -> u64 {
        (1..=self.newest.0).take_while(|&k| self.may(k) & fs::PENDING == 0).last().unwrap_or(0)
    }
    /// A marker was appended after the pairs prepared so far (`COPY_SUBMIT`, `COPY_WAIT`), if
    /// there were any: they are started, and the new fence covers them.
    pub fn fence_now(&mut self) {
        if self.unf == 0 && !self.maybe_reset {
            return;
        }
        let exact = !self.maybe_reset;
        let seq = self.newest.1 + 1;
        let new =
            if self.tainted || self.maybe_reset { fs::PENDING | fs::DONE | fs::FAIL } else { fs::PENDING | fs::DONE };
        if exact {
            self.newest = (seq, seq);
        } else {
            // Without the pairs a reset may have dropped, nothing was appended.
            self.newest.1 = seq;
        }
        self.set_may(seq, new);
        self.groups.push_back((seq, self.unf + 1));
        self.unf = 0;
        self.prep = if exact { Some((0, 0)) } else { None };
        for p in self.pending.iter_mut().filter(|p| p.fence == 0) {
            p.fence = seq;
        }
    }
    /// A fault was injected on the queue's engine: its fences in flight may fail, its copies'
    /// bytes are unknown.
    pub fn taint(&mut self) {
        if !self.tainted {
            self.tainted = true;
            for k in 1..=self.newest.1 {
                let s = self.may(k);
                self.set_may(k, s);
            }
        }
        for p in self.pending.iter_mut() {
            p.fuzzy = true;
        }
    }
    /// Learns the newest fence (`COPY_SUBMIT`'s or `FENCE_STATUS`'s answer).
    pub fn learn_newest(&mut self, n: u64) {
        let n = n.max(self.first - 1);
        self.newest = (n, n);
        self.fences.truncate(n as usize);
    }
    /// Fence `seq` is known done: it and everything before it was retired (ring space freed);
    /// returns the copies that landed, in ring order.
    pub fn done(&mut self, seq: u64) -> Vec<PendingCopy> {
        if seq == 0 {
            return vec![];
        }
        for k in 1..seq {
            let s = self.may(k);
            if s & fs::PENDING != 0 {
                let left = s & !fs::PENDING & !fs::EXPIRED;
                self.set_may(k, if left == 0 { fs::DONE } else { left });
            }
        }
        self.set_may(seq, fs::DONE);
        self.newest.0 = self.newest.0.max(seq);
        while self.groups.front().is_some_and(|g| g.0 <= seq) {
            self.groups.pop_front();
        }
        let n = self.pending.iter().take_while(|p| p.fence != 0 && p.fence <= seq).count();
        self.pending.drain(..n).collect()
    }
    /// The queue was reset (seen: the wait for fence `failed` failed with `EIO`): every fence
    /// in flight failed (those before `failed` may have completed first), the rings are empty.
    /// Returns the copies that may or may not have run.
    pub fn reset(&mut self, failed: u64) -> Vec<PendingCopy> {
        self.resets += 1;
        for k in 1..=self.newest.1 {
            let s = self.may(k);
            if s & fs::PENDING != 0 {
                self.set_may(k, if k < failed { (s & !fs::PENDING) | fs::FAIL } else { fs::FAIL });
            }
        }
        self.known_failed = self.known_failed.max(failed);
        self.groups.clear();
        self.unf = 0;
        self.prep = Some((0, 0));
        std::mem::take(&mut self.pending)
    }
    /// A reset may have happened that the model did not see (a fault): every bound becomes
    /// loose until a wait resynchronises.
    pub fn maybe_reset_now(&mut self) {
        if !self.maybe_reset {
            self.maybe_reset = true;
            self.prep = None;
        }
        self.resets += 1;
        for p in self.pending.iter_mut() {
            p.fuzzy = true;
        }
    }
    /// Everything prepared completed (a `COPY_WAIT` returned 0): returns the copies, which
    /// landed in ring order. Without an unseen reset, the newest fence (the one the wait
    /// appended or joined) is done if it was in flight; after one, every fence is settled.
    pub fn all_done(&mut self) -> Vec<PendingCopy> {
        let newest = self.newest.1;
        let mut v = vec![];
        if !self.maybe_reset && self.newest.0 == newest {
            if newest > 0 && self.may(newest) & fs::PENDING != 0 {
                v = self.done(newest);
            }
        } else {
            for k in 1..=newest {
                let s = self.may(k);
                if s & fs::PENDING != 0 {
                    self.set_may(k, (s & !fs::PENDING & !fs::EXPIRED) | fs::DONE);
                }
            }
        }
        v.extend(std::mem::take(&mut self.pending));
        self.groups.clear();
        self.unf = 0;
        self.prep = Some((0, 0));
        v
    }
}

/// What the model knows of the engines the fuzzer uses, across test cases.
#[derive(Clone, Copy, Debug, Default)]
pub struct EngineM {
    /// A fault may still fire on it.
    pub armed: bool,
    /// It may be in abort state (a fault fired and no wait with work recovered it yet).
    pub maybe_aborted: bool,
}

/// The model of one open file.
#[derive(Debug, Default)]
pub struct FileM {
    /// Buffers by slot.
    pub bufs: [Option<BufM>; BUF_SLOTS],
    /// Buffers allocated into an occupied slot (still the file's, no longer named by a slot).
    pub extra: Vec<BufM>,
    /// The file was polled: its queues' fences are watched by the completion engine.
    pub polled: bool,
    /// Per queue slot, the newest fence of the file's last instance of that queue id (S1).
    pub last_fence: [u64; QUEUE_SLOTS],
}

impl FileM {
    /// The buffer with `handle`, wherever it is.
    pub fn by_handle(&self, handle: u64) -> Option<&BufM> {
        self.bufs.iter().flatten().chain(self.extra.iter()).find(|b| b.handle == handle)
    }
    /// Every buffer.
    pub fn all(&self) -> impl Iterator<Item = &BufM> {
        self.bufs.iter().flatten().chain(self.extra.iter())
    }
}

/// Marks every pending copy that reads or writes `[at, at + len)` as fuzzy: a write there
/// races it.
pub fn touch_write(queues: &mut [Option<QueueM>], at: Loc, len: usize) {
    for q in queues.iter_mut().flatten() {
        for p in q.pending.iter_mut() {
            if p.dst_overlaps(at, len) || p.src_overlaps(at, len) {
                p.fuzzy = true;
            }
        }
    }
}

/// Whether a pending copy may write `[at, at + len)` at any time (a read there races it).
pub fn racy_read(queues: &[Option<QueueM>], at: Loc, len: usize) -> bool {
    queues.iter().flatten().any(|q| q.pending.iter().any(|p| p.dst_overlaps(at, len)))
}

/// Records a new copy of queue `qi`: copies it races (unordered writes to the same bytes,
/// or a read of bytes another queue writes) become fuzzy, and so does the new one.
pub fn add_pending(queues: &mut [Option<QueueM>], qi: usize, mut c: PendingCopy) {
    if overlaps(c.src, c.len, c.dst, c.len) {
        c.fuzzy = true;
    }
    for (j, q) in queues.iter_mut().enumerate() {
        let Some(q) = q.as_mut() else { continue };
        for p in q.pending.iter_mut() {
            // Same queue: reads are in ring order (read-after-write is ordered), except a read
            // of device memory without DMB after a write no fence covers yet (its DMB marker
            // orders everything before it); two writes of the same bytes without a barrier are
            // not ordered. Other queues: no order at all.
            let waw = p.dst_overlaps(c.dst, c.len);
            let cross = j != qi && (p.src_overlaps(c.dst, c.len) || p.dst_overlaps(c.src, c.len));
            if waw || cross {
                p.fuzzy = true;
                c.fuzzy = true;
            }
            if j == qi && c.unordered_read && p.fence == 0 && p.dst_overlaps(c.src, c.len) {
                c.fuzzy = true;
            }
        }
    }
    queues[qi].as_mut().expect("queue").pending.push(c);
}

/// Applies a completed copy to the bytes.
pub fn land(mem: &mut Mem, queues: &mut [Option<QueueM>], c: &PendingCopy) {
    let src = if c.fuzzy { vec![None; c.len] } else { mem.get(c.src, c.len) };
    mem.set(c.dst, &src);
    touch_write(queues, c.dst, c.len);
}

/// A `MEMSET` of `len` bytes at `at` to `value` returned 0: the bytes are the value, and the
/// copies in flight that read or write them race it.
pub fn fill(mem: &mut Mem, queues: &mut [Option<QueueM>], at: Loc, len: usize, value: u8) {
    mem.set(at, &vec![Some(value); len]);
    touch_write(queues, at, len);
}

/// Forgets copies that may or may not have happened (queue reset or release): their
/// destinations become unknown.
pub fn drop_pending(mem: &mut Mem, pending: Vec<PendingCopy>) {
    for c in pending {
        mem.forget(c.dst, c.len);
    }
}

/// A byte pattern that differs between writes: byte `i` of write `seed`.
pub fn pattern(seed: u32, i: usize) -> u8 {
    let x = seed.wrapping_mul(0x9E37_79B9) ^ (i as u32).wrapping_mul(0x85EB_CA6B);
    (x ^ (x >> 13) ^ (x >> 24)) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q() -> Option<QueueM> {
        Some(QueueM::new(0, 0, 32, 64, false))
    }
    fn copy(src: Loc, dst: Loc, len: usize) -> PendingCopy {
        PendingCopy { handles: (src.0, dst.0), src, dst, len, fence: 0, fuzzy: false, unordered_read: false, tag: 0 }
    }

    #[test]
    fn cap_keeps_the_reserve_of_the_smaller_ring() {
        assert_eq!(q().unwrap().cap(), 16);
    }

    #[test]
    fn same_queue_read_after_write_is_ordered_but_write_after_write_is_not() {
        let mut qs = vec![q(), q()];
        add_pending(&mut qs, 0, copy((1, 0), (2, 0), 100));
        add_pending(&mut qs, 0, copy((2, 0), (3, 0), 100));
        assert!(qs[0].as_ref().unwrap().pending.iter().all(|p| !p.fuzzy));
        add_pending(&mut qs, 0, copy((1, 0), (3, 50), 100));
        let p = &qs[0].as_ref().unwrap().pending;
        assert!(!p[0].fuzzy && p[1].fuzzy && p[2].fuzzy);
    }

    #[test]
    fn unordered_device_read_after_an_unfenced_write_is_fuzzy() {
        let mut qs = vec![q(), q()];
        add_pending(&mut qs, 0, copy((1, 0), (2, 0), 100));
        // A device read without DMB of bytes the first copy writes: unknown.
        add_pending(&mut qs, 0, PendingCopy { unordered_read: true, ..copy((2, 10), (3, 0), 10) });
        // Once a fence covers the write, the next submission sees it.
        qs[0].as_mut().unwrap().pending[0].fence = 1;
        add_pending(&mut qs, 0, PendingCopy { unordered_read: true, ..copy((2, 10), (4, 0), 10) });
        let p = &qs[0].as_ref().unwrap().pending;
        assert!(!p[0].fuzzy && p[1].fuzzy && !p[2].fuzzy);
    }

    #[test]
    fn other_queue_reading_a_pending_destination_is_fuzzy() {
        let mut qs = vec![q(), q()];
        add_pending(&mut qs, 0, copy((1, 0), (2, 0), 100));
        add_pending(&mut qs, 1, copy((2, 10), (4, 0), 10));
        assert!(qs[0].as_ref().unwrap().pending[0].fuzzy && qs[1].as_ref().unwrap().pending[0].fuzzy);
    }

    #[test]
    fn landing_copies_known_bytes_and_fuzzy_ones_become_unknown() {
        let mut m = Mem::default();
        m.add(1, 8, Some(7));
        m.add(2, 8, Some(0));
        let mut qs = vec![q()];
        land(&mut m, &mut qs, &copy((1, 0), (2, 2), 4));
        assert_eq!(m.get((2, 0), 8), [0, 0, 7, 7, 7, 7, 0, 0].map(Some));
        let mut c = copy((1, 0), (2, 0), 2);
        c.fuzzy = true;
        land(&mut m, &mut qs, &c);
        assert_eq!(m.get((2, 0), 3), [None, None, Some(7)]);
        drop_pending(&mut m, vec![copy((1, 0), (2, 6), 2)]);
        assert_eq!(m.get((2, 6), 2), [None, None]);
    }

    #[test]
    fn a_fill_sets_its_bytes_and_races_the_copies_that_touch_them() {
        let mut m = Mem::default();
        m.add(1, 16, Some(7));
        m.add(2, 16, Some(0));
        let mut qs = vec![q()];
        add_pending(&mut qs, 0, copy((1, 0), (2, 0), 4));
        add_pending(&mut qs, 0, copy((1, 8), (2, 8), 4));
        fill(&mut m, &mut qs, (1, 2), 4, 0xAB);
        assert_eq!(m.get((1, 0), 8), [7, 7, 0xAB, 0xAB, 0xAB, 0xAB, 7, 7].map(Some));
        let p = &qs[0].as_ref().unwrap().pending;
        assert!(p[0].fuzzy && !p[1].fuzzy, "only the copy reading the filled bytes races it");
        // A fill of bytes a copy in flight writes: that copy's bytes become unknown when it lands.
        fill(&mut m, &mut qs, (2, 10), 1, 1);
        assert!(qs[0].as_ref().unwrap().pending[1].fuzzy);
        let landed: Vec<PendingCopy> = qs[0].as_mut().unwrap().pending.drain(..).collect();
        for c in &landed {
            land(&mut m, &mut qs, c);
        }
        assert_eq!(m.get((2, 8), 4), [None; 4]);
        // A fill of a space that is gone changes nothing.
        fill(&mut m, &mut qs, (9, 0), 4, 3);
        assert_eq!(m.get((9, 0), 1), [None]);
    }

    #[test]
    fn dmabuf_views_of_device_memory_are_writable_only_with_import_write() {
        let b = |kind| BufM { handle: 5, size: 4096, kind, mmap_offset: 0, map: None, at: (3, 0) };
        let own = b(Kind::OwnExport { dev: 3, writable: false });
        assert!(!own.writable() && !own.own_space() && own.device_memory() && own.runs().is_empty());
        let own = b(Kind::OwnExport { dev: 3, writable: true });
        assert!(own.writable() && !own.host());
        let dev = b(Kind::Device);
        assert!(dev.writable() && dev.own_space() && dev.device_memory());
        let imp = b(Kind::Import { region: 5, writable: false, runs: vec![4096] });
        assert!(!imp.writable() && !imp.own_space() && !imp.device_memory());
    }

    #[test]
    fn touch_write_marks_readers_and_writers() {
        let mut qs = vec![q()];
        add_pending(&mut qs, 0, copy((1, 0), (2, 0), 10));
        touch_write(&mut qs, (5, 0), 10);
        assert!(!qs[0].as_ref().unwrap().pending[0].fuzzy, "another space");
        touch_write(&mut qs, (1, 9), 1);
        assert!(qs[0].as_ref().unwrap().pending[0].fuzzy);
        assert!(racy_read(&qs, (2, 5), 1) && !racy_read(&qs, (2, 10), 5));
    }

    #[test]
    fn pieces_split_at_the_runs_of_both_sides() {
        assert_eq!(pieces(&[], 0, &[], 0, 65536), 1);
        // Source runs start at 4096 and 8192; the copy reads 100..9000.
        assert_eq!(pieces(&[4096, 8192], 100, &[], 0, 8900), 3);
        // A boundary at the copy's first byte or past its end does not split it.
        assert_eq!(pieces(&[4096], 4096, &[], 0, 10), 1);
        // Both sides cut at the same copy offset: one cut.
        assert_eq!(pieces(&[4096], 96, &[4000], 0, 5000), 2);
        assert_eq!(pieces(&[4096], 96, &[3000], 0, 5000), 3);
    }

    #[test]
    fn fences_settle_in_order_and_resets_fail_the_ones_in_flight() {
        let mut m = QueueM::new(0, 0, 64, 64, false);
        m.unf = 3;
        m.pending.push(copy((1, 0), (2, 0), 1));
        m.fence_now();
        assert_eq!((m.newest, m.hi(), m.lo(), m.prep), ((1, 1), 4, 0, Some((0, 0))));
        m.unf = 2;
        m.fence_now();
        assert_eq!(m.may(1), fs::PENDING | fs::DONE);
        let landed = m.done(2);
        assert_eq!(landed.len(), 1);
        assert_eq!((m.may(1), m.may(2), m.hi()), (fs::DONE, fs::DONE, 0));
        m.unf = 1;
        m.fence_now();
        m.reset(3);
        assert_eq!((m.may(3), m.done_floor(), m.done_ceiling()), (fs::FAIL, 2, 2));
        assert!(m.may_have_failed_after(2) && !m.may_have_failed_after(3));
    }

    #[test]
    fn only_fences_with_enough_newer_ones_may_expire() {
        let mut m = QueueM::new(0, 0, 64, 64, false);
        m.resets = LOST_RANGES + 1;
        m.newest = (40, 40);
        assert_eq!(m.may(8) & fs::EXPIRED, fs::EXPIRED);
        assert_eq!(m.may(9) & fs::EXPIRED, 0);
        assert_eq!(m.may(40) & fs::EXPIRED, 0, "the newest fence never expires");
        m.resets = LOST_RANGES;
        assert_eq!(m.may(1) & fs::EXPIRED, 0);
    }

    #[test]
    fn a_new_instance_of_an_id_continues_its_fence_numbers() {
        let mut m = QueueM::new(0, 0, 64, 64, false).continue_after(5);
        assert_eq!((m.first, m.newest, m.shown(5)), (6, (5, 5), 0), "no fence of its own yet: shown as 0");
        assert_eq!((m.may(1), m.may(5)), (fs::CANCELED, fs::CANCELED));
        assert_eq!((m.done_floor(), m.done_ceiling(), m.settled_floor()), (0, 0, 5));
        m.unf = 2;
        m.fence_now();
        assert_eq!((m.newest, m.shown(6)), ((6, 6), 6));
        assert_eq!(m.may(6), fs::PENDING | fs::DONE);
        m.done(6);
        assert_eq!((m.done_floor(), m.may(5)), (6, fs::CANCELED));
        // Learning "no fence" from the driver keeps the earlier instances' numbers.
        let mut fresh = QueueM::new(0, 0, 64, 64, false).continue_after(3);
        fresh.learn_newest(0);
        assert_eq!(fresh.newest, (3, 3));
    }

    #[test]
    fn an_eio_for_a_settled_fence_makes_it_failed_and_owed_to_queue_events() {
        let mut m = QueueM::new(0, 0, 64, 64, false);
        m.newest = (3, 3);
        m.set_may(2, fs::DONE | fs::FAIL_EIO);
        m.failed_seen(2);
        assert_eq!((m.may(2), m.known_failed), (fs::FAIL_EIO, 2));
        m.set_may(3, fs::DONE);
        m.failed_seen(3);
        assert_eq!((m.may(3), m.known_failed), (fs::FAIL, 3));
    }
}
