// SPDX-License-Identifier: GPL-2.0
//! The register file of one engine: the registers' reset values, what reading and writing
//! each one does (hardware.rst §3), queue gating and doorbells, and the error/abort state
//! machine (hardware.rst §8.3).

use super::packet::RingSnap;
use super::worker::Env;
use super::{err, Dir, Engine, ErrorKind, ErrorRecord, RX_PREFETCH};
use crate::regs::{self, desc};
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// One direction of one queue (hardware.rst §8.1).
#[derive(Clone, Debug)]
pub(super) struct Ring {
    pub(super) base_lo: u32,
    pub(super) base_hi: u32,
    pub(super) len: u32,
    pub(super) cfg: u32,
    pub(super) head: u32,
    pub(super) head_rid: u32,
    pub(super) tail: u32,
    pub(super) tail_rid: u32,
    /// Descriptors between head and tail (posted, not yet consumed).
    pub(super) pending: u32,
    /// q_sw_ctrl reset seen since the last abort (recovery bookkeeping).
    pub(super) reset_since_abort: bool,
}

impl Ring {
    pub(super) fn new() -> Ring {
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

    pub(super) fn reset_pointers(&mut self) {
        self.head = 0;
        self.head_rid = 1;
        self.tail = 0;
        self.tail_rid = 1;
        self.pending = 0;
    }

    pub(super) fn base(&self) -> u64 {
        u64::from(self.base_hi) << 32 | u64::from(self.base_lo)
    }

    pub(super) fn enabled(&self) -> bool {
        self.cfg & regs::Q_CFG_ENABLE == regs::Q_CFG_ENABLE
    }

    pub(super) fn idle(&self) -> bool {
        self.pending == 0
    }

    pub(super) fn geometry_ok(&self) -> bool {
        self.base() & 0xFF == 0 && self.len.is_power_of_two() && (32..=1 << 23).contains(&self.len)
    }

    /// Consumes `n` posted descriptors (n <= pending).
    pub(super) fn advance_head(&mut self, n: u32) {
        (self.head, self.head_rid) = step(self.len, self.head, self.head_rid, n);
        self.pending -= n;
    }

    /// Posts `n` descriptors (pending + n < len).
    fn advance_tail(&mut self, n: u32) {
        (self.tail, self.tail_rid) = step(self.len, self.tail, self.tail_rid, n);
        self.pending += n;
    }

    /// This ring as a packet (or the prefetcher) sees it: base, length, head and the descriptors
    /// posted; `rid_masked`: a ring-id mismatch on it is masked from aborting.
    pub(super) fn snap(&self, dir: Dir, rid_masked: bool) -> RingSnap {
        RingSnap {
            dir,
            base: self.base(),
            len: self.len,
            head: self.head,
            rid: self.head_rid,
            pending: self.pending,
            rid_masked,
        }
    }

    pub(super) fn ptr(idx: u32, rid: u32) -> u32 {
        (idx & regs::PTR_INDEX_MASK) | (rid & desc::RING_ID_MASK) << regs::PTR_RING_ID_SHIFT
    }
}

/// Slot and ring id `n` slots after (`idx`, `rid`) on a ring of `len` slots; `n < len`, so
/// at most one wrap, which advances the ring id (hardware.rst §4.6).
pub(super) fn step(len: u32, idx: u32, rid: u32, n: u32) -> (u32, u32) {
    let next = idx + n;
    if next >= len {
        (next - len, (rid + 1) & desc::RING_ID_MASK)
    } else {
        (next, rid)
    }
}

/// One queue: Tx and Rx ring plus scheduling/fault state.
#[derive(Clone, Debug)]
pub(super) struct Queue {
    pub(super) tx: Ring,
    pub(super) rx: Ring,
    /// Incremented by every queue reset; in-flight results of an older epoch are dropped.
    pub(super) epoch: u64,
    /// The last attempt needed more descriptors: wait for the next doorbell.
    pub(super) wait_doorbell: bool,
    /// Stall fault / masked ring-id retry: do not look at this queue before then.
    pub(super) not_before: Option<Instant>,
    /// fail_nth countdown (0 = off).
    pub(super) fail_countdown: u32,
    /// Rx descriptors from the head that the prefetcher has checked (at most `rx_pref.len()`).
    pub(super) rx_checked: u32,
    /// The 16 bytes of the Rx descriptors the S2M prefetcher has read, from the head on (at most
    /// [`RX_PREFETCH`]): read at the Rx doorbell that posted them (or, beyond the window then,
    /// when the head came within it), and used by the packet that consumes them whatever the ring
    /// slot holds by then (hardware.rst §8.5; Documentation/udma-sim.rst "Rx prefetch").
    pub(super) rx_pref: VecDeque<[u8; 16]>,
}

impl Queue {
    pub(super) fn new() -> Queue {
        Queue {
            tx: Ring::new(),
            rx: Ring::new(),
            epoch: 0,
            wait_doorbell: false,
            not_before: None,
            fail_countdown: 0,
            rx_checked: 0,
            rx_pref: VecDeque::with_capacity(RX_PREFETCH as usize),
        }
    }

