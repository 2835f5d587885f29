// SPDX-License-Identifier: GPL-2.0
//! Moving the bytes of a checked packet, with its barriers: the writes unordered completion
//! holds, the write-barrier fence, and the device-memory writes a queue has not published yet
//! (hardware.rst §4.2, §4.3, §4.4, §5.1, §8.2).
//!
//! Per queue, with unordered completion on (`Options::unordered_delay`):
//!
//! * a packet with neither DMB nor write barrier longer than [`POSTED_WRITE_MAX`] bytes is
//!   **held**: its source is read when it runs, its writes land later ([`HeldQueue`], oldest
//!   first);
//! * a **DMB** packet (len_ctrl bit 30: wait for all earlier transfers of the queue) lands every
//!   held write and publishes every pending device write (below) before it moves a byte, so it
//!   and the queue's later packets read every earlier write;
//! * a **write-barrier** packet (meta_ctrl bit 26, without DMB) lands its own writes at once,
//!   without waiting for the held writes of earlier packets; it puts a **fence** after them: they
//!   land before any write of a later packet lands, and the queue's pending device writes are
//!   published before any later write lands in host memory. Until then (or a DMB, or the delay)
//!   they stay held, so a marker that has only the write barrier can be seen before the earlier
//!   data;
//! * every other packet (short, or with a barrier) writes at once, after the fenced writes;
//! * a write to **device memory** (HBM), when it lands, is **pending** ([`Pending`]): the new
//!   bytes are kept by the queue, and device memory (what other queues and engines read, and the
//!   CPU through BAR4) keeps the old ones until the queue **publishes** them, oldest first: at a
//!   later DMB packet of the queue, when the queue is idle (no Tx descriptor posted, nothing
//!   held) after a packet, before a later host write if a write barrier came after them, after
//!   the delay, or when the queue has too many. A read of device memory by a packet of the queue
//!   without DMB does not see them either (unless `Options::unordered_device_reads` is off). A
//!   read of **host** memory that overlaps held writes lands them first.

use super::packet::{Scratch, Seg, Snapshot};
use super::worker::Env;
use super::{err, Dir, Engine, ErrorKind, ErrorRecord};
use crate::layout::Target;
use crate::mem::{self, GuestMemory};
use std::collections::VecDeque;
use std::time::Instant;

/// Longest packet, in bytes, whose writes are never held by unordered completion: one
/// 64-byte write burst (a 4-byte completion marker is one) overtakes longer writes still in
/// flight.
pub const POSTED_WRITE_MAX: u64 = 64;
/// Bytes of held writes per queue above which the oldest land early (bounds model memory and
/// keeps the staging buffers cache-sized; the newest packet stays held, so a barrier-free
/// marker still overtakes it).
const HELD_BYTES_MAX: usize = 4 << 20;
/// Bytes of landed buffers a queue keeps for reuse.
const HELD_POOL_MAX: usize = 8 << 20;
/// Segment lists a queue keeps for reuse.
const HELD_SEG_POOL: usize = 4096;
/// Bytes of pending (unpublished) device-memory writes a queue keeps; above it the oldest are
/// published early.
const PENDING_BYTES_MAX: usize = 4 << 20;
/// Most pending device-memory writes (packets) a queue keeps (bounds the work of a read through
/// them, `Options::unordered_device_reads` off).
const PENDING_MAX: usize = 1024;

/// Writes of one packet held by unordered completion.
pub(super) struct Held {
    /// Queue epoch when the packet ran; a queue reset drops the held writes.
    epoch: u64,
    /// When the writes land at the latest.
    due: Instant,
    /// Destination segments, in order.
    segs: Vec<Seg>,
    /// The packet's bytes, read from the source when the packet ran.
    data: Vec<u8>,
}

