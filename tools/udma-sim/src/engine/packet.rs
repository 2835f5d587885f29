// SPDX-License-Identifier: GPL-2.0
//! Packet processing: the checked descriptor fetch shared by the Tx and Rx rings, and the
//! rules a packet must follow (hardware.rst §3.5, §4, §8.2).

use super::regfile::step;
use super::worker::Env;
use super::{err, Dir, Engine, ErrorKind, ErrorRecord};
use crate::layout::Target;
use crate::regs::desc;
use crate::trace::TraceRec;

/// Rx descriptors the S2M prefetcher reads (and checks) ahead of the head, up to the tail
/// (hardware.rst §3.5 S2M cause 11, §8.5).
pub const RX_PREFETCH: u32 = 64;

/// Immutable per-packet inputs taken from the engine state under the lock.
pub(super) struct Snapshot {
    pub(super) q: usize,
    pub(super) epoch: u64,
    pub(super) tx: RingSnap,
    pub(super) rx: RingSnap,
    pub(super) max_descs: u32,
    pub(super) len0_is_64k: bool,
    pub(super) max_pkt: Option<u32>,
    pub(super) abort_mask_a: u32,
    pub(super) abort_mask_b: u32,
    pub(super) fail_countdown: u32,
    /// Rx descriptors from the head the prefetcher has checked already.
    pub(super) rx_checked: u32,
}

impl Snapshot {
    /// Length of a descriptor whose len_ctrl is `w0` (0 = 65536 with cfg_len bit 24).
    fn dlen(&self, w0: u32) -> u32 {
        match w0 & desc::LEN_MASK {
            0 if self.len0_is_64k => 65536,
            l => l,
        }
    }

    /// Whether `e` is masked from aborting (as `State::abort_masked`).
    pub(super) fn masked(&self, e: &ErrorRecord) -> bool {
        (e.m2s_bits | e.s2m_bits) != 0 && e.m2s_bits & !self.abort_mask_a == 0 && e.s2m_bits & !self.abort_mask_b == 0
    }
}

/// One ring of the queue a packet runs on, as it was when the packet started.
#[derive(Clone, Copy)]
pub(super) struct RingSnap {
    /// Which ring.
    pub(super) dir: Dir,
    /// Ring base (bus address).
    pub(super) base: u64,
    /// Ring length, descriptors.
    pub(super) len: u32,
    /// Slot of the next descriptor to consume.
    pub(super) head: u32,
    /// Ring id expected at the head slot.
    pub(super) rid: u32,
    /// Descriptors posted by doorbells and not consumed yet.
    pub(super) pending: u32,
    /// A ring-id mismatch on this ring is masked from aborting: the queue retries instead.
    pub(super) rid_masked: bool,
}

impl RingSnap {
    /// Slot index and expected ring id of the descriptor `k` slots past the head.
    pub(super) fn slot(&self, k: u32) -> (u32, u32) {
        step(self.len, self.head, self.rid, k)
    }
}

/// A buffer segment of a packet.
#[derive(Clone, Copy)]
pub(super) struct Seg {
    pub(super) target: Target,
    pub(super) len: u32,
}

/// Result of processing one packet.
pub(super) enum Outcome {
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

/// One descriptor read from a ring, with its slot index.
pub(super) struct Fetched {
    /// Slot index.
    pub(super) idx: u32,
    /// The descriptor's 16 bytes, in memory order.
    pub(super) raw: [u8; 16],
}

impl Fetched {
    /// Word 0: len_ctrl.
    fn w0(&self) -> u32 {
        u32::from_le_bytes([self.raw[0], self.raw[1], self.raw[2], self.raw[3]])
    }

    /// Word 1: meta_ctrl.
    fn w1(&self) -> u32 {
        u32::from_le_bytes([self.raw[4], self.raw[5], self.raw[6], self.raw[7]])
    }

    /// Words 2-3: buffer address.
    fn addr(&self) -> u64 {
        let r = &self.raw;
        u64::from_le_bytes([r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]])
    }

    /// The ring id (phase) the driver wrote into the descriptor.
    fn ring_id(&self) -> u32 {
        (self.w0() >> desc::RING_ID_SHIFT) & desc::RING_ID_MASK
    }
}

/// Records data error `e` of a packet: it aborts the packet unless the abort masks mask it; a
/// masked one poisons the packet (the first is kept), which is still delimited and consumed but
/// writes nothing (hardware.rst §8.3).
fn data_error(s: &Snapshot, poison: &mut Option<ErrorRecord>, e: ErrorRecord) -> Result<(), Outcome> {
    if !s.masked(&e) {
        return Err(Outcome::Error(e));
    }
    poison.get_or_insert(e);
    Ok(())
}

