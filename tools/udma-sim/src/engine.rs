//! One UDMA engine: register file, queue state, error/abort state machine and
//! the descriptor processor that runs on the engine's worker thread
//! (hardware.rst §3, §4, §8).

use crate::fault::Counters;
use crate::layout::{Gen, Target};
use crate::mem::{self, GuestMemory};
use crate::regs::{self, desc, m2s_cause, s2m_cause};
use crate::trace::TraceRec;
use crate::Options;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Longest packet, in bytes, whose writes are never held by unordered completion: one
/// 64-byte write burst (a 4-byte completion marker is one) overtakes longer writes still in
/// flight.
pub const POSTED_WRITE_MAX: u64 = 64;
/// Rx descriptors the S2M prefetcher reads (and ring-id checks) past the current packet, up
/// to the tail (hardware.rst §3.5 S2M cause 11, §8.5).
pub const RX_PREFETCH: u32 = 64;
/// Bytes of held writes per queue above which the oldest land early (bounds model memory and
/// keeps the staging buffers cache-sized; the newest packet stays held, so a barrier-free
/// marker still overtakes it).
const HELD_BYTES_MAX: usize = 4 << 20;
/// Bytes of landed buffers a queue keeps for reuse.
const HELD_POOL_MAX: usize = 8 << 20;

/// Retry interval of a queue stalled on a masked ring-id mismatch (V3 SENG).
const RINGID_RETRY: Duration = Duration::from_millis(1);
/// Minimum per-packet base time used by the slow-down fault.
const SLOW_BASE: Duration = Duration::from_micros(20);

/// Queue direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// M2S (Tx, source side).
    Tx,
    /// S2M (Rx, destination side).
    Rx,
}

impl Dir {
    /// Short name used in control replies: `tx` or `rx`.
    pub fn name(self) -> &'static str {
        match self {
            Dir::Tx => "tx",
            Dir::Rx => "rx",
        }
    }
}

/// Error classes detected by the model; see `Documentation/udma-sim.rst`
/// ("Strictness") for the cause bit of each (hardware.rst §3.5, §8.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ErrorKind {
    /// Descriptor fetch from an unmapped/unsupported address.
    DescFetch = 1,
    /// Ring-id (phase) mismatch on a slot the tail says is valid.
    RingId = 2,
    /// Doorbell on a queue whose cfg bits 16/17 are not both set.
    QueueDisabled = 3,
    /// Ring base not 256-byte aligned, or length not a power of two in 32..=2^23.
    BadRing = 4,
    /// First descriptor of a packet lacks FIRST.
    BadFirst = 5,
    /// FIRST inside an unterminated packet (the previous packet had no LAST).
    BadLast = 6,
    /// More descriptors in one packet than desc_pref_cfg_2 allows.
    TooManyDescs = 7,
    /// Rx descriptors do not end exactly where the Tx packet ends.
    LenMismatch = 8,
    /// Source data read from an unmapped/unsupported address.
    DataRead = 9,
    /// Destination data write to an unmapped/unsupported address.
    DataWrite = 10,
    /// meta_ctrl other than plain copy, or META/CONCAT descriptor bits.
    Unsupported = 11,
    /// Doorbell increment >= ring length or making the tail catch up with the head.
    Overrun = 12,
    /// Packet longer than cfg_len [19:0].
    PktTooLong = 13,
    /// Injected bad address (fail_nth).
    InjectedFail = 14,
    /// Injected engine abort, or change_state ABORT written by the driver.
    Abort = 15,
    /// DMA attempted while PCI bus mastering is disabled.
    BusMasterOff = 16,
}

impl ErrorKind {
    /// Every kind, in code order.
    pub const ALL: [ErrorKind; 16] = [
        ErrorKind::DescFetch,
        ErrorKind::RingId,
        ErrorKind::QueueDisabled,
        ErrorKind::BadRing,
        ErrorKind::BadFirst,
        ErrorKind::BadLast,
        ErrorKind::TooManyDescs,
        ErrorKind::LenMismatch,
        ErrorKind::DataRead,
        ErrorKind::DataWrite,
        ErrorKind::Unsupported,
        ErrorKind::Overrun,
        ErrorKind::PktTooLong,
        ErrorKind::InjectedFail,
        ErrorKind::Abort,
        ErrorKind::BusMasterOff,
    ];

    /// The kind whose code (`kind as u32`, BAR2 0x054) is `code`, if any.
    pub fn from_code(code: u32) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| *k as u32 == code)
    }

    /// Short name used in logs and control replies.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::DescFetch => "desc_fetch",
            ErrorKind::RingId => "ring_id",
            ErrorKind::QueueDisabled => "queue_disabled",
            ErrorKind::BadRing => "bad_ring",
            ErrorKind::BadFirst => "bad_first",
            ErrorKind::BadLast => "bad_last",
            ErrorKind::TooManyDescs => "too_many_descs",
            ErrorKind::LenMismatch => "len_mismatch",
            ErrorKind::DataRead => "data_read",
            ErrorKind::DataWrite => "data_write",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Overrun => "overrun",
            ErrorKind::PktTooLong => "pkt_too_long",
            ErrorKind::InjectedFail => "injected_fail",
            ErrorKind::Abort => "abort",
            ErrorKind::BusMasterOff => "bus_master_off",
        }
    }

    /// (M2S group-A bits, S2M group-B bits) set for this error on ring `dir`.
    pub fn cause_bits(self, dir: Dir) -> (u32, u32) {
        let pick = |tx: u32, rx: u32| if dir == Dir::Tx { (tx, 0) } else { (0, rx) };
        match self {
            ErrorKind::DescFetch | ErrorKind::BadRing | ErrorKind::BusMasterOff => {
                pick(m2s_cause::DESC_FETCH, s2m_cause::DESC_FETCH)
            }
            ErrorKind::RingId | ErrorKind::Overrun => pick(m2s_cause::RING_ID, s2m_cause::RING_ID),
            ErrorKind::QueueDisabled => pick(m2s_cause::PREFETCH_TIMEOUT, s2m_cause::PREFETCH_TIMEOUT),
            ErrorKind::BadFirst => (m2s_cause::BAD_FIRST, 0),
            ErrorKind::BadLast => (m2s_cause::BAD_LAST, 0),
            ErrorKind::TooManyDescs => (m2s_cause::TOO_MANY_DESCS, 0),
            ErrorKind::PktTooLong => (m2s_cause::PKT_TOO_LONG, 0),
            ErrorKind::LenMismatch => (m2s_cause::LEN_MISMATCH, s2m_cause::LEN_MISMATCH),
            ErrorKind::DataRead | ErrorKind::InjectedFail => (m2s_cause::DATA_READ, 0),
            ErrorKind::DataWrite => (0, s2m_cause::DATA_WRITE),
            ErrorKind::Unsupported => (m2s_cause::UNSUPPORTED, 0),
            ErrorKind::Abort => (0, 0),
        }
    }
}