/// The device-memory writes of one packet of the queue that landed but are not published: device
/// memory still holds the old bytes; these are the new ones.
struct Pending {
    /// Queue epoch of the write; a queue reset drops it.
    epoch: u64,
    /// When the write is published at the latest (the unordered-completion delay after the
    /// packet ran; never before the queue's older pending writes).
    due: Instant,
    /// Device addresses and lengths written, in order.
    segs: Vec<(u64, u32)>,
    /// The bytes written, segment after segment.
    data: Vec<u8>,
}

/// The held packets of one queue, oldest first, and their bytes; the fence of the last write
/// barrier; the queue's pending device-memory writes, oldest first.
#[derive(Default)]
pub(super) struct HeldQueue {
    list: VecDeque<Held>,
    bytes: usize,
    /// The first `fence` held packets precede a write-barrier packet: they land before any
    /// write of a later packet lands (hardware.rst §4.3 bit 26).
    fence: usize,
    /// Bounds `[lo, hi)` of the host bytes the held packets write (a quick no-overlap test).
    host_span: Span,
    /// Oldest first; published in this order.
    pending: VecDeque<Pending>,
    pending_bytes: usize,
    /// Bounds of the device bytes the pending writes cover.
    pending_span: Span,
    /// A write barrier came after pending (or fenced held) writes: the pending writes are
    /// published before any later write lands in host memory.
    publish_before_host: bool,
    /// Buffers of landed packets, reused so that holding a packet does not fault in fresh
    /// pages; at most [`HELD_POOL_MAX`] bytes.
    pool: Vec<Vec<u8>>,
    pool_bytes: usize,
    /// Segment lists of landed packets, reused (no allocation per held packet).
    seg_pool: Vec<Vec<Seg>>,
    /// Device segment lists of published writes, reused (no allocation per pending write).
    dseg_pool: Vec<Vec<(u64, u32)>>,
}

/// Bounds `[lo, hi)` of a set of byte ranges; empty when `lo >= hi`.
#[derive(Clone, Copy)]
struct Span {
    lo: u64,
    hi: u64,
}

impl Default for Span {
    fn default() -> Span {
        Span { lo: u64::MAX, hi: 0 }
    }
}

impl Span {
    fn add(&mut self, a: u64, len: u32) {
        self.lo = self.lo.min(a);
        self.hi = self.hi.max(a.saturating_add(u64::from(len)));
    }

    fn meets(&self, a: u64, len: u32) -> bool {
        a < self.hi && self.lo < a.saturating_add(u64::from(len))
    }
}

impl HeldQueue {
    fn push(&mut self, h: Held) {
        self.bytes += h.data.len();
        for r in &h.segs {
            if let Target::Host(a) = r.target {
                self.host_span.add(a, r.len);
            }
        }
        self.list.push_back(h);
    }

    fn pop(&mut self) -> Option<Held> {
        let h = self.list.pop_front()?;
        self.bytes -= h.data.len();
        self.fence = self.fence.saturating_sub(1);
        if self.list.is_empty() {
            self.host_span = Span::default();
        }
        Some(h)
    }

    /// Whether source segment `t` reads host bytes a held packet writes, or device bytes when
    /// `device` is set.
    fn overlaps_read(&self, t: &Seg, device: bool) -> bool {
        match t.target {
            Target::Host(a) => self.host_span.meets(a, t.len) && self.list.iter().any(|h| h.overlaps_read(t, false)),
            Target::Device(_) => device && self.list.iter().any(|h| h.overlaps_read(t, true)),
        }
    }

    fn front(&self) -> Option<&Held> {
        self.list.front()
    }