/// Reusable per-worker buffers (no allocation per descriptor).
#[derive(Default)]
pub struct Scratch {
    pub(super) tx: Vec<Seg>,
    pub(super) rx: Vec<Seg>,
    pub(super) recs: Vec<TraceRec>,
    /// The first of the queue's prefetched Rx descriptors (`Queue::rx_pref`) as the packet
    /// started, from the head on: [`RX_COPY`] up front, the others copied when needed
    /// ([`Scratch::prefetched`]).
    pub(super) rx_pref: Vec<[u8; 16]>,
    /// How many prefetched Rx descriptors the queue had as the packet started.
    pub(super) rx_qlen: usize,
    /// The Rx descriptors this worker's prefetch pass read from the ring, for the slots from
    /// `rx_qlen` on (the worker adds them to the queue's).
    pub(super) rx_new: Vec<[u8; 16]>,
}

/// Prefetched Rx descriptors copied for a packet up front (a kernel packet takes one); a packet
/// that needs more copies the rest then.
pub(super) const RX_COPY: usize = 4;

impl Scratch {
    /// Adds `d` of ring `tx`/rx to the trace records of the packet, when tracing.
    fn trace(&mut self, env: &Env<'_>, engine: u32, q: usize, tx: bool, d: &Fetched) {
        if env.trace.is_some() {
            self.recs.push(TraceRec { engine, queue: q as u8, tx, index: d.idx, raw: d.raw });
        }
    }

    /// Starts a packet on a queue whose prefetched Rx descriptors are `pref`.
    pub(super) fn take_prefetched(&mut self, pref: &std::collections::VecDeque<[u8; 16]>) {
        self.rx_pref.clear();
        self.rx_pref.extend(pref.iter().take(RX_COPY));
        self.rx_qlen = pref.len();
        self.rx_new.clear();
    }

    /// The bytes the prefetcher read for the Rx descriptor `k` slots past the head, if it read
    /// that slot: copied from the queue of `engine` (under its lock) when not copied yet; only
    /// this worker removes prefetched descriptors, so they are still the queue's (unless a queue
    /// reset dropped them, and with them this packet's result).
    fn prefetched(&mut self, engine: &Engine, q: usize, k: u32) -> Option<[u8; 16]> {
        let k = k as usize;
        if k >= self.rx_pref.len() && k < self.rx_qlen {
            let st = engine.lock();
            let have = self.rx_pref.len();
            self.rx_pref.extend(st.queues[q].rx_pref.iter().take(self.rx_qlen).skip(have));
        }
        match self.rx_pref.get(k) {
            Some(&raw) => Some(raw),
            None => k.checked_sub(self.rx_qlen).and_then(|i| self.rx_new.get(i)).copied(),
        }
    }
}

/// What a pass of the Rx prefetcher over a queue found.
pub(super) struct Prefetched {
    /// Descriptors from the head checked now (the pass's start included).
    pub(super) checked: u32,
    /// A masked data-write error found on the way: its cause bits are to be set; the packet
    /// that consumes the descriptor writes nothing (hardware.rst §8.3).
    pub(super) masked: Option<ErrorRecord>,
    /// Why the pass stopped before the end of its window: an error, or a masked ring-id
    /// mismatch to retry ([`Outcome::Retry`]).
    pub(super) stop: Option<Outcome>,
}

impl Engine {
    /// Reads the descriptor `k` slots past the head of ring `r` of queue `q`, without checking
    /// it. Fails with [`Outcome::NeedDoorbell`] when fewer than `k + 1` descriptors are posted,
    /// and with a `bus_master_off` or `desc_fetch` error when the slot cannot be read.
    pub(super) fn read_slot(&self, env: &Env<'_>, q: usize, r: &RingSnap, k: u32) -> Result<Fetched, Outcome> {
        if k >= r.pending {
            return Err(Outcome::NeedDoorbell);
        }
        let (idx, _) = r.slot(k);
        let fail = |kind| Outcome::Error(err(kind, q, r.dir, Some(idx)));
        if !env.bus_master {
            return Err(fail(ErrorKind::BusMasterOff));
        }
        let mut raw = [0u8; 16];
        let addr = r.base.wrapping_add(u64::from(idx) * desc::SIZE);
        let ok = match env.gen.decode_addr(addr) {
            Some(Target::Host(a)) => self.host_ok && env.host.read(a, &mut raw),
            Some(Target::Device(a)) => env.hbm.read(a, &mut raw),
            None => false,
        };
        if !ok {
            return Err(fail(ErrorKind::DescFetch));
        }
        Ok(Fetched { idx, raw })
    }