/// The error that aborted an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorRecord {
    /// What went wrong.
    pub kind: ErrorKind,
    /// Queue, if the error is attributable to one.
    pub queue: Option<u8>,
    /// Ring, if attributable.
    pub dir: Option<Dir>,
    /// Descriptor slot index, if attributable.
    pub index: Option<u32>,
    /// Group-A (M2S) cause bits this error set.
    pub m2s_bits: u32,
    /// Group-B (S2M) cause bits this error set.
    pub s2m_bits: u32,
}

/// One direction of one queue (hardware.rst §8.1).
#[derive(Clone, Debug)]
struct Ring {
    base_lo: u32,
    base_hi: u32,
    len: u32,
    cfg: u32,
    head: u32,
    head_rid: u32,
    tail: u32,
    tail_rid: u32,
    /// Descriptors between head and tail (posted, not yet consumed).
    pending: u32,
    /// q_sw_ctrl reset seen since the last abort (recovery bookkeeping).
    reset_since_abort: bool,
}

impl Ring {
    fn new() -> Ring {
        Ring {
            base_lo: 0,
            base_hi: 0,
            len: 0,
            cfg: regs::Q_CFG_RESET,
            head: 0,
            head_rid: 1,
            tail: 0,
            tail_rid: 1,
            pending: 0,
            reset_since_abort: false,
        }
    }

    fn reset_pointers(&mut self) {
        self.head = 0;
        self.head_rid = 1;
        self.tail = 0;
        self.tail_rid = 1;
        self.pending = 0;
    }

    fn base(&self) -> u64 {
        u64::from(self.base_hi) << 32 | u64::from(self.base_lo)
    }

    fn enabled(&self) -> bool {
        self.cfg & regs::Q_CFG_ENABLE == regs::Q_CFG_ENABLE
    }

    fn idle(&self) -> bool {
        self.pending == 0
    }

    fn geometry_ok(&self) -> bool {
        self.base() & 0xFF == 0 && self.len.is_power_of_two() && (32..=1 << 23).contains(&self.len)
    }

    fn advance_head(&mut self, n: u32) {
        // n <= pending < len, so at most one wrap.
        let next = self.head + n;
        if next >= self.len {
            self.head = next - self.len;
            self.head_rid = (self.head_rid + 1) & desc::RING_ID_MASK;
        } else {
            self.head = next;
        }
        self.pending -= n;
    }

    fn ptr(idx: u32, rid: u32) -> u32 {
        (idx & regs::PTR_INDEX_MASK) | (rid & desc::RING_ID_MASK) << regs::PTR_RING_ID_SHIFT
    }
}

/// One queue: Tx and Rx ring plus scheduling/fault state.
#[derive(Clone, Debug)]
struct Queue {
    tx: Ring,
    rx: Ring,
    /// Incremented by every queue reset; in-flight results of an older epoch are dropped.
    epoch: u64,
    /// The last attempt needed more descriptors: wait for the next doorbell.
    wait_doorbell: bool,
    /// Stall fault / masked ring-id retry: do not look at this queue before then.
    not_before: Option<Instant>,
    /// fail_nth countdown (0 = off).
    fail_countdown: u32,
}

impl Queue {
    fn new() -> Queue {
        Queue { tx: Ring::new(), rx: Ring::new(), epoch: 0, wait_doorbell: false, not_before: None, fail_countdown: 0 }
    }
}

/// Mutable engine state, protected by the engine lock.
struct State {
    /// Every written register not modelled explicitly (read back as written).
    regs: HashMap<u32, u32>,
    m2s_state: u32,
    s2m_state: u32,
    /// Stored int_cause of secondary A, B, C and main D.
    cause: [u32; 4],
    queues: Vec<Queue>,
    error: Option<ErrorRecord>,
    shutdown: bool,
    worker_started: bool,
    rr: usize,
}

impl State {
    fn new(strict_reset: bool) -> State {
        let mut regs = HashMap::new();
        if strict_reset {
            // Registers the driver's init must program (hardware.rst §3.6) reset to values that do
            // not help it (hardware.rst §8.1 [I]): all error causes masked (no abort, no
            // interrupt), no 64 KiB encoding and a maximum packet of 0 bytes, at most 0 descriptors
            // per packet.
            for g in [regs::IOFIC_SEC_A, regs::IOFIC_SEC_B, regs::IOFIC_SEC_C, regs::IOFIC_MAIN_D] {
                regs.insert(g + regs::IOFIC_MASK, u32::MAX);
                regs.insert(g + regs::IOFIC_ABORT_MASK, u32::MAX);
            }
            regs.insert(regs::M2S_CFG_LEN, 0);
            regs.insert(regs::M2S_DESC_PREF_CFG_2, 0);
        }
        State {
            regs,
            m2s_state: regs::STATE_NORMAL,
            s2m_state: regs::STATE_NORMAL,
            cause: [0; 4],
            queues: (0..regs::QUEUES_PER_ENGINE).map(|_| Queue::new()).collect(),
            error: None,
            shutdown: false,
            worker_started: false,
            rr: 0,
        }
    }

    fn runnable(&self) -> bool {
        self.error.is_none()
            && self.m2s_state == regs::STATE_NORMAL
            && self.s2m_state == regs::STATE_NORMAL
            && self.reg(regs::M2S_STREAM_CFG, 0) & regs::STREAM_DISABLE == 0
            && self.reg(regs::S2M_STREAM_CFG, 0) & regs::STREAM_DISABLE == 0
    }

    /// Whether error `e` is masked by the abort masks of secondary groups A and B: it sets
    /// its cause bits but does not abort the engine (hardware.rst §3.5 `int_abort_mask`, §8.3).
    fn abort_masked(&self, e: &ErrorRecord) -> bool {
        let a = self.reg(regs::IOFIC_SEC_A + regs::IOFIC_ABORT_MASK, 0);
        let b = self.reg(regs::IOFIC_SEC_B + regs::IOFIC_ABORT_MASK, 0);
        e.kind != ErrorKind::Abort && (e.m2s_bits | e.s2m_bits) != 0 && e.m2s_bits & !a == 0 && e.s2m_bits & !b == 0
    }

    fn reg(&self, off: u32, default: u32) -> u32 {
        self.regs.get(&off).copied().unwrap_or(default)
    }
}

/// What a write to the engine asks its owner to do afterwards.
#[derive(Default, Debug)]
pub struct WriteEffect {
    /// Work may be available: start/wake the worker.
    pub kick: bool,
    /// An error was raised by this write.
    pub error: Option<ErrorRecord>,
}

/// Immutable per-packet inputs taken from the engine state under the lock.
struct Snapshot {
    q: usize,
    epoch: u64,
    tx: RingSnap,
    rx: RingSnap,
    max_descs: u32,
    len0_is_64k: bool,
    max_pkt: Option<u32>,
    tx_rid_masked: bool,
    rx_rid_masked: bool,
    abort_mask_a: u32,
    abort_mask_b: u32,
    fail_countdown: u32,
}