    /// When the oldest held packet lands, or the oldest pending write is published, at the
    /// latest, if any.
    pub(super) fn next_due(&self) -> Option<Instant> {
        match (self.front().map(|h| h.due), self.pending.front().map(|p| p.due)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the oldest held packet must land, or the oldest pending write be published, now:
    /// it is due by `now`, or its queue was reset since (its epoch is not `epoch`).
    pub(super) fn due(&self, now: Instant, epoch: u64) -> bool {
        self.front().is_some_and(|h| h.due <= now || h.epoch != epoch)
            || self.pending.front().is_some_and(|p| p.due <= now || p.epoch != epoch)
    }

    /// A buffer of `n` bytes (contents unspecified, zero or from an earlier packet).
    fn buffer(&mut self, n: usize) -> Vec<u8> {
        let mut b = self.pool.pop().unwrap_or_default();
        self.pool_bytes -= b.capacity();
        b.resize(n, 0);
        b
    }

    /// A copy of `segs` in a reused list.
    fn segs(&mut self, segs: &[Seg]) -> Vec<Seg> {
        let mut v = self.seg_pool.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(segs);
        v
    }

    /// An empty reused device segment list.
    fn dsegs(&mut self) -> Vec<(u64, u32)> {
        let mut v = self.dseg_pool.pop().unwrap_or_default();
        v.clear();
        v
    }

    fn recycle(&mut self, b: Vec<u8>) {
        if self.pool_bytes + b.capacity() <= HELD_POOL_MAX {
            self.pool_bytes += b.capacity();
            self.pool.push(b);
        }
    }

    /// Whether device range `[a, a+len)` overlaps a pending write of epoch `epoch`.
    fn pending_meets(&self, a: u64, len: u32, epoch: u64) -> bool {
        self.pending_span.meets(a, len)
            && self.pending.iter().any(|p| p.epoch == epoch && p.segs.iter().any(|&(d, l)| overlap(d, l, a, len)))
    }

    /// Puts into `buf` (the device bytes read at `a`) what the queue's pending writes of epoch
    /// `epoch` wrote there: the newest write of a byte wins.
    fn overlay_pending(&self, a: u64, buf: &mut [u8], epoch: u64) {
        if !self.pending_span.meets(a, buf.len() as u32) {
            return;
        }
        for p in self.pending.iter().filter(|p| p.epoch == epoch) {
            let mut at = 0usize;
            for &(d, l) in &p.segs {
                let (lo, hi) = (d.max(a), (d + u64::from(l)).min(a + buf.len() as u64));
                if lo < hi {
                    let (from, to) = ((lo - d) as usize + at, (lo - a) as usize);
                    let n = (hi - lo) as usize;
                    buf[to..to + n].copy_from_slice(&p.data[from..from + n]);
                }
                at += l as usize;
            }
        }
    }
}

fn overlap(a: u64, alen: u32, b: u64, blen: u32) -> bool {
    a < b.saturating_add(u64::from(blen)) && b < a.saturating_add(u64::from(alen))
}

impl Held {
    /// Whether source segment `t` reads host bytes this held packet writes, or device bytes
    /// when `device` is set.
    fn overlaps_read(&self, t: &Seg, device: bool) -> bool {
        match t.target {
            Target::Host(ta) => {
                self.segs.iter().any(|r| matches!(r.target, Target::Host(ra) if overlap(ra, r.len, ta, t.len)))
            }
            Target::Device(ta) => {
                device
                    && self.segs.iter().any(|r| matches!(r.target, Target::Device(ra) if overlap(ra, r.len, ta, t.len)))
            }
        }
    }
}

impl Engine {
    /// Moves the bytes of a checked packet (segments in `sc`), applying its barriers (see the
    /// module documentation). With unordered completion off, every packet reads and writes at
    /// once, in order.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn move_data(
        &self,
        env: &Env<'_>,
        s: &Snapshot,
        sc: &mut Scratch,
        held: &mut HeldQueue,
        bytes: u64,
        dmb: bool,
        wb: bool,
    ) -> Result<(), ErrorRecord> {
        let Some(delay) = self.opts.unordered_delay else {
            return self.copy(env, s, sc);
        };
        let now = Instant::now();
        if dmb {
            // DMB: every earlier transfer of the queue completes before this packet moves a
            // byte: held writes land, pending device writes are published (visible to every
            // reader), and this packet's reads see all of them.
            self.land(env, held, None, s.epoch, false);
        } else if held.bytes > 0 && sc.tx.iter().any(|t| held.overlaps_read(t, !self.opts.unordered_device_reads)) {
            // Host memory: a read does not pass the queue's earlier writes to it (PCIe: a read
            // request does not pass posted writes), so they land first; device memory too
            // unless its reads pass unordered writes (`Options::unordered_device_reads`).
            self.land_oldest(env, held, held.list.len(), s.epoch);
        }
        if !dmb && !wb && bytes > POSTED_WRITE_MAX {
            // Held: read now (device memory as this packet sees it), write later.
            let mut data = held.buffer(bytes as usize);
            if let Err(e) = self.read_sources(env, s, sc, held, &mut data) {
                held.recycle(data);
                return Err(e);
            }
            let segs = held.segs(&sc.rx);
            held.push(Held { epoch: s.epoch, due: now + delay, segs, data });
            self.add_held(1);
            while held.bytes > HELD_BYTES_MAX && held.list.len() > 1 {
                self.land_oldest(env, held, 1, s.epoch);
            }
            return Ok(());
        }
        // This packet's writes land now: first the writes an earlier write barrier fenced.
        if held.fence > 0 {
            self.land_oldest(env, held, held.fence, s.epoch);
        }
        self.write_now(env, s, sc, held, now + delay)?;
        if wb {
            // Write barrier: the held writes of earlier packets land before any later write, and
            // the pending device writes (this packet's included) are published before any later
            // write lands in host memory.
            held.fence = held.list.len();
            held.publish_before_host |= held.fence > 0 || !held.pending.is_empty();
        }
        Ok(())
    }

    /// Reads the sources of the packet into `buf`. Device memory reads as published, without the
    /// queue's own pending writes, unless `Options::unordered_device_reads` is off.
    fn read_sources(
        &self,
        env: &Env<'_>,
        s: &Snapshot,
        sc: &Scratch,
        held: &HeldQueue,
        buf: &mut [u8],
    ) -> Result<(), ErrorRecord> {
        let mut at = 0usize;
        for t in &sc.tx {
            let (m, a) = self.space(env, t.target, 0);
            let b = &mut buf[at..at + t.len as usize];
            if !m.read(a, b) {
                let (idx, _) = s.tx.slot(0);
                return Err(err(ErrorKind::DataRead, s.q, Dir::Tx, Some(idx)));
            }
            if let Target::Device(d) = t.target {
                if !self.opts.unordered_device_reads {
                    held.overlay_pending(d, b, s.epoch);
                }
            }
            at += t.len as usize;
        }
        Ok(())
    }

    /// Writes a packet that is not held, now: host memory at once, device memory as pending
    /// writes due at `due` ([`Engine::stage`]). A packet that writes device memory, or that reads
    /// through the queue's pending writes, goes through a buffer; any other is copied span to
    /// span.
    fn write_now(
        &self,
        env: &Env<'_>,
        s: &Snapshot,
        sc: &mut Scratch,
        held: &mut HeldQueue,
        due: Instant,
    ) -> Result<(), ErrorRecord> {
        let dev_dst = self.opts.private_device_writes && sc.rx.iter().any(|r| matches!(r.target, Target::Device(_)));
        let through_pending = !self.opts.unordered_device_reads
            && !held.pending.is_empty()
            && sc.tx.iter().any(|t| matches!(t.target, Target::Device(d) if held.pending_meets(d, t.len, s.epoch)));
        if !dev_dst && !through_pending {
            if held.publish_before_host && sc.rx.iter().any(|r| matches!(r.target, Target::Host(_))) {
                self.publish(env, held, None, s.epoch);
            }
            return self.copy(env, s, sc);
        }
        let mut data = held.buffer(sc.tx.iter().map(|t| t.len as usize).sum());
        if let Err(e) = self.read_sources(env, s, sc, held, &mut data) {
            held.recycle(data);
            return Err(e);
        }
        if self.stage(env, held, &sc.rx, data, s.epoch, due) {
            Ok(())
        } else {
            let (idx, _) = s.rx.slot(0);
            Err(err(ErrorKind::DataWrite, s.q, Dir::Rx, Some(idx)))
        }
    }

    /// Lands the writes of one packet, `data` to destination segments `segs` in order: the
    /// host-memory part now (after the pending writes a write barrier ordered before it), the
    /// device-memory part as a pending write of the queue due at `due` (or now, with
    /// `Options::private_device_writes` off). Returns `false` if a part is not mapped.
    fn stage(
        &self,
        env: &Env<'_>,
        held: &mut HeldQueue,
        segs: &[Seg],
        data: Vec<u8>,
        epoch: u64,
        due: Instant,
    ) -> bool {
        let host = segs.iter().any(|r| matches!(r.target, Target::Host(_)));
        let dev = segs.iter().any(|r| matches!(r.target, Target::Device(_)));
        if host && held.publish_before_host {
            self.publish(env, held, None, epoch);
        }
        if !dev || !self.opts.private_device_writes {
            let ok = self.write_segs(env, segs, &data);
            held.recycle(data);
            return ok;
        }
        let mut dsegs = held.dsegs();
        let mut ok = true;
        let pdata = if host {
            let n = segs.iter().filter(|r| matches!(r.target, Target::Device(_))).map(|r| r.len as usize).sum();
            let mut pd = held.buffer(n);
            let (mut at, mut pat) = (0usize, 0usize);
            for r in segs {
                let n = r.len as usize;
                match r.target {
                    Target::Host(a) => ok &= env.host.write(a, &data[at..at + n]),
                    Target::Device(d) => {
                        pd[pat..pat + n].copy_from_slice(&data[at..at + n]);
                        dsegs.push((d, r.len));
                        pat += n;
                    }
                }
                at += n;
            }
            held.recycle(data);
            pd
        } else {
            dsegs.extend(segs.iter().filter_map(|r| match r.target {
                Target::Device(d) => Some((d, r.len)),
                Target::Host(_) => None,
            }));
            data
        };
        self.push_pending(env, held, Pending { epoch, due, segs: dsegs, data: pdata });
        ok
    }

    /// Adds a pending write (due no earlier than the older ones), publishing the oldest beyond
    /// the bounds.
    fn push_pending(&self, env: &Env<'_>, held: &mut HeldQueue, mut p: Pending) {
        if let Some(b) = held.pending.back() {
            p.due = p.due.max(b.due);
        }
        let epoch = p.epoch;
        held.pending_bytes += p.data.len();
        for &(d, l) in &p.segs {
            held.pending_span.add(d, l);
        }
        held.pending.push_back(p);
        while held.pending_bytes > PENDING_BYTES_MAX || held.pending.len() > PENDING_MAX {
            self.publish_oldest(env, held, epoch);
        }
    }

    /// Publishes the oldest pending write (writes it to device memory), or drops it if its
    /// queue was reset since (its epoch is not `epoch`).
    fn publish_oldest(&self, env: &Env<'_>, held: &mut HeldQueue, epoch: u64) {
        let Some(p) = held.pending.pop_front() else { return };
        if p.epoch == epoch {
            let mut at = 0usize;
            for &(d, l) in &p.segs {
                if !env.hbm.write(d, &p.data[at..at + l as usize]) {
                    log::warn!("engine {}: pending device write at 0x{d:x} no longer mapped; dropped", self.id);
                }
                at += l as usize;
            }
        }
        held.pending_bytes -= p.data.len();
        held.recycle(p.data);
        if held.dseg_pool.len() < HELD_SEG_POOL {
            held.dseg_pool.push(p.segs);
        }
        if held.pending.is_empty() {
            held.pending_span = Span::default();
            held.publish_before_host = held.fence > 0;
        }
    }

    /// Publishes the queue's pending writes, oldest first: all of them (`upto` = None) or those
    /// due by `upto`. Writes of an older queue epoch (the queue was reset) are dropped.
    fn publish(&self, env: &Env<'_>, held: &mut HeldQueue, upto: Option<Instant>, epoch: u64) {
        while let Some(p) = held.pending.front() {
            if p.epoch == epoch && upto.is_some_and(|t| p.due > t) {
                break;
            }
            self.publish_oldest(env, held, epoch);
        }
    }

    /// The queue ran out of posted Tx descriptors with its last packet: with nothing held, it has
    /// no transfer in flight, so its pending writes are published (before the packet's
    /// completion is visible in the heads).
    pub(super) fn settle_idle(&self, env: &Env<'_>, held: &mut HeldQueue, epoch: u64) {
        if held.list.is_empty() && !held.pending.is_empty() {
            self.publish(env, held, None, epoch);
        }
    }

    /// Lands the `n` oldest held packets, in order: host bytes now, device bytes as pending
    /// writes due when the packet was.
    fn land_oldest(&self, env: &Env<'_>, held: &mut HeldQueue, n: usize, epoch: u64) {
        let mut k = 0isize;
        for _ in 0..n {
            let Some(h) = held.pop() else { break };
            self.write_held(env, held, h, epoch, false);
            k += 1;
        }
        self.add_held(-k);
    }

    /// Lands held writes in order and publishes pending ones: all of them (`upto` = None, a DMB:
    /// the pending ones first, then the held ones written at once, so in the queue's order)
    /// or those due by `upto` (the delay is over); all pending ones too when the queue is `idle`
    /// (no Tx descriptor posted) and nothing stays held. Writes of an older queue epoch (the
    /// queue was reset) are dropped. The held count drops only once they are published.
    pub(super) fn land(&self, env: &Env<'_>, held: &mut HeldQueue, upto: Option<Instant>, epoch: u64, idle: bool) {
        let all = upto.is_none();
        if all {
            self.publish(env, held, None, epoch);
        }
        let mut k = 0isize;
        while let Some(h) = held.front() {
            if h.epoch == epoch && upto.is_some_and(|t| h.due > t) {
                break;
            }
            let Some(h) = held.pop() else { break };
            self.write_held(env, held, h, epoch, all);
            k += 1;
        }
        if !all {
            let idle = idle && held.list.is_empty();
            self.publish(env, held, if idle { None } else { upto }, epoch);
        }
        self.add_held(-k);
    }

    /// Lands held packet `h` (unless its queue was reset since): as pending writes
    /// ([`Engine::stage`]), or written at once when `now` (nothing older is pending); then
    /// recycles its buffers.
    fn write_held(&self, env: &Env<'_>, held: &mut HeldQueue, h: Held, epoch: u64, now: bool) {
        let ok = if h.epoch != epoch {
            held.recycle(h.data);
            true
        } else if now {
            let ok = self.write_segs(env, &h.segs, &h.data);
            held.recycle(h.data);
            ok
        } else {
            self.stage(env, held, &h.segs, h.data, epoch, h.due)
        };
        if !ok {
            log::warn!("engine {}: held write no longer mapped; dropped", self.id);
        }
        if held.seg_pool.len() < HELD_SEG_POOL {
            held.seg_pool.push(h.segs);
        }
    }

    /// Writes `data` to destination segments `segs`, in order; `false` if a part is unmapped.
    fn write_segs(&self, env: &Env<'_>, segs: &[Seg], data: &[u8]) -> bool {
        let mut at = 0usize;
        let mut ok = true;
        for r in segs {
            let (m, a) = self.space(env, r.target, 0);
            ok &= m.write(a, &data[at..at + r.len as usize]);
            at += r.len as usize;
        }
        ok
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

    pub(super) fn space<'a>(&self, env: &Env<'a>, t: Target, off: u32) -> (&'a dyn GuestMemory, u64) {
        match t {
            Target::Host(a) => (env.host, a.wrapping_add(u64::from(off))),
            Target::Device(a) => (env.hbm, a.wrapping_add(u64::from(off))),
        }
    }
}
