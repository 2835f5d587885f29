//! Moving the bytes of a checked packet, with its barriers, and the writes unordered
//! completion holds (hardware.rst §4.2, §4.3, §5.1, §8.2).

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

/// The held packets of one queue, oldest first, and their bytes.
#[derive(Default)]
pub(super) struct HeldQueue {
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

impl Engine {
    /// Moves the bytes of a checked packet (segments in `sc`), applying its barriers
    /// (hardware.rst §4.2 bit 30 DMB: all earlier transfers of the queue complete first; §4.3 bit
    /// 26 write barrier: this packet's and all earlier writes are visible before the packet
    /// completes). With unordered completion on, a barrier-free packet longer than
    /// [`POSTED_WRITE_MAX`] bytes is read now and its writes are held in `held` until a later
    /// barrier or the delay.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn move_data(
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
                self.add_held(1);
                while held.bytes > HELD_BYTES_MAX {
                    let Some(h) = held.pop() else { break };
                    self.write_held(env, &h);
                    held.recycle(h.data);
                    self.add_held(-1);
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
    pub(super) fn land(&self, env: &Env<'_>, held: &mut HeldQueue, upto: Option<Instant>, epoch: u64) {
        while let Some(h) = held.front() {
            if h.epoch == epoch && upto.is_some_and(|t| h.due > t) {
                break;
            }
            let Some(h) = held.pop() else { break };
            if h.epoch == epoch {
                self.write_held(env, &h);
            }
            held.recycle(h.data);
            self.add_held(-1);
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

    pub(super) fn space<'a>(&self, env: &Env<'a>, t: Target, off: u32) -> (&'a dyn GuestMemory, u64) {
        match t {
            Target::Host(a) => (env.host, a.wrapping_add(u64::from(off))),
            Target::Device(a) => (env.hbm, a.wrapping_add(u64::from(off))),
        }
    }
}