impl Snapshot {
    /// Whether `e` is masked from aborting (see [`State::abort_masked`]).
    fn masked(&self, e: &ErrorRecord) -> bool {
        (e.m2s_bits | e.s2m_bits) != 0 && e.m2s_bits & !self.abort_mask_a == 0 && e.s2m_bits & !self.abort_mask_b == 0
    }
}

#[derive(Clone, Copy)]
struct RingSnap {
    base: u64,
    len: u32,
    head: u32,
    rid: u32,
    pending: u32,
}

impl RingSnap {
    fn slot(&self, k: u32) -> (u32, u32) {
        let abs = self.head + k;
        if abs >= self.len {
            (abs - self.len, (self.rid + 1) & desc::RING_ID_MASK)
        } else {
            (abs, self.rid)
        }
    }
}

/// A buffer segment of a packet.
#[derive(Clone, Copy)]
struct Seg {
    target: Target,
    len: u32,
}

/// Result of processing one packet.
enum Outcome {
    /// Packet checked; its segments are in the scratch buffers, ready to move. `dmb`: a Tx
    /// descriptor has len_ctrl bit 30; `wb`: one has the meta_ctrl write barrier.
    Done { ntx: u32, nrx: u32, bytes: u64, dmb: bool, wb: bool },
    /// A data error masked from aborting: the packet is consumed, nothing is written, the
    /// cause bits are set (hardware.rst §8.3: a masked error does not abort).
    Poisoned { ntx: u32, nrx: u32, rec: ErrorRecord },
    /// Not enough descriptors posted yet.
    NeedDoorbell,
    /// Masked ring-id mismatch: retry later.
    Retry,
    /// Error: abort the engine.
    Error(ErrorRecord),
}

/// Memories and settings the worker needs (owned by the device).
pub struct Env<'a> {
    /// Architecture (address decoding).
    pub gen: Gen,
    /// Host (guest RAM) address space.
    pub host: &'a dyn GuestMemory,
    /// Device memory (HBM / BAR4).
    pub hbm: &'a dyn GuestMemory,
    /// Whether the PCI function may master the bus.
    pub bus_master: bool,
    /// Slow-down factor (0/1 = off).
    pub slow: u32,
    /// Trace sink, if enabled.
    pub trace: Option<&'a crate::trace::Tracer>,
}

/// Reusable per-worker buffers (no allocation per descriptor).
#[derive(Default)]
pub struct Scratch {
    tx: Vec<Seg>,
    rx: Vec<Seg>,
    recs: Vec<TraceRec>,
}

/// Writes of one packet held by unordered completion.
struct Held {
    /// Queue epoch when the packet ran; a queue reset drops the held writes.
    epoch: u64,
    /// When the writes land at the latest.
    due: Instant,
    /// Destination segments, in order.
    segs: Vec<Seg>,
    /// The packet's bytes, read from the source when the packet ran.
    data: Vec<u8>,
}

/// The held packets of one queue, oldest first, and their bytes.
#[derive(Default)]
struct HeldQueue {
    list: VecDeque<Held>,
    bytes: usize,
    /// Buffers of landed packets, reused so that holding a packet does not fault in fresh
    /// pages; at most [`HELD_POOL_MAX`] bytes.
    pool: Vec<Vec<u8>>,
    pool_bytes: usize,
}

impl HeldQueue {
    fn push(&mut self, h: Held) {
        self.bytes += h.data.len();
        self.list.push_back(h);
    }

    fn pop(&mut self) -> Option<Held> {
        let h = self.list.pop_front()?;
        self.bytes -= h.data.len();
        Some(h)
    }

    fn front(&self) -> Option<&Held> {
        self.list.front()
    }

    /// A buffer of `n` bytes (contents unspecified, zero or from an earlier packet).
    fn buffer(&mut self, n: usize) -> Vec<u8> {
        let mut b = self.pool.pop().unwrap_or_default();
        self.pool_bytes -= b.capacity();
        b.resize(n, 0);
        b
    }

    fn recycle(&mut self, b: Vec<u8>) {
        if self.pool_bytes + b.capacity() <= HELD_POOL_MAX {
            self.pool_bytes += b.capacity();
            self.pool.push(b);
        }
    }
}

impl Held {
    /// Whether source segment `t` reads bytes this held packet writes.
    fn overlaps(&self, t: &Seg) -> bool {
        let span = |x: Target| match x {
            Target::Host(a) => (0u8, a),
            Target::Device(a) => (1u8, a),
        };
        let (ts, ta) = span(t.target);
        self.segs.iter().any(|r| {
            let (rs, ra) = span(r.target);
            rs == ts && ra < ta.saturating_add(u64::from(t.len)) && ta < ra.saturating_add(u64::from(r.len))
        })
    }
}

/// One UDMA engine.
pub struct Engine {
    /// Engine id (hardware.rst §2.2).
    pub id: u32,
    /// Whether this engine reaches host memory (hardware.rst §2.5).
    host_ok: bool,
    opts: Options,
    /// Packets whose writes are held (unordered completion).
    held: AtomicUsize,
    state: Mutex<State>,
    cv: Condvar,
    /// Statistics.
    pub counters: Counters,
}

fn err(kind: ErrorKind, q: usize, dir: Dir, index: Option<u32>) -> ErrorRecord {
    let (m2s_bits, s2m_bits) = kind.cause_bits(dir);
    ErrorRecord { kind, queue: Some(q as u8), dir: Some(dir), index, m2s_bits, s2m_bits }
}

/// Decodes a queue bank offset: (queue, direction, register offset in bank).
fn bank_of(unit: u32) -> Option<(usize, Dir, u32)> {
    let span = regs::Q_STRIDE * regs::QUEUES_PER_ENGINE as u32;
    let (base, dir) = if (regs::M2S_Q_BASE..regs::M2S_Q_BASE + span).contains(&unit) {
        (regs::M2S_Q_BASE, Dir::Tx)
    } else if (regs::S2M_Q_BASE..regs::S2M_Q_BASE + span).contains(&unit) {
        (regs::S2M_Q_BASE, Dir::Rx)
    } else {
        return None;
    };
    let d = unit - base;
    Some(((d / regs::Q_STRIDE) as usize, dir, d % regs::Q_STRIDE))
}

/// Decodes an IOFIC sub-register: (cause index 0=A,1=B,2=C,3=D, sub-offset).
fn iofic_of(unit: u32) -> Option<(usize, u32)> {
    [regs::IOFIC_SEC_A, regs::IOFIC_SEC_B, regs::IOFIC_SEC_C, regs::IOFIC_MAIN_D]
        .iter()
        .enumerate()
        .find_map(|(i, &b)| (b..b + 0x40).contains(&unit).then(|| (i, unit - b)))
}