    /// Reads `out.len()` descriptors from `k` slots past the head of ring `r` on, contiguous in
    /// the ring (not wrapping), in one read; `false` if they are not all posted or not all
    /// readable ([`Engine::read_slot`] tells which and why).
    pub(super) fn read_slots(&self, env: &Env<'_>, r: &RingSnap, k: u32, out: &mut [[u8; 16]]) -> bool {
        let (idx, _) = r.slot(k);
        if u64::from(k) + out.len() as u64 > u64::from(r.pending)
            || u64::from(idx) + out.len() as u64 > u64::from(r.len)
            || !env.bus_master
        {
            return false;
        }
        let addr = r.base.wrapping_add(u64::from(idx) * desc::SIZE);
        match env.gen.decode_addr(addr) {
            Some(Target::Host(a)) => self.host_ok && env.host.read(a, out.as_flattened_mut()),
            Some(Target::Device(a)) => env.hbm.read(a, out.as_flattened_mut()),
            None => false,
        }
    }

    /// The ring-id check of descriptor `d`, read `k` slots past the head of ring `r`: a
    /// `ring_id` error (or [`Outcome::Retry`] when the abort mask masks it) when its ring id is not
    /// the one expected at that slot (hardware.rst §3.5, §4.6).
    fn check_ring_id(q: usize, r: &RingSnap, k: u32, d: Fetched) -> Result<Fetched, Outcome> {
        if d.ring_id() != r.slot(k).1 {
            return Err(if r.rid_masked {
                Outcome::Retry
            } else {
                Outcome::Error(err(ErrorKind::RingId, q, r.dir, Some(d.idx)))
            });
        }
        Ok(d)
    }

    /// The checked descriptor fetch of both rings: [`Engine::read_slot`], then the ring-id check.
    fn fetch(&self, env: &Env<'_>, q: usize, r: &RingSnap, k: u32) -> Result<Fetched, Outcome> {
        let d = self.read_slot(env, q, r, k)?;
        Self::check_ring_id(q, r, k, d)
    }

    /// The Rx descriptor `k` slots past the head, checked: the bytes the prefetcher read if it
    /// read that slot ([`Scratch::prefetched`]), else read from the ring now.
    fn fetch_rx(&self, env: &Env<'_>, s: &Snapshot, sc: &mut Scratch, k: u32) -> Result<Fetched, Outcome> {
        match sc.prefetched(self, s.q, k) {
            Some(raw) => Self::check_ring_id(s.q, &s.rx, k, Fetched { idx: s.rx.slot(k).0, raw }),
            None => self.fetch(env, s.q, &s.rx, k),
        }
    }

    /// Checks the next packet of the snapshot's queue: its Tx descriptors (FIRST..LAST) and the
    /// Rx descriptors that take its bytes. The segments to move are left in `sc`.
    pub(super) fn process(&self, env: &Env<'_>, s: &Snapshot, sc: &mut Scratch) -> Outcome {
        sc.tx.clear();
        sc.rx.clear();
        sc.recs.clear();
        match self.check_packet(env, s, sc) {
            Ok(o) | Err(o) => o,
        }
    }

    fn check_packet(&self, env: &Env<'_>, s: &Snapshot, sc: &mut Scratch) -> Result<Outcome, Outcome> {
        let q = s.q;
        let mut poison: Option<ErrorRecord> = None;
        let (mut dmb, mut wb) = (false, false);
        // ---- Tx: collect FIRST..LAST ----
        let mut total: u64 = 0;
        let mut k = 0u32;
        loop {
            let d = self.fetch(env, q, &s.tx, k)?;
            let (w0, w1) = (d.w0(), d.w1());
            let fail = |kind| Err(Outcome::Error(err(kind, q, Dir::Tx, Some(d.idx))));
            if k == 0 && w0 & desc::FIRST == 0 {
                return fail(ErrorKind::BadFirst);
            }
            if k > 0 && w0 & desc::FIRST != 0 {
                return fail(ErrorKind::BadLast);
            }
            if k + 1 > s.max_descs {
                return fail(ErrorKind::TooManyDescs);
            }
            if w0 & (desc::META | desc::CONCAT | desc::TX_UNDEFINED) != 0
                || (w1 != desc::META_COPY && w1 != desc::META_COPY_WB)
            {
                return fail(ErrorKind::Unsupported);
            }
            dmb |= w0 & desc::DMB != 0;
            wb |= w1 & desc::META_WB != 0;
            let len = s.dlen(w0);
            let bad = if s.fail_countdown == k + 1 {
                Some(ErrorKind::InjectedFail)
            } else {
                match env.gen.decode_addr(d.addr()) {
                    Some(t) if self.mapped(env, t, len) => None,
                    _ => Some(ErrorKind::DataRead),
                }
            };
            if let Some(kind) = bad {
                data_error(s, &mut poison, err(kind, q, Dir::Tx, Some(d.idx)))?;
            }
            let target = env.gen.decode_addr(d.addr()).unwrap_or(Target::Device(0));
            total += u64::from(len);
            sc.tx.push(Seg { target, len });
            sc.trace(env, self.id, q, true, &d);
            k += 1;
            if w0 & desc::LAST != 0 {
                break;
            }
        }
        if s.max_pkt.is_some_and(|m| total > u64::from(m)) {
            let (idx, _) = s.tx.slot(0);
            return Err(Outcome::Error(err(ErrorKind::PktTooLong, q, Dir::Tx, Some(idx))));
        }
        // ---- Rx: consume descriptors until the packet's bytes are placed ----
        let mut placed: u64 = 0;
        let mut j = 0u32;
        while placed < total {
            let d = self.fetch_rx(env, s, sc, j)?;
            let (len, target) = self.check_rx(env, s, &d, Some(total - placed), &mut poison)?;
            placed += u64::from(len);
            sc.rx.push(Seg { target, len });
            sc.trace(env, self.id, q, false, &d);
            j += 1;
        }
        if let Some(rec) = poison {
            return Ok(Outcome::Poisoned { ntx: k, nrx: j, rec });
        }
        Ok(Outcome::Done { ntx: k, nrx: j, bytes: total, dmb, wb })
    }

