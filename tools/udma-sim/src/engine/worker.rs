// SPDX-License-Identifier: GPL-2.0
//! The worker thread of one engine: picks the next runnable queue (round robin, honouring
//! stalls and queue gating), runs one packet on it outside the engine lock and applies the
//! outcome (hardware.rst §3.4, §8.3).

use super::packet::{Outcome, Scratch, Snapshot};
use super::regfile::State;
use super::transfer::HeldQueue;
use super::{Dir, Engine, ErrorKind, ErrorRecord};
use crate::layout::Gen;
use crate::mem::{GuestMemory, MemReader};
use crate::regs::{self, m2s_cause, s2m_cause};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU32};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

/// Retry interval of a queue stalled on a masked ring-id mismatch (V3 SENG).
const RINGID_RETRY: Duration = Duration::from_millis(1);

/// Looks at a queue again after [`RINGID_RETRY`], or when its injected stall ends if that is
/// later: a retry that the worker started before a stall was injected must not cut the stall
/// short (it did: a stalled queue's copies then ran at once).
fn retry_later(not_before: &mut Option<Instant>) {
    let retry = Instant::now() + RINGID_RETRY;
    *not_before = Some(not_before.map_or(retry, |t| t.max(retry)));
}

/// Minimum per-packet base time used by the slow-down fault.
const SLOW_BASE: Duration = Duration::from_micros(20);
/// Bytes per microsecond of the slow-down fault's nominal copy rate (4 GB/s): a packet's base
/// time is its bytes at this rate, at least [`SLOW_BASE`] (64 KiB: 16 us, so 20 us).
const SLOW_BYTES_PER_US: u64 = 4_000;

/// The slow-down fault's base time of a packet of `bytes` bytes, which the delay multiplies.
/// Nominal, not the packet's measured copy time: a host scheduling hiccup of 0.5 ms inside one
/// packet then made a factor of 2,000 delay it by a whole second.
fn slow_base(bytes: u64) -> Duration {
    Duration::from_micros(bytes.div_ceil(SLOW_BYTES_PER_US)).max(SLOW_BASE)
}

/// Memories and settings the worker needs for one packet.
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

/// What an engine worker thread reaches, borrowed from the device for the thread's whole life:
/// nothing in it is cloned or locked per packet. Host memory is the worker's own
/// [`MemReader`] (for the vfio-user DMA map, a snapshot renewed only when the map changes).
pub struct Memories<'a> {
    /// Architecture (address decoding).
    pub gen: Gen,
    /// Host (guest RAM) address space, this worker's view.
    pub host: Box<dyn MemReader + 'a>,
    /// Device memory (HBM / BAR4).
    pub hbm: &'a dyn GuestMemory,
    /// PCI bus-master enable (read once per packet).
    pub bus_master: &'a AtomicBool,
    /// Slow-down factor (read once per packet).
    pub slow: &'a AtomicU32,
    /// Trace sink, if enabled.
    pub trace: Option<&'a crate::trace::Tracer>,
}

impl Memories<'_> {
    /// The environment of one packet (or one landing of held writes): enters the host reader,
    /// which renews its view if the memory map changed since the last packet.
    pub fn env(&mut self) -> Env<'_> {
        self.host.enter();
        Env {
            gen: self.gen,
            host: &*self.host,
            hbm: self.hbm,
            bus_master: self.bus_master.load(Relaxed),
            slow: self.slow.load(Relaxed),
            trace: self.trace,
        }
    }

    /// The worker is about to block: it touches no host memory until the next [`Memories::env`]
    /// (a DMA map update does not wait for it meanwhile).
    pub fn idle(&mut self) {
        self.host.leave();
    }
}

