// SPDX-License-Identifier: GPL-2.0
//! One UDMA engine (hardware.rst §3, §4, §8), split by job:
//!
//! * `regfile`: the register file: reset values, register read/write semantics,
//!   queue gating, doorbells and the error/abort state machine;
//! * `worker`: the engine's worker thread: queue scheduling and applying each
//!   packet's outcome;
//! * `packet`: packet processing: the checked descriptor fetch shared by the Tx
//!   and Rx rings and the per-packet rules;
//! * `transfer`: moving a checked packet's bytes, with the writes unordered
//!   completion holds.
//!
//! This file holds the engine itself, its error types and the fault-injection entry points.

mod packet;
mod regfile;
mod transfer;
mod worker;

pub use packet::{Scratch, RX_PREFETCH};
pub use regfile::WriteEffect;
pub use transfer::POSTED_WRITE_MAX;
pub use worker::{Env, Memories};

use crate::fault::CounterValues;
use crate::layout::Gen;
use crate::regs::{m2s_cause, s2m_cause};
use crate::Options;
use regfile::State;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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
    /// Packet longer than cfg_len \[19:0\].
    PktTooLong = 13,
    /// Injected bad address (fail_nth).
    InjectedFail = 14,
    /// Injected engine abort, or change_state ABORT written by the driver.
    Abort = 15,
    /// DMA attempted while PCI bus mastering is disabled.
    BusMasterOff = 16,
}

impl std::fmt::Display for ErrorRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} error (queue {:?}, ring {:?}, descriptor {:?}); M2S cause 0x{:x} S2M cause 0x{:x}",
            self.kind.name(),
            self.queue,
            self.dir,
            self.index,
            self.m2s_bits,
            self.s2m_bits
        )
    }
}

impl ErrorRecord {
    /// An abort of the whole engine with no cause bit (change_state ABORT, or an injected abort).
    pub fn abort() -> ErrorRecord {
        ErrorRecord { kind: ErrorKind::Abort, queue: None, dir: None, index: None, m2s_bits: 0, s2m_bits: 0 }
    }
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

/// One UDMA engine. Aligned to two cache lines so that what its worker writes per packet (the
/// engine lock, the held-write count) shares no cache line with another engine.
#[repr(align(128))]
pub struct Engine {
    /// Engine id (hardware.rst §2.2).
    pub id: u32,
    /// Whether this engine reaches host memory (hardware.rst §2.5).
    host_ok: bool,
    opts: Options,
    /// Packets whose writes are held (unordered completion). Written by the worker only.
    held: AtomicUsize,
    state: Mutex<State>,
    cv: Condvar,
}

fn err(kind: ErrorKind, q: usize, dir: Dir, index: Option<u32>) -> ErrorRecord {
    let (m2s_bits, s2m_bits) = kind.cause_bits(dir);
    ErrorRecord { kind, queue: Some(q as u8), dir: Some(dir), index, m2s_bits, s2m_bits }
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
        }
    }

    /// Packets whose writes are held by unordered completion. Once it reads 0, what they
    /// wrote is visible (the worker lowers it after landing and publishing them).
    pub fn held_writes(&self) -> usize {
        self.held.load(Acquire)
    }

    /// Adds `d` to the held-packet count. Only the worker thread changes it, so a load and a
    /// store do (no read-modify-write).
    pub(super) fn add_held(&self, d: isize) {
        self.held.store(self.held.load(Relaxed).wrapping_add_signed(d), Release);
    }

    /// Statistics (kept under the engine lock, which the worker holds anyway when it updates
    /// them).
    pub fn counters(&self) -> CounterValues {
        self.lock().counters
    }

    /// Resets the statistics to 0.
    pub fn clear_counters(&self) {
        self.lock().counters = CounterValues::default();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Returns to power-on state; in-flight packets are dropped.
    pub fn reset(&self) {
        let mut st = self.lock();
        let epochs: Vec<u64> = st.queues.iter().map(|q| q.epoch).collect();
        let (shutdown, started, counters) = (st.shutdown, st.worker_started, st.counters);
        *st = State::new(self.opts.strict_reset);
        st.shutdown = shutdown;
        st.worker_started = started;
        st.counters = counters;
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

    /// Applies an injected abort.
    pub fn inject_abort(&self) -> ErrorRecord {
        let mut st = self.lock();
        let e = ErrorRecord::abort();
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
}
