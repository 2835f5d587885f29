//! Moving the bytes of a checked packet, with its barriers: the writes unordered completion
//! holds, the write-barrier fence, and the device-memory bytes unordered writes replaced
//! (hardware.rst §4.2, §4.3, §4.4, §5.1, §8.2).
//!
//! Per queue, with unordered completion on (`Options::unordered_delay`):
//!
//! * a packet with neither DMB nor write barrier longer than [`POSTED_WRITE_MAX`] bytes is
//!   **held**: its source is read when it runs, its writes land later ([`HeldQueue`], oldest
//!   first);
//! * a **DMB** packet (len_ctrl bit 30: wait for all earlier transfers of the queue) lands every
//!   held write before it moves a byte, and from then on the queue's later reads see every
//!   earlier write;
//! * a **write-barrier** packet (meta_ctrl bit 26, without DMB) lands its own writes at once,
//!   without waiting for the held writes of earlier packets; it puts a **fence** after them: they
//!   land before any write of a later packet lands. Until then (or a DMB, or the delay) they stay
//!   held, so a marker that has only the write barrier can be seen before the earlier data;
//! * every other packet (short, or with a barrier) writes at once, after the fenced writes;
//! * a read of **device memory** (HBM) by a packet without DMB does not see the writes of earlier
//!   packets of the queue since the last DMB (until the delay): for their bytes it reads what was
//!   there before. A held write has not landed yet; a landed one left a [`Shadow`] of the bytes it
//!   replaced. A read of **host** memory that overlaps held writes lands them first.

use super::packet::{Scratch, Seg, Snapshot};
use super::worker::Env;
use super::{err, Dir, Engine, ErrorKind, ErrorRecord};
use crate::layout::Target;
use crate::mem::{self, GuestMemory};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

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
/// Bytes of shadows (device memory replaced by unordered writes) a queue keeps; above it the
/// oldest are dropped (a later read then sees those writes).
const SHADOW_BYTES_MAX: usize = 4 << 20;
/// Most shadows a queue keeps (bounds the work of a device-memory read).
const SHADOW_MAX: usize = 1024;

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

/// The device-memory bytes that a landed write of the queue replaced, while the queue's later
/// reads are not ordered after that write (no DMB since, delay not over).
struct Shadow {
    /// Queue epoch of the write.
    epoch: u64,
    /// When the write counts as complete for later reads (the unordered-completion delay).
    due: Instant,
    /// Device addresses and lengths of the replaced bytes, in order.
    segs: Vec<(u64, u32)>,
    /// The replaced bytes.
    pre: Vec<u8>,
}

/// The held packets of one queue, oldest first, and their bytes; the fence of the last write
/// barrier; the shadows of the queue's unordered device-memory writes.
#[derive(Default)]
pub(super) struct HeldQueue {
    list: VecDeque<Held>,
    bytes: usize,
    /// The first `fence` held packets precede a write-barrier packet: they land before any
    /// write of a later packet lands (hardware.rst §4.3 bit 26).
    fence: usize,
    /// Bounds `[lo, hi)` of the host bytes the held packets write (a quick no-overlap test).
    host_span: Span,
    /// Oldest first.
    shadows: VecDeque<Shadow>,
    shadow_bytes: usize,
    /// Bounds of the device bytes the shadows cover.
    shadow_span: Span,
    /// Buffers of landed packets, reused so that holding a packet does not fault in fresh
    /// pages; at most [`HELD_POOL_MAX`] bytes.
    pool: Vec<Vec<u8>>,
    pool_bytes: usize,
    /// Segment lists of landed packets, reused (no allocation per held packet).
    seg_pool: Vec<Vec<Seg>>,
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