impl Engine {
    /// Worker thread body: processes packets until [`Engine::shutdown`]. The bus-master bit and
    /// the slow factor are read for every packet.
    pub fn run(&self, mem: &mut Memories<'_>, on_error: &dyn Fn(ErrorRecord)) {
        let mut scratch = Scratch::default();
        // Writes held by unordered completion, per queue, oldest first. Only this thread
        // touches them, so they land in the order the barriers require.
        let mut held: Vec<HeldQueue> = (0..regs::QUEUES_PER_ENGINE).map(|_| HeldQueue::default()).collect();
        let mut epochs = [0u64; regs::QUEUES_PER_ENGINE];
        let mut idle = [false; regs::QUEUES_PER_ENGINE];
        let mut st = self.lock();
        loop {
            if st.shutdown {
                return;
            }
            let now = Instant::now();
            for ((e, i), qu) in epochs.iter_mut().zip(idle.iter_mut()).zip(&st.queues) {
                *e = qu.epoch;
                *i = qu.tx.pending == 0;
            }
            if held.iter().zip(&epochs).any(|(h, &e)| h.due(now, e)) {
                drop(st);
                let e = mem.env();
                for ((h, &ep), &i) in held.iter_mut().zip(&epochs).zip(&idle) {
                    self.land(&e, h, Some(now), ep, i);
                }
                st = self.lock();
                continue;
            }
            let mut deadline: Option<Instant> = held.iter().filter_map(HeldQueue::next_due).min();
            let mut pick = None;
            if st.runnable() {
                // The prefetcher issues no descriptor read while bus mastering is off; the
                // packet's own fetch reports that (bus_master_off).
                let bus_master = mem.bus_master.load(Relaxed);
                for i in 0..regs::QUEUES_PER_ENGINE {
                    let q = (st.rr + i) % regs::QUEUES_PER_ENGINE;
                    let qu = &mut st.queues[q];
                    let prefetch = bus_master && qu.rx_unchecked();
                    // A queue runs only while both directions have both enable bits set, at
                    // every fetch, not just at doorbell time (hardware.rst §3.4, §3.8 queue pause).
                    let packet = qu.tx.pending > 0 && !qu.wait_doorbell && qu.tx.enabled() && qu.rx.enabled();
                    if !prefetch && !packet {
                        continue;
                    }
                    if let Some(t) = qu.not_before {
                        if t > now {
                            deadline = Some(deadline.map_or(t, |d: Instant| d.min(t)));
                            continue;
                        }
                        qu.not_before = None;
                    }
                    pick = Some((q, prefetch, packet));
                    break;
                }
            }
            let Some((q, prefetch, packet)) = pick else {
                // Blocking: leave host memory first, so that a DMA map update need not wait.
                mem.idle();
                st = match deadline {
                    Some(t) => {
                        let d = t.saturating_duration_since(now);
                        self.cv.wait_timeout(st, d).unwrap_or_else(|e| e.into_inner()).0
                    }
                    None => self.cv.wait(st).unwrap_or_else(|e| e.into_inner()),
                };
                continue;
            };
            let snap = self.snapshot(&st, q);
            scratch.take_prefetched(&st.queues[q].rx_pref);
            drop(st);
            let (pre, outcome, slow) = {
                let e = mem.env();
                // The Rx prefetcher runs before the queue's next packet (it was kicked by the Rx
                // doorbell, which comes first), so its errors are the first ones reported; a
                // packet runs only if it found nothing.
                let pre = prefetch.then(|| self.prefetch_rx(&e, &snap, &mut scratch));
                let mut outcome = None;
                if packet && pre.as_ref().is_none_or(|p| p.stop.is_none()) {
                    let mut o = self.process(&e, &snap, &mut scratch);
                    if let Outcome::Done { bytes, dmb, wb, .. } = o {
                        if let Err(rec) = self.move_data(&e, &snap, &mut scratch, &mut held[q], bytes, dmb, wb) {
                            o = Outcome::Error(rec);
                        }
                    }
                    if let Outcome::Done { ntx, .. } | Outcome::Poisoned { ntx, .. } = o {
                        // The queue's last posted packet: it goes idle.
                        if ntx == snap.tx.pending {
                            self.settle_idle(&e, &mut held[q], snap.epoch);
                        }
                    }
                    outcome = Some(o);
                }
                (pre, outcome, e.slow)
            };
            if let (true, Some(Outcome::Done { bytes, .. })) = (slow > 1, &outcome) {
                mem.idle();
                std::thread::sleep(slow_base(*bytes) * (slow - 1));
            }
            st = self.lock();
            st.rr = q + 1;
            if st.queues[q].epoch != snap.epoch {
                continue; // queue reset while in flight: drop the result
            }
            if let Some(p) = pre {
                // Counted from the head of the snapshot: only this thread moves the head (an Rx
                // doorbell meanwhile may have read more descriptors: those are kept).
                let qu = &mut st.queues[q];
                if p.stop.is_some() {
                    qu.unfetch_rx(p.checked);
                } else if let Some(more) = scratch.rx_new.get(qu.rx_pref.len().saturating_sub(scratch.rx_qlen)..) {
                    qu.rx_pref.extend(more);
                }
                qu.rx_checked = p.checked;
                if let Some(rec) = p.masked {
                    self.raise(&mut st, rec);
                }
                match p.stop {
                    Some(Outcome::Retry) => retry_later(&mut st.queues[q].not_before),
                    Some(Outcome::Error(rec)) => st = self.report(st, q, rec, on_error),
                    _ => {}
                }
            }
            let Some(outcome) = outcome else { continue };
            match outcome {
                Outcome::Done { ntx, nrx, bytes, .. } => {
                    let qu = &mut st.queues[q];
                    qu.consume(ntx, nrx);
                    if qu.fail_countdown > 0 {
                        qu.fail_countdown -= ntx.min(qu.fail_countdown);
                    }
                    st.counters.descriptors += u64::from(ntx + nrx);
                    st.counters.packets += 1;
                    st.counters.bytes += bytes;
                    if let Some(t) = mem.trace {
                        t.record(&scratch.recs);
                    }
                }
                Outcome::Poisoned { ntx, nrx, rec } => {
                    if rec.kind == ErrorKind::InjectedFail {
                        st.queues[q].fail_countdown = 0;
                    }
                    self.raise(&mut st, rec);
                    st.queues[q].consume(ntx, nrx);
                    st.counters.descriptors += u64::from(ntx + nrx);
                }
                Outcome::NeedDoorbell => st.queues[q].wait_doorbell = true,
                Outcome::Retry => retry_later(&mut st.queues[q].not_before),
                Outcome::Error(rec) => {
                    if rec.kind == ErrorKind::InjectedFail {
                        st.queues[q].fail_countdown = 0;
                    }
                    st = self.report(st, q, rec, on_error);
                }
            }
        }
    }