    /// Whether the Rx prefetcher has descriptors to check: posted, within
    /// [`super::RX_PREFETCH`] of the head, not checked yet, on an enabled Rx queue.
    pub(super) fn rx_unchecked(&self) -> bool {
        self.rx.enabled() && self.rx_checked < self.rx.pending.min(super::RX_PREFETCH)
    }

    /// Consumes `ntx` Tx and `nrx` Rx descriptors.
    pub(super) fn consume(&mut self, ntx: u32, nrx: u32) {
        self.tx.advance_head(ntx);
        self.rx.advance_head(nrx);
        self.rx_checked = self.rx_checked.saturating_sub(nrx);
        for _ in 0..nrx {
            if self.rx_pref.pop_front().is_none() {
                break;
            }
        }
    }

    /// Forgets the prefetched Rx descriptors from the `k`-th past the head on (they are read
    /// again from the ring): a check failed there, or the ring was reset.
    pub(super) fn unfetch_rx(&mut self, k: u32) {
        self.rx_pref.truncate(k as usize);
        self.rx_checked = self.rx_checked.min(k);
    }
}

/// Mutable engine state, protected by the engine lock.
pub(super) struct State {
    /// Every written register not modelled explicitly (read back as written).
    pub(super) regs: HashMap<u32, u32>,
    pub(super) m2s_state: u32,
    pub(super) s2m_state: u32,
    /// Stored int_cause of secondary A, B, C and main D.
    pub(super) cause: [u32; 4],
    pub(super) queues: Vec<Queue>,
    pub(super) error: Option<ErrorRecord>,
    pub(super) shutdown: bool,
    pub(super) worker_started: bool,
    pub(super) rr: usize,
    /// Statistics.
    pub(super) counters: crate::fault::CounterValues,
}

impl State {
    pub(super) fn new(strict_reset: bool) -> State {
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
            counters: Default::default(),
        }
    }

    pub(super) fn runnable(&self) -> bool {
        self.error.is_none()
            && self.m2s_state == regs::STATE_NORMAL
            && self.s2m_state == regs::STATE_NORMAL
            && self.reg(regs::M2S_STREAM_CFG, 0) & regs::STREAM_DISABLE == 0
            && self.reg(regs::S2M_STREAM_CFG, 0) & regs::STREAM_DISABLE == 0
    }

    /// Whether error `e` is masked by the abort masks of secondary groups A and B: it sets
    /// its cause bits but does not abort the engine (hardware.rst §3.5 `int_abort_mask`, §8.3).
    pub(super) fn abort_masked(&self, e: &ErrorRecord) -> bool {
        let a = self.reg(regs::IOFIC_SEC_A + regs::IOFIC_ABORT_MASK, 0);
        let b = self.reg(regs::IOFIC_SEC_B + regs::IOFIC_ABORT_MASK, 0);
        e.kind != ErrorKind::Abort && (e.m2s_bits | e.s2m_bits) != 0 && e.m2s_bits & !a == 0 && e.s2m_bits & !b == 0
    }

    /// Forgets the queue resets seen so far: recovery from a new abort needs new ones.
    fn forget_queue_resets(&mut self) {
        for qu in self.queues.iter_mut() {
            qu.tx.reset_since_abort = false;
            qu.rx.reset_since_abort = false;
        }
    }