impl Engine {
    /// A freshly reset engine (state normal, hardware.rst §8.3) of generation `gen`.
    pub fn new(id: u32, gen: Gen, opts: &Options) -> Engine {
        Engine {
            id,
            host_ok: !opts.host_connectivity || gen.has_host_connectivity(id),
            opts: opts.clone(),
            held: AtomicUsize::new(0),
            state: Mutex::new(State::new(opts.strict_reset)),
            cv: Condvar::new(),
            counters: Counters::default(),
        }
    }

    /// Packets whose writes are held by unordered completion.
    pub fn held_writes(&self) -> usize {
        self.held.load(Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Returns to power-on state; in-flight packets are dropped.
    pub fn reset(&self) {
        let mut st = self.lock();
        let epochs: Vec<u64> = st.queues.iter().map(|q| q.epoch).collect();
        let (shutdown, started) = (st.shutdown, st.worker_started);
        *st = State::new(self.opts.strict_reset);
        st.shutdown = shutdown;
        st.worker_started = started;
        for (q, e) in st.queues.iter_mut().zip(epochs) {
            q.epoch = e + 1;
        }
        self.cv.notify_all();
    }

    /// Asks the worker to exit.
    pub fn shutdown(&self) {
        self.lock().shutdown = true;
        self.cv.notify_all();
    }

    /// Marks the worker as started; returns true if the caller must spawn it.
    pub fn claim_worker(&self) -> bool {
        let mut st = self.lock();
        !std::mem::replace(&mut st.worker_started, true)
    }

    /// Wakes the worker.
    pub fn kick(&self) {
        self.cv.notify_all();
    }

    /// The error that currently aborts the engine, if any.
    pub fn error(&self) -> Option<ErrorRecord> {
        self.lock().error
    }

    /// Reads the 32-bit register at unit offset `unit` (hardware.rst §3).
    pub fn read(&self, unit: u32) -> u32 {
        let st = self.lock();
        if let Some((q, dir, r)) = bank_of(unit) {
            let qu = &st.queues[q];
            let ring = if dir == Dir::Tx { &qu.tx } else { &qu.rx };
            return match r {
                regs::Q_CFG => ring.cfg,
                regs::Q_BASE_LO => ring.base_lo,
                regs::Q_BASE_HI => ring.base_hi,
                regs::Q_LEN => ring.len,
                // Completion = consumption in this model (hardware.rst §8.4).
                regs::Q_HEAD | regs::Q_COMP_HEAD => Ring::ptr(ring.head, ring.head_rid),
                regs::Q_TAIL => Ring::ptr(ring.tail, ring.tail_rid),
                regs::Q_DOORBELL => 0,
                regs::M2S_Q_SW_CTRL if dir == Dir::Tx => 0,
                regs::S2M_Q_SW_CTRL if dir == Dir::Rx => 0,
                regs::M2S_Q_RLIMIT_MASK if dir == Dir::Tx => st.reg(unit, regs::RLIMIT_MASK_RESET),
                _ => st.reg(unit, 0),
            };
        }
        if let Some((g, sub)) = iofic_of(unit) {
            if sub == regs::IOFIC_CAUSE {
                let mut v = st.cause[g];
                if g == 3 {
                    let sum = |c: u32, b: u32| if c != 0 { b } else { 0 };
                    v |= sum(st.cause[0], regs::MAIN_D_SUM_A)
                        | sum(st.cause[1], regs::MAIN_D_SUM_B)
                        | sum(st.cause[2], regs::MAIN_D_SUM_C);
                }
                return v;
            }
            if sub == regs::IOFIC_CAUSE_SET || sub == regs::IOFIC_MASK_CLEAR {
                return 0;
            }
            return st.reg(unit, 0);
        }
        match unit {
            regs::M2S_STATE => st.m2s_state,
            regs::S2M_STATE => st.s2m_state,
            regs::M2S_CHANGE_STATE | regs::S2M_CHANGE_STATE => 0,
            _ => st.reg(unit, 0),
        }
    }

    /// Writes the 32-bit register at unit offset `unit` (hardware.rst §3, §8).
    pub fn write(&self, unit: u32, val: u32) -> WriteEffect {
        let mut st = self.lock();
        let mut fx = WriteEffect::default();
        if let Some((q, dir, r)) = bank_of(unit) {
            self.write_bank(&mut st, q, dir, r, unit, val, &mut fx);
        } else if let Some((g, sub)) = iofic_of(unit) {
            match sub {
                // W0C: bits written as 0 are cleared (model choice, documented).
                regs::IOFIC_CAUSE => st.cause[g] &= val,
                regs::IOFIC_CAUSE_SET => st.cause[g] |= val,
                regs::IOFIC_MASK_CLEAR => {
                    let m = st.reg(unit - regs::IOFIC_MASK_CLEAR + regs::IOFIC_MASK, 0) & val;
                    st.regs.insert(unit - regs::IOFIC_MASK_CLEAR + regs::IOFIC_MASK, m);
                }
                _ => {
                    st.regs.insert(unit, val);
                }
            }
        } else {
            match unit {
                regs::M2S_STATE | regs::S2M_STATE => {}
                regs::M2S_CHANGE_STATE | regs::S2M_CHANGE_STATE => {
                    let new = if val & regs::CHANGE_STATE_ABORT != 0 {
                        Some(regs::STATE_ABORT)
                    } else if val & regs::CHANGE_STATE_DISABLE != 0 {
                        Some(regs::STATE_IDLE)
                    } else if val & regs::CHANGE_STATE_NORMAL != 0 {
                        Some(regs::STATE_NORMAL)
                    } else {
                        None
                    };
                    if let Some(s) = new {
                        if unit == regs::M2S_CHANGE_STATE {
                            st.m2s_state = s;
                        } else {
                            st.s2m_state = s;
                        }
                        if s == regs::STATE_ABORT && st.error.is_none() {
                            st.error = Some(ErrorRecord {
                                kind: ErrorKind::Abort,
                                queue: None,
                                dir: None,
                                index: None,
                                m2s_bits: 0,
                                s2m_bits: 0,
                            });
                            for qu in st.queues.iter_mut() {
                                qu.tx.reset_since_abort = false;
                                qu.rx.reset_since_abort = false;
                            }
                        }
                        if st.m2s_state == regs::STATE_NORMAL && st.s2m_state == regs::STATE_NORMAL {
                            // change_state NORMAL clears the abort; cause bits stay for the driver.
                            st.error = None;
                            for qu in st.queues.iter_mut() {
                                qu.wait_doorbell = false;
                            }
                            fx.kick = true;
                        }
                    }
                }
                regs::M2S_STREAM_CFG | regs::S2M_STREAM_CFG => {
                    st.regs.insert(unit, val);
                    // Re-enabling a stream resumes the posted work.
                    fx.kick = val & regs::STREAM_DISABLE == 0;
                }
                _ => {
                    st.regs.insert(unit, val);
                }
            }
        }
        fx
    }

    #[allow(clippy::too_many_arguments)]
    fn write_bank(&self, st: &mut State, q: usize, dir: Dir, r: u32, unit: u32, val: u32, fx: &mut WriteEffect) {
        let sw_ctrl = if dir == Dir::Tx { regs::M2S_Q_SW_CTRL } else { regs::S2M_Q_SW_CTRL };
        let qu = &mut st.queues[q];
        let ring = if dir == Dir::Tx { &mut qu.tx } else { &mut qu.rx };
        match r {
            regs::Q_CFG => {
                ring.cfg = val;
                if ring.enabled() {
                    qu.wait_doorbell = false;
                    fx.kick = true;
                }
                self.maybe_recover(st, q, fx);
            }
            regs::Q_BASE_LO | regs::Q_BASE_HI | regs::Q_LEN if !ring.idle() => {
                // The ring geometry may change only on an idle (or reset) queue (hardware.rst §3.7:
                // the driver pauses and resets the queue before writing it).
                log::error!(
                    "engine {} q{q} {dir:?}: ring register 0x{r:x} written with {} descriptors pending; ignored",
                    self.id,
                    ring.pending
                );
            }
            regs::Q_BASE_LO => ring.base_lo = val,
            regs::Q_BASE_HI => ring.base_hi = val,
            regs::Q_LEN => ring.len = val & regs::PTR_INDEX_MASK,
            regs::Q_HEAD | regs::Q_TAIL | regs::Q_COMP_HEAD => {
                log::debug!("engine {} q{q} {dir:?}: write to RO pointer 0x{r:x} ignored", self.id);
            }
            regs::Q_DOORBELL => self.doorbell(st, q, dir, val & regs::PTR_INDEX_MASK, fx),
            _ if r == sw_ctrl => {
                if val & regs::Q_SW_CTRL_RESET != 0 {
                    ring.reset_pointers();
                    ring.reset_since_abort = true;
                    qu.epoch += 1;
                    qu.wait_doorbell = false;
                    qu.not_before = None;
                    log::debug!("engine {} q{q} {dir:?}: queue reset", self.id);
                    self.maybe_recover(st, q, fx);
                }
            }
            _ => {
                st.regs.insert(unit, val);
            }
        }
    }

    /// Recovery rule: after an abort, once queue `q` was reset (q_sw_ctrl bit 8)
    /// on both directions and both cfg enable bits are set again, the abort is
    /// cleared (if it was caused by `q` or by no particular queue) together with
    /// the cause bits that error set.
    fn maybe_recover(&self, st: &mut State, q: usize, fx: &mut WriteEffect) {
        if self.opts.sticky_errors {
            return; // strict: only change_state NORMAL ends an abort; causes stay until cleared
        }
        let Some(e) = st.error else { return };
        if e.queue.is_some_and(|eq| usize::from(eq) != q) {
            return;
        }
        let qu = &st.queues[q];
        if !(qu.tx.reset_since_abort && qu.rx.reset_since_abort && qu.tx.enabled() && qu.rx.enabled()) {
            return;
        }
        st.cause[0] &= !e.m2s_bits;
        st.cause[1] &= !e.s2m_bits;
        st.error = None;
        st.m2s_state = regs::STATE_NORMAL;
        st.s2m_state = regs::STATE_NORMAL;
        for qu in st.queues.iter_mut() {
            qu.tx.reset_since_abort = false;
            qu.rx.reset_since_abort = false;
            qu.wait_doorbell = false;
        }
        log::info!("engine {}: abort cleared by re-init of queue {q}", self.id);
        fx.kick = true;
    }

    fn doorbell(&self, st: &mut State, q: usize, dir: Dir, n: u32, fx: &mut WriteEffect) {
        let qu = &mut st.queues[q];
        let ring = if dir == Dir::Tx { &mut qu.tx } else { &mut qu.rx };
        if n == 0 {
            log::debug!("engine {} q{q} {dir:?}: doorbell of 0 ignored", self.id);
            return;
        }
        let kind = if !ring.enabled() {
            Some(ErrorKind::QueueDisabled)
        } else if !ring.geometry_ok() {
            Some(ErrorKind::BadRing)
        } else if u64::from(ring.pending) + u64::from(n) >= u64::from(ring.len) {
            Some(ErrorKind::Overrun)
        } else {
            None
        };
        if let Some(k) = kind {
            let tail = ring.tail;
            let e = err(k, q, dir, Some(tail));
            // A masked error only sets its cause bits; the doorbell is dropped either way.
            if self.raise(st, e) {
                fx.error = Some(e);
            }
            return;
        }
        let next = ring.tail + n;
        if next >= ring.len {
            ring.tail = next - ring.len;
            ring.tail_rid = (ring.tail_rid + 1) & desc::RING_ID_MASK;
        } else {
            ring.tail = next;
        }
        ring.pending += n;
        qu.wait_doorbell = false;
        fx.kick = true;
    }

    /// Reports error `e` (hardware.rst §8.3): sets its cause bits and, unless the abort masks mask
    /// it, aborts the engine (state fields = 2). Returns whether the engine aborted.
    fn raise(&self, st: &mut State, e: ErrorRecord) -> bool {
        let new_bits = st.cause[0] & e.m2s_bits != e.m2s_bits || st.cause[1] & e.s2m_bits != e.s2m_bits;
        st.cause[0] |= e.m2s_bits;
        st.cause[1] |= e.s2m_bits;
        if st.abort_masked(&e) {
            if new_bits {
                log::warn!(
                    "engine {}: {} error (queue {:?}, ring {:?}, descriptor {:?}) masked by the abort mask; M2S cause 0x{:x} S2M cause 0x{:x}; no abort",
                    self.id,
                    e.kind.name(),
                    e.queue,
                    e.dir,
                    e.index,
                    e.m2s_bits,
                    e.s2m_bits
                );
            }
            return false;
        }
        st.m2s_state = regs::STATE_ABORT;
        st.s2m_state = regs::STATE_ABORT;
        if st.error.is_none() {
            st.error = Some(e);
        }
        for qu in st.queues.iter_mut() {
            qu.tx.reset_since_abort = false;
            qu.rx.reset_since_abort = false;
        }
        self.counters.errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        log::warn!(
            "engine {}: {} error (queue {:?}, ring {:?}, descriptor {:?}); M2S cause 0x{:x} S2M cause 0x{:x}; engine aborted",
            self.id,
            e.kind.name(),
            e.queue,
            e.dir,
            e.index,
            e.m2s_bits,
            e.s2m_bits
        );
        true
    }

    /// Applies an injected abort.
    pub fn inject_abort(&self) -> ErrorRecord {
        let mut st = self.lock();
        let e = ErrorRecord { kind: ErrorKind::Abort, queue: None, dir: None, index: None, m2s_bits: 0, s2m_bits: 0 };
        self.raise(&mut st, e);
        e
    }

    /// Arms fail_nth on queue `q` (n = 0 disarms).
    pub fn inject_fail_nth(&self, q: usize, n: u32) {
        if let Some(qu) = self.lock().queues.get_mut(q) {
            qu.fail_countdown = n;
        }
    }

    /// Stalls queue `q` for `d`.
    pub fn inject_stall(&self, q: usize, d: Duration) {
        if let Some(qu) = self.lock().queues.get_mut(q) {
            qu.not_before = Some(Instant::now() + d);
        }
        self.cv.notify_all();
    }

    /// Removes all injected per-queue faults.
    pub fn clear_faults(&self) {
        let mut st = self.lock();
        for qu in st.queues.iter_mut() {
            qu.fail_countdown = 0;
            qu.not_before = None;
        }
        self.cv.notify_all();
    }

    /// Worker thread body: processes packets until [`Engine::shutdown`].
    /// `env` is re-evaluated for every packet (bus master / slow factor may change).
    pub fn run(&self, env: &dyn Fn() -> EnvOwned, on_error: &dyn Fn(ErrorRecord)) {
        let mut scratch = Scratch::default();
        // Writes held by unordered completion, per queue, oldest first. Only this thread
        // touches them, so they land in the order the barriers require.
        let mut held: Vec<HeldQueue> = (0..regs::QUEUES_PER_ENGINE).map(|_| HeldQueue::default()).collect();
        let mut st = self.lock();
        loop {
            if st.shutdown {
                return;
            }
            let now = Instant::now();
            let epochs: Vec<u64> = st.queues.iter().map(|q| q.epoch).collect();
            let due = |h: &HeldQueue, epoch: u64| h.front().is_some_and(|x| x.due <= now || x.epoch != epoch);
            if held.iter().zip(&epochs).any(|(h, &e)| due(h, e)) {
                drop(st);
                let owned = env();
                let e = owned.env();
                for (h, &ep) in held.iter_mut().zip(&epochs) {
                    self.land(&e, h, Some(now), ep);
                }
                st = self.lock();
                continue;
            }
            let mut deadline: Option<Instant> = held.iter().filter_map(|h| h.front().map(|x| x.due)).min();
            let mut pick = None;
            if st.runnable() {
                for i in 0..regs::QUEUES_PER_ENGINE {
                    let q = (st.rr + i) % regs::QUEUES_PER_ENGINE;
                    let qu = &mut st.queues[q];
                    // A queue runs only while both directions have both enable bits set, at
                    // every fetch, not just at doorbell time (hardware.rst §3.4, §3.8 queue pause).
                    if qu.tx.pending == 0 || qu.wait_doorbell || !qu.tx.enabled() || !qu.rx.enabled() {
                        continue;
                    }
                    if let Some(t) = qu.not_before {
                        if t > now {
                            deadline = Some(deadline.map_or(t, |d: Instant| d.min(t)));
                            continue;
                        }
                        qu.not_before = None;
                    }
                    pick = Some(q);
                    break;
                }
            }
            let Some(q) = pick else {
                st = match deadline {
                    Some(t) => {
                        let d = t.saturating_duration_since(now);
                        self.cv.wait_timeout(st, d).unwrap_or_else(|e| e.into_inner()).0
                    }
                    None => self.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
                };
                continue;
            };
            st.rr = q + 1;
            let snap = self.snapshot(&st, q);
            drop(st);
            let owned = env();
            let e = owned.env();
            let t0 = Instant::now();
            let mut outcome = self.process(&e, &snap, &mut scratch);
            if let Outcome::Done { bytes, dmb, wb, .. } = outcome {
                if let Err(rec) = self.move_data(&e, &snap, &scratch, &mut held[q], bytes, dmb, wb) {
                    outcome = Outcome::Error(rec);
                }
            }
            if e.slow > 1 {
                if let Outcome::Done { .. } = outcome {
                    let base = t0.elapsed().max(SLOW_BASE);
                    std::thread::sleep(base * (e.slow - 1));
                }
            }
            st = self.lock();
            if st.queues[q].epoch != snap.epoch {
                continue; // queue reset while in flight: drop the result
            }
            match outcome {
                Outcome::Done { ntx, nrx, bytes, .. } => {
                    let qu = &mut st.queues[q];
                    qu.tx.advance_head(ntx);
                    qu.rx.advance_head(nrx);
                    if qu.fail_countdown > 0 {
                        qu.fail_countdown -= ntx.min(qu.fail_countdown);
                    }
                    self.counters.descriptors.fetch_add(u64::from(ntx + nrx), Relaxed);
                    self.counters.packets.fetch_add(1, Relaxed);
                    self.counters.bytes.fetch_add(bytes, Relaxed);
                    if let Some(t) = e.trace {
                        t.record(&scratch.recs);
                    }
                }
                Outcome::Poisoned { ntx, nrx, rec } => {
                    if rec.kind == ErrorKind::InjectedFail {
                        st.queues[q].fail_countdown = 0;
                    }
                    self.raise(&mut st, rec);
                    let qu = &mut st.queues[q];
                    qu.tx.advance_head(ntx);
                    qu.rx.advance_head(nrx);
                    self.counters.descriptors.fetch_add(u64::from(ntx + nrx), Relaxed);
                }
                Outcome::NeedDoorbell => st.queues[q].wait_doorbell = true,
                Outcome::Retry => st.queues[q].not_before = Some(Instant::now() + RINGID_RETRY),
                Outcome::Error(rec) => {
                    if rec.kind == ErrorKind::InjectedFail {
                        st.queues[q].fail_countdown = 0;
                    }
                    if self.raise(&mut st, rec) {
                        drop(st);
                        on_error(rec);
                        st = self.lock();
                    } else {
                        // Masked, and the packet cannot be delimited or moved: the queue
                        // stalls on it (cause bits set), as the prefetcher does on hardware.
                        st.queues[q].not_before = Some(Instant::now() + RINGID_RETRY);
                    }
                }
            }
        }
    }

    /// Moves the bytes of a checked packet (segments in `sc`), applying its barriers
    /// (hardware.rst §4.2 bit 30 DMB: all earlier transfers of the queue complete first; §4.3 bit
    /// 26 write barrier: this packet's and all earlier writes are visible before the packet
    /// completes). With unordered completion on, a barrier-free packet longer than
    /// [`POSTED_WRITE_MAX`] bytes is read now and its writes are held in `held` until a later
    /// barrier or the delay.
    #[allow(clippy::too_many_arguments)]
    fn move_data(
        &self,
        env: &Env<'_>,
        s: &Snapshot,
        sc: &Scratch,
        held: &mut HeldQueue,
        bytes: u64,
        dmb: bool,
        wb: bool,
    ) -> Result<(), ErrorRecord> {
        // DMB (and, as the model does not model read-after-write hazards, a packet reading
        // bytes a held write targets) waits for the queue's earlier writes.
        if dmb || (held.bytes > 0 && sc.tx.iter().any(|t| held.list.iter().any(|h| h.overlaps(t)))) {
            self.land(env, held, None, s.epoch);
        }
        match self.opts.unordered_delay {
            Some(delay) if !dmb && !wb && bytes > POSTED_WRITE_MAX => {
                let mut data = held.buffer(bytes as usize);
                let mut at = 0usize;
                for t in &sc.tx {
                    let (m, a) = self.space(env, t.target, 0);
                    if !m.read(a, &mut data[at..at + t.len as usize]) {
                        let (idx, _) = s.tx.slot(0);
                        return Err(err(ErrorKind::DataRead, s.q, Dir::Tx, Some(idx)));
                    }
                    at += t.len as usize;
                }
                held.push(Held { epoch: s.epoch, due: Instant::now() + delay, segs: sc.rx.clone(), data });
                self.held.fetch_add(1, Relaxed);
                while held.bytes > HELD_BYTES_MAX {
                    let Some(h) = held.pop() else { break };
                    self.write_held(env, &h);
                    held.recycle(h.data);
                    self.held.fetch_sub(1, Relaxed);
                }
                Ok(())
            }
            _ => {
                let r = self.copy(env, s, sc);
                if wb {
                    self.land(env, held, None, s.epoch);
                }
                r
            }
        }
    }

    /// Lands held writes in order: all of them (`upto` = None) or those due by `upto`. Writes
    /// of an older queue epoch (the queue was reset) are dropped.
    fn land(&self, env: &Env<'_>, held: &mut HeldQueue, upto: Option<Instant>, epoch: u64) {
        while let Some(h) = held.front() {
            if h.epoch == epoch && upto.is_some_and(|t| h.due > t) {
                break;
            }
            let Some(h) = held.pop() else { break };
            if h.epoch == epoch {
                self.write_held(env, &h);
            }
            held.recycle(h.data);
            self.held.fetch_sub(1, Relaxed);
        }
    }

    fn write_held(&self, env: &Env<'_>, h: &Held) {
        let mut at = 0usize;
        for r in &h.segs {
            let (m, a) = self.space(env, r.target, 0);
            if !m.write(a, &h.data[at..at + r.len as usize]) {
                log::warn!("engine {}: held write to {:?} no longer mapped; dropped", self.id, r.target);
            }
            at += r.len as usize;
        }
    }

    /// Copies a checked packet from its Tx to its Rx segments.
    fn copy(&self, env: &Env<'_>, s: &Snapshot, sc: &Scratch) -> Result<(), ErrorRecord> {
        let (mut ti, mut to, mut ri, mut ro) = (0usize, 0u32, 0usize, 0u32);
        while ti < sc.tx.len() && ri < sc.rx.len() {
            let (t, r) = (sc.tx[ti], sc.rx[ri]);
            let n = (t.len - to).min(r.len - ro);
            if n > 0 {
                let (smem, sa) = self.space(env, t.target, to);
                let (dmem, da) = self.space(env, r.target, ro);
                if !mem::copy(smem, sa, dmem, da, n as usize) {
                    // Unmapped between check and copy (DMA_UNMAP race): report as write error.
                    let (idx, _) = s.rx.slot(ri as u32);
                    return Err(err(ErrorKind::DataWrite, s.q, Dir::Rx, Some(idx)));
                }
            }
            to += n;
            ro += n;
            if to == t.len {
                ti += 1;
                to = 0;
            }
            if ro == r.len {
                ri += 1;
                ro = 0;
            }
        }
        Ok(())
    }

    fn snapshot(&self, st: &State, q: usize) -> Snapshot {
        let qu = &st.queues[q];
        let rs = |r: &Ring| RingSnap { base: r.base(), len: r.len, head: r.head, rid: r.head_rid, pending: r.pending };
        let cfg_len = st.regs.get(&regs::M2S_CFG_LEN).copied();
        let abort_mask_a = st.reg(regs::IOFIC_SEC_A + regs::IOFIC_ABORT_MASK, 0);
        let abort_mask_b = st.reg(regs::IOFIC_SEC_B + regs::IOFIC_ABORT_MASK, 0);
        let max = st.reg(regs::M2S_DESC_PREF_CFG_2, regs::DEFAULT_MAX_DESCS) & regs::MAX_DESCS_MASK;
        Snapshot {
            q,
            epoch: qu.epoch,
            tx: rs(&qu.tx),
            rx: rs(&qu.rx),
            max_descs: if max == 0 && !self.opts.strict_reset { regs::DEFAULT_MAX_DESCS } else { max },
            len0_is_64k: cfg_len.is_none_or(|v| v & regs::CFG_LEN_64K != 0),
            max_pkt: cfg_len.map(|v| v & regs::CFG_LEN_MAX_MASK),
            tx_rid_masked: abort_mask_a & m2s_cause::RING_ID != 0,
            rx_rid_masked: abort_mask_b & s2m_cause::RING_ID != 0,
            abort_mask_a,
            abort_mask_b,
            fail_countdown: qu.fail_countdown,
        }
    }

    /// Fetches the descriptor at slot `k` past the head of ring `r`.
    fn fetch(&self, env: &Env<'_>, r: &RingSnap, k: u32, dir: Dir, q: usize) -> Result<(u32, [u8; 16]), ErrorRecord> {
        let (idx, _) = r.slot(k);
        let mut raw = [0u8; 16];
        if !env.bus_master {
            return Err(err(ErrorKind::BusMasterOff, q, dir, Some(idx)));
        }
        let addr = r.base.wrapping_add(u64::from(idx) * desc::SIZE);
        let ok = match env.gen.decode_addr(addr) {
            Some(Target::Host(a)) => self.host_ok && env.host.read(a, &mut raw),
            Some(Target::Device(a)) => env.hbm.read(a, &mut raw),
            None => false,
        };
        if !ok {
            return Err(err(ErrorKind::DescFetch, q, dir, Some(idx)));
        }
        Ok((idx, raw))
    }

    fn process(&self, env: &Env<'_>, s: &Snapshot, sc: &mut Scratch) -> Outcome {
        let q = s.q;
        sc.tx.clear();
        sc.rx.clear();
        sc.recs.clear();
        let dlen = |w0: u32| -> u32 {
            match w0 & desc::LEN_MASK {
                0 if s.len0_is_64k => 65536,
                l => l,
            }
        };
        // A data error masked from aborting poisons the packet: it is still delimited and
        // consumed, but nothing is written (hardware.rst §8.3).
        let mut poison: Option<ErrorRecord> = None;
        let (mut dmb, mut wb) = (false, false);
        // ---- Tx: collect FIRST..LAST ----
        let mut total: u64 = 0;
        let mut k = 0u32;
        loop {
            if k >= s.tx.pending {
                return Outcome::NeedDoorbell;
            }
            let (idx, raw) = match self.fetch(env, &s.tx, k, Dir::Tx, q) {
                Ok(v) => v,
                Err(e) => return Outcome::Error(e),
            };
            let (_, want_rid) = s.tx.slot(k);
            let w0 = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
            let w1 = u32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]);
            let addr = u64::from_le_bytes([raw[8], raw[9], raw[10], raw[11], raw[12], raw[13], raw[14], raw[15]]);
            if (w0 >> desc::RING_ID_SHIFT) & desc::RING_ID_MASK != want_rid {
                if s.tx_rid_masked {
                    return Outcome::Retry;
                }
                return Outcome::Error(err(ErrorKind::RingId, q, Dir::Tx, Some(idx)));
            }
            if k == 0 && w0 & desc::FIRST == 0 {
                return Outcome::Error(err(ErrorKind::BadFirst, q, Dir::Tx, Some(idx)));
            }
            if k > 0 && w0 & desc::FIRST != 0 {
                return Outcome::Error(err(ErrorKind::BadLast, q, Dir::Tx, Some(idx)));
            }
            if k + 1 > s.max_descs {
                return Outcome::Error(err(ErrorKind::TooManyDescs, q, Dir::Tx, Some(idx)));
            }
            if w0 & (desc::META | desc::CONCAT | desc::TX_UNDEFINED) != 0
                || (w1 != desc::META_COPY && w1 != desc::META_COPY_WB)
            {
                return Outcome::Error(err(ErrorKind::Unsupported, q, Dir::Tx, Some(idx)));
            }
            dmb |= w0 & desc::DMB != 0;
            wb |= w1 & desc::META_WB != 0;
            let len = dlen(w0);
            let bad = if s.fail_countdown == k + 1 {
                Some(ErrorKind::InjectedFail)
            } else {
                match env.gen.decode_addr(addr) {
                    Some(t) if self.mapped(env, t, len) => None,
                    _ => Some(ErrorKind::DataRead),
                }
            };
            if let Some(kind) = bad {
                let e = err(kind, q, Dir::Tx, Some(idx));
                if !s.masked(&e) {
                    return Outcome::Error(e);
                }
                poison.get_or_insert(e);
            }
            let target = env.gen.decode_addr(addr).unwrap_or(Target::Device(0));
            total += u64::from(len);
            sc.tx.push(Seg { target, len });
            if env.trace.is_some() {
                sc.recs.push(TraceRec { engine: self.id, queue: q as u8, tx: true, index: idx, raw });
            }
            k += 1;
            if w0 & desc::LAST != 0 {
                break;
            }
        }
        if s.max_pkt.is_some_and(|m| total > u64::from(m)) {
            let (idx, _) = s.tx.slot(0);
            return Outcome::Error(err(ErrorKind::PktTooLong, q, Dir::Tx, Some(idx)));
        }
        // ---- Rx: consume descriptors until the packet's bytes are placed ----
        let mut placed: u64 = 0;
        let mut j = 0u32;
        while placed < total {
            if j >= s.rx.pending {
                return Outcome::NeedDoorbell;
            }
            let (idx, raw) = match self.fetch(env, &s.rx, j, Dir::Rx, q) {
                Ok(v) => v,
                Err(e) => return Outcome::Error(e),
            };
            let (_, want_rid) = s.rx.slot(j);
            let w0 = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
            let addr = u64::from_le_bytes([raw[8], raw[9], raw[10], raw[11], raw[12], raw[13], raw[14], raw[15]]);
            if (w0 >> desc::RING_ID_SHIFT) & desc::RING_ID_MASK != want_rid {
                if s.rx_rid_masked {
                    return Outcome::Retry;
                }
                return Outcome::Error(err(ErrorKind::RingId, q, Dir::Rx, Some(idx)));
            }
            if w0 & desc::RX_UNDEFINED != 0 {
                return Outcome::Error(err(ErrorKind::Unsupported, q, Dir::Rx, Some(idx)));
            }
            let len = dlen(w0);
            if placed + u64::from(len) > total || len == 0 {
                return Outcome::Error(err(ErrorKind::LenMismatch, q, Dir::Rx, Some(idx)));
            }
            let target = match env.gen.decode_addr(addr) {
                Some(t) if self.mapped(env, t, len) => t,
                _ => {
                    let e = err(ErrorKind::DataWrite, q, Dir::Rx, Some(idx));
                    if !s.masked(&e) {
                        return Outcome::Error(e);
                    }
                    poison.get_or_insert(e);
                    Target::Device(0)
                }
            };
            placed += u64::from(len);
            sc.rx.push(Seg { target, len });
            if env.trace.is_some() {
                sc.recs.push(TraceRec { engine: self.id, queue: q as u8, tx: false, index: idx, raw });
            }
            j += 1;
        }
        // ---- Rx prefetch: the S2M prefetcher reads ahead up to the tail (at most
        // RX_PREFETCH descriptors) and checks each slot's ring id (hardware.rst §3.5 S2M cause 11):
        // an over-counted Rx doorbell, or one rung before its descriptor was written, fails
        // here even though the packet itself is complete ----
        for jj in j..s.rx.pending.min(j + RX_PREFETCH) {
            let (idx, raw) = match self.fetch(env, &s.rx, jj, Dir::Rx, q) {
                Ok(v) => v,
                Err(e) => return Outcome::Error(e),
            };
            let (_, want_rid) = s.rx.slot(jj);
            let w0 = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
            if (w0 >> desc::RING_ID_SHIFT) & desc::RING_ID_MASK != want_rid {
                if s.rx_rid_masked {
                    return Outcome::Retry;
                }
                return Outcome::Error(err(ErrorKind::RingId, q, Dir::Rx, Some(idx)));
            }
        }
        if let Some(rec) = poison {
            return Outcome::Poisoned { ntx: k, nrx: j, rec };
        }
        Outcome::Done { ntx: k, nrx: j, bytes: total, dmb, wb }
    }