    /// Reports error `rec` of queue `q` found by the worker: aborts the engine and tells
    /// `on_error` (outside the lock), or, when the abort masks mask it, stalls the queue (cause
    /// bits set, retried every [`RINGID_RETRY`]) as the prefetcher does on hardware when a packet
    /// cannot be delimited or moved.
    fn report<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
        q: usize,
        rec: ErrorRecord,
        on_error: &dyn Fn(ErrorRecord),
    ) -> MutexGuard<'a, State> {
        if self.raise(&mut st, rec) {
            drop(st);
            on_error(rec);
            self.lock()
        } else {
            retry_later(&mut st.queues[q].not_before);
            st
        }
    }

    fn snapshot(&self, st: &State, q: usize) -> Snapshot {
        let qu = &st.queues[q];
        let cfg_len = st.regs.get(&regs::M2S_CFG_LEN).copied();
        let abort_mask_a = st.reg(regs::IOFIC_SEC_A + regs::IOFIC_ABORT_MASK, 0);
        let abort_mask_b = st.reg(regs::IOFIC_SEC_B + regs::IOFIC_ABORT_MASK, 0);
        let max = st.reg(regs::M2S_DESC_PREF_CFG_2, regs::DEFAULT_MAX_DESCS) & regs::MAX_DESCS_MASK;
        Snapshot {
            q,
            epoch: qu.epoch,
            tx: qu.tx.snap(Dir::Tx, abort_mask_a & m2s_cause::RING_ID != 0),
            rx: qu.rx.snap(Dir::Rx, abort_mask_b & s2m_cause::RING_ID != 0),
            max_descs: if max == 0 && !self.opts.strict_reset { regs::DEFAULT_MAX_DESCS } else { max },
            len0_is_64k: cfg_len.is_none_or(|v| v & regs::CFG_LEN_64K != 0),
            max_pkt: cfg_len.map(|v| v & regs::CFG_LEN_MAX_MASK),
            abort_mask_a,
            abort_mask_b,
            fail_countdown: qu.fail_countdown,
            rx_checked: qu.rx_checked,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slow_base_is_nominal() {
        // 20 us up to 80,000 bytes (a 64 KiB packet: a factor of 2,000 makes it 40 ms), then
        // the bytes at 4 GB/s, rounded up to whole microseconds.
        assert_eq!(slow_base(4), Duration::from_micros(20));
        assert_eq!(slow_base(65_536), Duration::from_micros(20));
        assert_eq!(slow_base(80_000), Duration::from_micros(20));
        assert_eq!(slow_base(80_001), Duration::from_micros(21));
        assert_eq!(slow_base(1 << 20), Duration::from_micros(263));
        assert_eq!(slow_base(65_536) * 1_999, Duration::from_micros(39_980));
    }

    #[test]
    fn a_retry_keeps_a_longer_stall() {
        let stall = Instant::now() + Duration::from_secs(1);
        let mut nb = Some(stall);
        retry_later(&mut nb);
        assert_eq!(nb, Some(stall));
        // Without a stall, or once it is over, the retry interval.
        for mut nb in [None, Some(Instant::now() - Duration::from_secs(1))] {
            let before = Instant::now();
            retry_later(&mut nb);
            let t = nb.expect("a retry");
            assert!(t >= before + RINGID_RETRY && t <= Instant::now() + RINGID_RETRY);
        }
    }
}