    pub(super) fn reg(&self, off: u32, default: u32) -> u32 {
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

    /// Writes the 32-bit register at unit offset `unit` (hardware.rst §3, §8). `env` is the
    /// memory an Rx doorbell's prefetch reads the posted descriptors from, at once.
    pub fn write(&self, unit: u32, val: u32, env: &Env<'_>) -> WriteEffect {
        let mut st = self.lock();
        let mut fx = WriteEffect::default();
        if let Some((q, dir, r)) = bank_of(unit) {
            self.write_bank(&mut st, q, dir, r, unit, val, env, &mut fx);
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
                            st.error = Some(ErrorRecord::abort());
                            st.forget_queue_resets();
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
    fn write_bank(
        &self,
        st: &mut State,
        q: usize,
        dir: Dir,
        r: u32,
        unit: u32,
        val: u32,
        env: &Env<'_>,
        fx: &mut WriteEffect,
    ) {
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
            regs::Q_DOORBELL => {
                self.doorbell(st, q, dir, val & regs::PTR_INDEX_MASK, fx);
                // The prefetcher of a stopped engine (aborted, disabled, stream off) reads
                // nothing; the worker reads the descriptors once it runs again.
                if dir == Dir::Rx && fx.kick && st.runnable() {
                    self.prefetch_posted(&mut st.queues[q], q, env);
                }
            }
            _ if r == sw_ctrl => {
                if val & regs::Q_SW_CTRL_RESET != 0 {
                    ring.reset_pointers();
                    ring.reset_since_abort = true;
                    if dir == Dir::Rx {
                        qu.unfetch_rx(0);
                    }
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
        st.forget_queue_resets();
        for qu in st.queues.iter_mut() {
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
        ring.advance_tail(n);
        qu.wait_doorbell = false;
        fx.kick = true;
    }

    /// The S2M prefetcher at an Rx doorbell of a running engine: reads, at once, the posted Rx
    /// descriptors of queue `q` within [`RX_PREFETCH`] of the head that it has not read yet, and
    /// keeps their bytes; the packets that consume them use these bytes, so a slot the host
    /// rewrites after the doorbell does not change where the data goes (silicon's prefetcher
    /// reads the descriptors it was told about). It stops at the first slot it cannot read (bus
    /// mastering off, an unmapped or unreachable ring): the worker reads that one later and
    /// reports the error. The checks (ring id, undefined bits, destination) are the worker's
    /// ([`Engine::prefetch_rx`]).
    fn prefetch_posted(&self, qu: &mut Queue, q: usize, env: &Env<'_>) {
        let r = qu.rx.snap(Dir::Rx, false);
        let end = r.pending.min(RX_PREFETCH);
        let mut buf = [[0u8; 16]; RX_PREFETCH as usize];
        while (qu.rx_pref.len() as u32) < end {
            let k = qu.rx_pref.len() as u32;
            // The slots up to the ring's end in one read; slot by slot if that fails, to stop at
            // the first that cannot be read.
            let n = (end - k).min(r.len - r.slot(k).0) as usize;
            if self.read_slots(env, &r, k, &mut buf[..n]) {
                qu.rx_pref.extend(&buf[..n]);
                continue;
            }
            match self.read_slot(env, q, &r, k) {
                Ok(d) => qu.rx_pref.push_back(d.raw),
                Err(_) => break,
            }
        }
    }

    /// Reports error `e` (hardware.rst §8.3): sets its cause bits and, unless the abort masks mask
    /// it, aborts the engine (state fields = 2). Returns whether the engine aborted.
    pub(super) fn raise(&self, st: &mut State, e: ErrorRecord) -> bool {
        let new_bits = st.cause[0] & e.m2s_bits != e.m2s_bits || st.cause[1] & e.s2m_bits != e.s2m_bits;
        st.cause[0] |= e.m2s_bits;
        st.cause[1] |= e.s2m_bits;
        if st.abort_masked(&e) {
            if new_bits {
                log::warn!("engine {}: {e}; masked by the abort mask, no abort", self.id);
            }
            return false;
        }
        st.m2s_state = regs::STATE_ABORT;
        st.s2m_state = regs::STATE_ABORT;
        if st.error.is_none() {
            st.error = Some(e);
        }
        st.forget_queue_resets();
        st.counters.errors += 1;
        log::warn!("engine {}: {e}; engine aborted", self.id);
        true
    }
}