    /// When the oldest held packet lands at the latest, if any.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.front().map(|h| h.due)
    }

    /// Whether the oldest held packet must land now: it is due by `now`, or its queue was reset
    /// since (its epoch is not `epoch`).
    pub(super) fn due(&self, now: Instant, epoch: u64) -> bool {
        self.front().is_some_and(|h| h.due <= now || h.epoch != epoch)
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

    fn recycle(&mut self, b: Vec<u8>) {
        if self.pool_bytes + b.capacity() <= HELD_POOL_MAX {
            self.pool_bytes += b.capacity();
            self.pool.push(b);
        }
    }

    /// Adds a shadow, dropping the oldest beyond the bounds.
    fn push_shadow(&mut self, s: Shadow) {
        self.shadow_bytes += s.pre.len();
        for &(d, l) in &s.segs {
            self.shadow_span.add(d, l);
        }
        self.shadows.push_back(s);
        while self.shadow_bytes > SHADOW_BYTES_MAX || self.shadows.len() > SHADOW_MAX {
            let Some(old) = self.shadows.pop_front() else { break };
            self.shadow_bytes -= old.pre.len();
            self.recycle(old.pre);
        }
    }

    /// Drops every shadow (a DMB: later reads see every earlier write).
    fn clear_shadows(&mut self) {
        while let Some(old) = self.shadows.pop_front() {
            self.recycle(old.pre);
        }
        self.shadow_bytes = 0;
        self.shadow_span = Span::default();
    }

    /// Drops the oldest shadows that are over (`due` by `now`) or of an older queue epoch.
    /// Shadows are not strictly in due order, so some may outlive their due time here: readers
    /// skip those ([`Shadow::live`]).
    fn prune_shadows(&mut self, now: Instant, epoch: u64) {
        while self.shadows.front().is_some_and(|s| !s.live(now, epoch)) {
            let Some(old) = self.shadows.pop_front() else { break };
            self.shadow_bytes -= old.pre.len();
            self.recycle(old.pre);
        }
        if self.shadows.is_empty() {
            self.shadow_span = Span::default();
        }
    }

    /// Whether device range `[a, a+len)` overlaps a live shadow.
    fn shadowed(&self, a: u64, len: u32, now: Instant, epoch: u64) -> bool {
        self.shadow_span.meets(a, len)
            && self.shadows.iter().any(|s| s.live(now, epoch) && s.segs.iter().any(|&(d, l)| overlap(d, l, a, len)))
    }

    /// Puts back, into `buf` (the device bytes read at `a`), the bytes that live shadows say
    /// were there before the queue's unordered writes: the oldest shadow of a byte wins.
    fn overlay(&self, a: u64, buf: &mut [u8], now: Instant, epoch: u64) {
        if !self.shadow_span.meets(a, buf.len() as u32) {
            return;
        }
        for s in self.shadows.iter().rev().filter(|s| s.live(now, epoch)) {
            let mut at = 0usize;
            for &(d, l) in &s.segs {
                let (lo, hi) = (d.max(a), (d + u64::from(l)).min(a + buf.len() as u64));
                if lo < hi {
                    let (from, to) = ((lo - d) as usize + at, (lo - a) as usize);
                    let n = (hi - lo) as usize;
                    buf[to..to + n].copy_from_slice(&s.pre[from..from + n]);
                }
                at += l as usize;
            }
        }
    }
}

impl Shadow {
    fn live(&self, now: Instant, epoch: u64) -> bool {
        self.epoch == epoch && self.due > now
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

/// How a landing write treats the device bytes it replaces.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Landing {
    /// Ordered before every later read of the queue (a DMB, or the delay is over): no shadow.
    Complete,
    /// Not ordered before later reads of the queue: keep a shadow until the write's due time.
    Unordered,
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
        held.prune_shadows(now, s.epoch);
        if dmb {
            // DMB: every earlier transfer of the queue completes before this packet moves a
            // byte, and this packet's reads see all of them.
            self.land(env, held, None, s.epoch);
            held.clear_shadows();
        } else if held.bytes > 0 && sc.tx.iter().any(|t| held.overlaps_read(t, !self.opts.unordered_device_reads)) {
            // Host memory: a read does not pass the queue's earlier writes to it (PCIe: a read
            // request does not pass posted writes), so they land first; device memory too
            // unless its reads pass unordered writes (`Options::unordered_device_reads`).
            self.land_oldest(env, held, held.list.len(), s.epoch, now);
        }
        if !dmb && !wb && bytes > POSTED_WRITE_MAX {
            // Held: read now (device memory as this packet sees it), write later.
            let mut data = held.buffer(bytes as usize);
            if let Err(e) = self.read_sources(env, s, sc, held, &mut data, now) {
                held.recycle(data);
                return Err(e);
            }
            let segs = held.segs(&sc.rx);
            held.push(Held { epoch: s.epoch, due: now + delay, segs, data });
            self.add_held(1);
            while held.bytes > HELD_BYTES_MAX && held.list.len() > 1 {
                self.land_oldest(env, held, 1, s.epoch, now);
            }
            return Ok(());
        }
        // This packet's writes land now: first the writes an earlier write barrier fenced.
        if held.fence > 0 {
            self.land_oldest(env, held, held.fence, s.epoch, now);
        }
        self.write_now(env, s, sc, held, now, delay)?;
        if wb {
            // Write barrier: the held writes of earlier packets land before any later write.
            held.fence = held.list.len();
        }
        Ok(())
    }