    /// The checks of Rx descriptor `d`: no undefined len_ctrl bit (`unsupported`); with `room`
    /// (the bytes of the packet still to place), a length that is not 0 and ends within the
    /// packet (`len_mismatch`); a destination mapped for its whole length (`data_write`; when
    /// masked, kept in `poison`: the descriptor is consumed, its packet writes nothing). Returns
    /// the length and the destination.
    fn check_rx(
        &self,
        env: &Env<'_>,
        s: &Snapshot,
        d: &Fetched,
        room: Option<u64>,
        poison: &mut Option<ErrorRecord>,
    ) -> Result<(u32, Target), Outcome> {
        let w0 = d.w0();
        let fail = |kind| Err(Outcome::Error(err(kind, s.q, Dir::Rx, Some(d.idx))));
        if w0 & desc::RX_UNDEFINED != 0 {
            return fail(ErrorKind::Unsupported);
        }
        let len = s.dlen(w0);
        if room.is_some_and(|room| u64::from(len) > room || len == 0) {
            return fail(ErrorKind::LenMismatch);
        }
        let target = match env.gen.decode_addr(d.addr()) {
            Some(t) if self.mapped(env, t, len) => t,
            _ => {
                data_error(s, poison, err(ErrorKind::DataWrite, s.q, Dir::Rx, Some(d.idx)))?;
                Target::Device(0)
            }
        };
        Ok((len, target))
    }

    /// The S2M prefetcher's checks (hardware.rst §3.5, §8.5): takes the Rx descriptors posted
    /// ahead of the head, from the first one not checked yet up to the tail (at most
    /// [`RX_PREFETCH`] past the head), and checks each as [`Engine::check_rx`] does without a
    /// packet: ring id, undefined bits, destination mapped for the descriptor's length. A
    /// descriptor the Rx doorbell read is taken as read; one it did not (beyond the window then,
    /// or not readable) is read now and kept in `sc.rx_new`. The worker runs it when Rx
    /// descriptors are posted (the Rx doorbell) and as the head moves, before the queue's next
    /// packet, so a bad Rx descriptor is reported even when no Tx packet comes. A descriptor
    /// that fails is not kept (it is read again from the ring).
    pub(super) fn prefetch_rx(&self, env: &Env<'_>, s: &Snapshot, sc: &mut Scratch) -> Prefetched {
        let end = s.rx.pending.min(RX_PREFETCH);
        let mut p = Prefetched { checked: s.rx_checked, masked: None, stop: None };
        while p.checked < end {
            let k = p.checked;
            let r = match sc.prefetched(self, s.q, k) {
                Some(raw) => Ok(Fetched { idx: s.rx.slot(k).0, raw }),
                None => self.read_slot(env, s.q, &s.rx, k).inspect(|d| sc.rx_new.push(d.raw)),
            };
            let r = r
                .and_then(|d| Self::check_ring_id(s.q, &s.rx, k, d))
                .and_then(|d| self.check_rx(env, s, &d, None, &mut p.masked));
            if let Err(o) = r {
                sc.rx_new.truncate((k as usize).saturating_sub(sc.rx_qlen));
                p.stop = Some(o);
                break;
            }
            p.checked += 1;
        }
        p
    }

    fn mapped(&self, env: &Env<'_>, t: Target, len: u32) -> bool {
        env.bus_master
            && match t {
                Target::Host(a) => self.host_ok && env.host.is_mapped(a, len as usize),
                Target::Device(a) => env.hbm.is_mapped(a, len as usize),
            }
    }
}