    fn space<'a>(&self, env: &Env<'a>, t: Target, off: u32) -> (&'a dyn GuestMemory, u64) {
        match t {
            Target::Host(a) => (env.host, a.wrapping_add(u64::from(off))),
            Target::Device(a) => (env.hbm, a.wrapping_add(u64::from(off))),
        }
    }

    fn mapped(&self, env: &Env<'_>, t: Target, len: u32) -> bool {
        env.bus_master
            && match t {
                Target::Host(a) => self.host_ok && env.host.is_mapped(a, len as usize),
                Target::Device(a) => env.hbm.is_mapped(a, len as usize),
            }
    }
}

/// Owned inputs from which an [`Env`] is borrowed for one packet.
pub struct EnvOwned {
    /// Architecture.
    pub gen: Gen,
    /// Host memory.
    pub host: std::sync::Arc<dyn GuestMemory>,
    /// Device memory.
    pub hbm: std::sync::Arc<dyn GuestMemory>,
    /// Bus master enable.
    pub bus_master: bool,
    /// Slow factor.
    pub slow: u32,
    /// Trace sink.
    pub trace: Option<std::sync::Arc<crate::trace::Tracer>>,
}

impl EnvOwned {
    /// Borrowed view.
    pub fn env(&self) -> Env<'_> {
        Env {
            gen: self.gen,
            host: &*self.host,
            hbm: &*self.hbm,
            bus_master: self.bus_master,
            slow: self.slow,
            trace: self.trace.as_deref(),
        }
    }
}