    /// Reads the sources of the packet into `buf`; device bytes that the queue's unordered
    /// writes replaced read as before those writes.
    fn read_sources(
        &self,
        env: &Env<'_>,
        s: &Snapshot,
        sc: &Scratch,
        held: &HeldQueue,
        buf: &mut [u8],
        now: Instant,
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
                held.overlay(d, b, now, s.epoch);
            }
            at += t.len as usize;
        }
        Ok(())
    }

    /// Writes a packet that is not held, now. Its device-memory writes leave shadows (no later
    /// read of the queue is ordered after them without a DMB). A packet that reads shadowed
    /// device bytes goes through a buffer; any other is copied span to span.
    fn write_now(
        &self,
        env: &Env<'_>,
        s: &Snapshot,
        sc: &mut Scratch,
        held: &mut HeldQueue,
        now: Instant,
        delay: Duration,
    ) -> Result<(), ErrorRecord> {
        let shadow = self.capture(env, held, &sc.rx, s.epoch, now + delay);
        let buffered =
            sc.tx.iter().any(|t| matches!(t.target, Target::Device(d) if held.shadowed(d, t.len, now, s.epoch)));
        let r = if buffered {
            let mut data = std::mem::take(&mut sc.buf);
            data.resize(sc.tx.iter().map(|t| t.len as usize).sum(), 0);
            let r = self.read_sources(env, s, sc, held, &mut data, now).and_then(|()| {
                if self.write_segs(env, &sc.rx, &data) {
                    Ok(())
                } else {
                    let (idx, _) = s.rx.slot(0);
                    Err(err(ErrorKind::DataWrite, s.q, Dir::Rx, Some(idx)))
                }
            });
            sc.buf = data;
            r
        } else {
            self.copy(env, s, sc)
        };
        if let Some(sh) = shadow {
            held.push_shadow(sh);
        }
        r
    }

    /// The shadow of a write to `segs` about to land (its device-memory part), if it writes
    /// device memory.
    fn capture(&self, env: &Env<'_>, held: &mut HeldQueue, segs: &[Seg], epoch: u64, due: Instant) -> Option<Shadow> {
        if !self.opts.unordered_device_reads {
            // Reads see every landed write: nothing to put back.
            return None;
        }
        let dev: Vec<(u64, u32)> = segs
            .iter()
            .filter_map(|r| match r.target {
                Target::Device(d) => Some((d, r.len)),
                Target::Host(_) => None,
            })
            .collect();
        if dev.is_empty() {
            return None;
        }
        let mut pre = held.buffer(dev.iter().map(|&(_, l)| l as usize).sum());
        let mut at = 0usize;
        for &(d, l) in &dev {
            // Unmapped bytes (a write about to fail) read as whatever the buffer held.
            let _ = env.hbm.read(d, &mut pre[at..at + l as usize]);
            at += l as usize;
        }
        Some(Shadow { epoch, due, segs: dev, pre })
    }

    /// Lands the `n` oldest held packets, in order, as unordered writes: their device-memory
    /// writes leave shadows until their due time.
    fn land_oldest(&self, env: &Env<'_>, held: &mut HeldQueue, n: usize, epoch: u64, now: Instant) {
        for _ in 0..n {
            let Some(h) = held.pop() else { break };
            self.write_held(env, held, h, epoch, now, Landing::Unordered);
        }
    }

    /// Lands held writes in order, as complete: all of them (`upto` = None, a DMB) or those due
    /// by `upto` (the delay is over). Writes of an older queue epoch (the queue was reset) are
    /// dropped, and so are the shadows then over.
    pub(super) fn land(&self, env: &Env<'_>, held: &mut HeldQueue, upto: Option<Instant>, epoch: u64) {
        while let Some(h) = held.front() {
            if h.epoch == epoch && upto.is_some_and(|t| h.due > t) {
                break;
            }
            let Some(h) = held.pop() else { break };
            self.write_held(env, held, h, epoch, upto.unwrap_or_else(Instant::now), Landing::Complete);
        }
        if let Some(t) = upto {
            held.prune_shadows(t, epoch);
        }
    }

    /// Writes held packet `h` (unless its queue was reset since) and recycles its buffer.
    fn write_held(&self, env: &Env<'_>, held: &mut HeldQueue, h: Held, epoch: u64, now: Instant, how: Landing) {
        if h.epoch == epoch {
            let shadow = match how {
                Landing::Unordered if h.due > now => self.capture(env, held, &h.segs, epoch, h.due),
                _ => None,
            };
            if !self.write_segs(env, &h.segs, &h.data) {
                log::warn!("engine {}: held write no longer mapped; dropped", self.id);
            }
            if let Some(sh) = shadow {
                held.push_shadow(sh);
            }
        }
        held.recycle(h.data);
        if held.seg_pool.len() < HELD_SEG_POOL {
            held.seg_pool.push(h.segs);
        }
        self.add_held(-1);
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
