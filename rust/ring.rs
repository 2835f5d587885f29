// SPDX-License-Identifier: GPL-2.0

//! Descriptor rings: their memory, geometry and software index arithmetic (hardware.rst §4.6-4.8).
//!
//! A ring is a power-of-two number of 16-byte descriptor slots. The driver hands out slots at
//! `next`, the engine consumes them, and completion acks advance `ack`; free space keeps a
//! 16-descriptor reserve. Every pass over the ring stamps descriptors with the next 2-bit ring id
//! (1, 2, 3, 0, 1, ...), which the engine compares with the phase it expects.

use crate::desc::{Desc, RingId, DESC_SIZE};
use kernel::{
    device::{Bound, Device},
    dma::{Coherent, DmaAddress},
    io::{io_project, Io},
    prelude::*,
};

/// Smallest ring, in descriptors (hardware.rst §4.8, `UDMA_MIN_Q_SIZE`).
pub(crate) const MIN_DESCS: u32 = 32;
/// Largest ring this driver allocates, in descriptors (2^23; the hardware field allows
/// 2^24 - 16, hardware.rst §4.8, and 2^23 is the largest power of two below that).
pub(crate) const MAX_DESCS: u32 = 1 << 23;
/// Descriptors kept free between the producer and the last acked slot (hardware.rst §4.7,
/// `UDMA_MAX_NUM_CDESC_PER_CACHE_LINE`).
pub(crate) const RESERVE: u32 = 16;
/// Required alignment in bytes of a ring's start and end (hardware.rst §4.8).
pub(crate) const ALIGN: usize = 256;

/// Validated ring size in descriptors: a power of two in `MIN_DESCS..=MAX_DESCS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingSize(u32);

impl RingSize {
    /// Validates a ring size in descriptors.
    ///
    /// # Errors
    ///
    /// `EINVAL` if `descs` is not a power of two or lies outside 32..=2^23 (hardware.rst §4.8).
    pub(crate) fn new(descs: u32) -> Result<Self> {
        if !descs.is_power_of_two() || !(MIN_DESCS..=MAX_DESCS).contains(&descs) {
            return Err(EINVAL);
        }
        Ok(Self(descs))
    }

    /// Which limit of hardware.rst §4.8 `descs` breaks, if any (for a message).
    pub(crate) fn problem(descs: u32) -> Option<&'static str> {
        if !descs.is_power_of_two() {
            Some("not a power of two")
        } else if descs < MIN_DESCS {
            Some("below the minimum of 32")
        } else if descs > MAX_DESCS {
            Some("above the maximum of 2^23")
        } else {
            None
        }
    }

    /// Number of descriptors.
    pub(crate) fn descs(self) -> u32 {
        self.0
    }

    /// Slot index of the free-running position `i`: `i` wrapped to the ring.
    pub(crate) fn index(self, i: u32) -> u32 {
        i & (self.0 - 1)
    }

    /// Slots from index `from` forward to index `to`, wrapping (0 when they are equal).
    pub(crate) fn distance(self, from: u32, to: u32) -> u32 {
        self.index(to.wrapping_sub(from))
    }

    /// The `n` slot indices from index `from` on, wrapping.
    pub(crate) fn slots(self, from: u32, n: u32) -> impl Iterator<Item = u32> {
        (0..n).map(move |k| self.index(from.wrapping_add(k)))
    }

    /// Size of the ring memory in bytes (a multiple of [`ALIGN`], since 32 * 16 = 512).
    pub(crate) fn bytes(self) -> usize {
        self.0 as usize * DESC_SIZE
    }
}

/// Software indices of one ring (hardware.rst §4.6-4.7).
///
/// # Invariants
///
/// `next` and `ack` are always below `size`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RingState {
    size: RingSize,
    /// Next slot handed out (`next_desc_idx`).
    next: u32,
    /// First slot not yet acked (`next_cdesc_idx`).
    ack: u32,
    /// Ring id stamped into the slot at `next`.
    ring_id: RingId,
}

impl RingState {
    /// State right after a queue reset: empty, ring id 1.
    pub(crate) fn new(size: RingSize) -> Self {
        // INVARIANT: 0 < size.
        Self {
            size,
            next: 0,
            ack: 0,
            ring_id: RingId::INITIAL,
        }
    }

    /// Ring size.
    pub(crate) fn size(&self) -> RingSize {
        self.size
    }

    /// Next slot index to be handed out.
    pub(crate) fn next_index(&self) -> u32 {
        self.next
    }

    /// First slot not yet acked.
    pub(crate) fn ack_index(&self) -> u32 {
        self.ack
    }

    /// Ring id the next slot will carry.
    pub(crate) fn ring_id(&self) -> RingId {
        self.ring_id
    }

    /// Free slots, keeping the 16-descriptor reserve (hardware.rst §4.7): `size - 16 -
    /// outstanding`, and 0 whenever fewer than the reserve remain (a completion marker may use the
    /// reserve, and the masked form `(ack - (next + 16)) & (size - 1)` would then wrap to almost a
    /// full ring).
    pub(crate) fn available(&self) -> u32 {
        (self.size.0 - RESERVE).saturating_sub(self.outstanding())
    }

    /// Whether a slot is free beyond the reserve: [`Self::available`] is at least 1, tested
    /// without computing it.
    #[inline(always)]
    pub(crate) fn has_room(&self) -> bool {
        self.outstanding() < self.size.0 - RESERVE
    }

    /// Descriptors handed out and not yet acked.
    pub(crate) fn outstanding(&self) -> u32 {
        self.size.distance(self.ack, self.next)
    }

    /// Hands out the slot at `next`: returns its index and the ring id to stamp, then advances,
    /// flipping the ring id when the index wraps to 0 (hardware.rst §4.6, `udma_ring_id_get`).
    ///
    /// The caller checks [`Self::available`] first.
    #[inline(always)]
    pub(crate) fn take(&mut self) -> (u32, RingId) {
        let slot = (self.next, self.ring_id);
        // INVARIANT: wrapped to the ring size.
        self.next = self.size.index(self.next + 1);
        self.ring_id = self.ring_id.after_slot(self.next == 0);
        slot
    }

    /// Slots from the next one up to the end of the ring memory: how many [`Self::advance`]
    /// may hand out at once without wrapping (at least 1).
    #[inline(always)]
    pub(crate) fn slots_to_wrap(&self) -> u32 {
        self.size.0 - self.next
    }

    /// Hands out the `n` slots from the next one on, as `n` [`Self::take`]s would (their ring
    /// id is [`Self::ring_id`] before): `n` is at most [`Self::slots_to_wrap`], so the index
    /// wraps to 0 at most at the end.
    #[inline(always)]
    pub(crate) fn advance(&mut self, n: u32) {
        // At most the end of the ring memory: the index wrapped iff it reached it.
        let end = self.next + n;
        self.next = self.size.index(end);
        self.ring_id = self.ring_id.after_slot(end == self.size.0);
    }

    /// Acks `n` completed descriptors, freeing their slots (hardware.rst §4.7, `udma_cdesc_ack`).
    ///
    /// # Errors
    ///
    /// `EINVAL` if `n` exceeds the outstanding descriptors; nothing changes then.
    pub(crate) fn ack(&mut self, n: u32) -> Result {
        if n > self.outstanding() {
            return Err(EINVAL);
        }
        // INVARIANT: wrapped to the ring size.
        self.ack = self.size.index(self.ack.wrapping_add(n));
        Ok(())
    }
}

/// One descriptor slot of a ring's memory, lent out to be written ([`Ring::slots_ahead`]).
#[repr(transparent)]
pub(crate) struct Slot(Desc);

impl Slot {
    /// Writes `desc` into the slot, whole: two 8-byte volatile stores, because the engine reads
    /// this memory (hardware.rst §4.9).
    #[inline(always)]
    pub(crate) fn set(&mut self, desc: Desc) {
        let [lo, hi] = desc.halves();
        let p = core::ptr::from_mut(self).cast::<u64>();
        // SAFETY: `p` comes from a unique reference to a 16-byte `Desc`, which is 8-byte
        // aligned (its `u64`): both words lie inside it.
        unsafe {
            p.write_volatile(lo);
            p.add(1).write_volatile(hi);
        }
    }
}

/// One descriptor ring: its coherent memory (256-byte aligned, hardware.rst §4.8) and the
/// software state of its slots. Every index into the memory comes from the state, so it is
/// always below the ring size.
///
/// # Invariants
///
/// `mem` holds `state.size()` descriptors: the state's size is the allocation's, and
/// [`Self::restore`] keeps it.
pub(crate) struct Ring {
    mem: Coherent<[Desc]>,
    state: RingState,
}

impl Ring {
    /// Allocates a zeroed ring of `size` descriptors for DMA by `dev`.
    ///
    /// # Errors
    ///
    /// `ENOMEM` if the memory cannot be allocated (physically contiguous: a large ring may not
    /// be available, which is the caller's ENOMEM, not a warning), `EIO` if the allocator
    /// returned memory that is not 256-byte aligned.
    pub(crate) fn new(dev: &Device<Bound>, size: RingSize) -> Result<Self> {
        // CAST: at most MAX_DESCS.
        let mem =
            Coherent::<Desc>::zeroed_slice(dev, size.descs() as usize, GFP_KERNEL | __GFP_NOWARN)?;
        // CAST: only the low bits matter for the alignment check.
        if mem.dma_address() as usize % ALIGN != 0 {
            return Err(EIO);
        }
        // INVARIANT: `mem` was allocated with `size` descriptors.
        Ok(Self {
            mem,
            state: RingState::new(size),
        })
    }

    /// DMA address of slot 0.
    pub(crate) fn dma_address(&self) -> DmaAddress {
        self.mem.dma_address()
    }

    /// The software state (indices, ring id, free space).
    pub(crate) fn state(&self) -> &RingState {
        &self.state
    }

    /// Empties the ring after the engine was stopped from using it (queue init or pause):
    /// next and ack at slot 0, ring id 1.
    pub(crate) fn reset(&mut self) {
        // INVARIANT: the same size.
        self.state = RingState::new(self.state.size);
    }

    /// Hands out the next slot and writes into it the descriptor `desc` builds from the slot's
    /// ring id ([`RingState::take`]), whole: two 8-byte volatile stores (a 16-byte volatile copy
    /// goes through a stack temporary, a dozen more memory accesses per pair:
    /// Documentation/benchmarks.rst, (a)). Returns the slot index. The caller checks
    /// [`RingState::available`] first, and rings no doorbell for the slot before this returns.
    #[inline(always)]
    pub(crate) fn push(&mut self, desc: impl FnOnce(RingId) -> Desc) -> u32 {
        let (idx, id) = self.state.take();
        // CAST: slot indices are below MAX_DESCS.
        let i = idx as usize;
        // SAFETY: `idx` comes from the state, so it is below the ring size, which is the length
        // of `mem` (type invariants): slot `i` lies inside the allocation, initialised (zeroed
        // at allocation) and aligned for `Desc`, which `Slot` wraps (`repr(transparent)`). Only
        // `&mut self` writes a ring's memory, and the reference ends with this statement; the
        // engine reads a slot only after the doorbell that follows this write.
        unsafe { &mut *self.mem.as_mut_ptr().cast::<Slot>().add(i) }.set(desc(id));
        idx
    }

    /// Whether `ahead`'s next index lies within the free slots of this ring from its next index
    /// on (the 16-slot reserve kept), as a copy of its state moved on by at most
    /// [`RingState::available`] slots does ([`Self::slots_ahead`] hands out no more). A state
    /// of another size is not; nor, as far as the index tells, one this ring has moved past
    /// since (one it moved past by more than its free slots, or a ring id, is not told apart:
    /// a safety net under the queue lock, not a proof of origin).
    pub(crate) fn is_ahead(&self, ahead: &RingState) -> bool {
        ahead.size == self.state.size
            && self.state.size.distance(self.state.next, ahead.next) <= self.state.available()
    }

    /// Hands out the slots written ahead up to `ahead` ([`Self::slots_ahead`]): the next index
    /// and ring id become `ahead`'s, the acked index stays (what a retire acked since the copy
    /// was taken stays acked).
    ///
    /// # Errors
    ///
    /// `EINVAL` unless [`Self::is_ahead`]; nothing changes then.
    pub(crate) fn publish(&mut self, ahead: &RingState) -> Result {
        if !self.is_ahead(ahead) {
            return Err(EINVAL);
        }
        // INVARIANT: the same size.
        self.state.next = ahead.next;
        self.state.ring_id = ahead.ring_id;
        Ok(())
    }

    /// The `n` slots from `ahead`'s next index on (fewer if the ring memory or its free slots
    /// end before: at most [`RingState::slots_to_wrap`]), to write ahead ([`Slot::set`])
    /// without handing them out: the ring's own state stays as it is until [`Self::publish`],
    /// so slots written ahead and never published are as if never written. The slots of the
    /// stretch share one ring id ([`RingState::ring_id`] of `ahead`). `ahead` is a copy of this
    /// ring's state, moved on ([`RingState::advance`]) within its free slots (anything else,
    /// [`Self::is_ahead`], gives an empty stretch).
    #[inline(always)]
    pub(crate) fn slots_ahead(&mut self, ahead: &RingState, n: u32) -> &mut [Slot] {
        if !self.is_ahead(ahead) {
            return &mut [];
        }
        // Within the free slots left after those written ahead already, and the ring memory.
        let free = self.state.available() - self.state.size.distance(self.state.next, ahead.next);
        // CAST: slot indices and counts are below MAX_DESCS.
        let (at, n) = (
            ahead.next as usize,
            n.min(free).min(ahead.slots_to_wrap()) as usize,
        );
        // SAFETY: `ahead` has this ring's size, so `at + n` is at most the ring size, which is
        // the length of `mem` (type invariants): the slots lie inside the allocation, which is
        // initialised (zeroed at allocation) and aligned for `Desc`, which `Slot` wraps
        // (`repr(transparent)`). The returned borrow of `self` excludes every other access
        // through the ring. The engine does not write rings (it fetches descriptors), and the
        // slots are free (checked above): it reads them only after a doorbell, which the caller
        // rings only after publishing them.
        unsafe { core::slice::from_raw_parts_mut(self.mem.as_mut_ptr().cast::<Slot>().add(at), n) }
    }

    /// The bytes of the `n` slots from index `from` on, without wrapping: what a ring in device
    /// memory is published from (`devring.rs`). Only the CPU writes a ring's memory (the engine
    /// reads it at most), under `&mut self`.
    ///
    /// # Errors
    ///
    /// `EINVAL` if the slots do not lie inside the ring.
    pub(crate) fn slot_bytes(&self, from: u32, n: u32) -> Result<&[u8]> {
        let end = from.checked_add(n).ok_or(EINVAL)?;
        if end > self.state.size.descs() {
            return Err(EINVAL);
        }
        // CAST: slot indices are below MAX_DESCS, the byte offsets fit in `usize`.
        let (at, len) = (from as usize * DESC_SIZE, n as usize * DESC_SIZE);
        // SAFETY: `at..at + len` lies inside the ring's allocation (checked above). The memory is
        // initialised (allocated zeroed) and only written through `&mut self` (`push`,
        // `slots_ahead`, `overwrite`), which the returned borrow of `self` excludes; the device
        // never writes a ring (it fetches descriptors, it does not write them back:
        // hardware.rst §4.9).
        Ok(unsafe { core::slice::from_raw_parts(self.mem.as_ptr().cast::<u8>().add(at), len) })
    }

    /// Puts the software state back to `saved`, a copy of [`Self::state`] taken earlier on this
    /// ring: the slots handed out since are taken back (their contents stay, unused).
    pub(crate) fn restore(&mut self, saved: RingState) {
        if saved.size == self.state.size {
            // INVARIANT: the same size.
            self.state = saved;
        }
    }

    /// Acks `n` completed descriptors ([`RingState::ack`]).
    ///
    /// # Errors
    ///
    /// `EINVAL` if `n` exceeds the outstanding descriptors; nothing changes then.
    pub(crate) fn ack(&mut self, n: u32) -> Result {
        self.state.ack(n)
    }

    /// Reads slot `idx` (a copy of the 16 bytes in ring memory).
    ///
    /// # Errors
    ///
    /// `EINVAL` if `idx` is not below the ring size.
    pub(crate) fn read(&self, idx: u32) -> Result<Desc> {
        if idx >= self.state.size.descs() {
            return Err(EINVAL);
        }
        // PANIC: checked above.
        Ok(io_project!(&self.mem, [panic: idx as usize]).copy_read())
    }

    /// Overwrites slot `idx` with `d`, without touching the software state (KUnit only:
    /// hand-built and deliberately broken descriptors for the device model's checks).
    ///
    /// # Errors
    ///
    /// `EINVAL` if `idx` is not below the ring size.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn overwrite(&mut self, idx: u32, d: Desc) -> Result {
        if idx >= self.state.size.descs() {
            return Err(EINVAL);
        }
        // PANIC: checked above.
        io_project!(&self.mem, [panic: idx as usize]).copy_write(d);
        Ok(())
    }

    /// The ring memory, for the benchmark's plain-store floor (`tests/bench/kernel/bench.rs`).
    #[cfg(neuron_udma_bench)]
    pub(crate) fn memory(&self) -> &Coherent<[Desc]> {
        &self.mem
    }
}

#[cfg(neuron_udma_kunit)]
#[kunit_tests(neuron_udma_ring)]
mod tests {
    use super::*;

    #[test]
    fn ring_id_sequence_across_passes() -> Result {
        let mut r = RingState::new(RingSize::new(32)?);
        let mut seen = KVec::new();
        for k in 0..(32 * 5) {
            let (idx, id) = r.take();
            assert_eq!(idx, k % 32);
            if idx == 0 {
                seen.push(id.bits().get(), GFP_KERNEL)?;
            }
            // Keep the ring from filling up: ack each slot right away.
            r.ack(1)?;
        }
        assert_eq!(&seen[..], &[1, 2, 3, 0, 1]);
        // Closed form: slot k carries (1 + k / size) & 3.
        let mut r = RingState::new(RingSize::new(64)?);
        for k in 0..1000u32 {
            let (_, id) = r.take();
            assert_eq!(id.bits().get(), (1 + k / 64) & 3);
            r.ack(1)?;
        }
        Ok(())
    }

    #[test]
    fn advance_is_that_many_takes() -> Result {
        // From every next index of a 32-slot ring (and its ring id after a few passes), every
        // count up to the end of the ring memory: one advance leaves the state n takes would.
        for start in 0..(32 * 3 + 5) {
            let mut base = RingState::new(RingSize::new(32)?);
            for _ in 0..start {
                base.take();
                base.ack(1)?;
            }
            assert_eq!(base.slots_to_wrap(), 32 - base.next_index());
            for n in 0..=base.slots_to_wrap() {
                let (mut one, mut many) = (base, base);
                one.advance(n);
                for _ in 0..n {
                    many.take();
                }
                assert_eq!(one, many);
            }
        }
        Ok(())
    }

    #[test]
    fn free_space_reserve_and_wrap() -> Result {
        let mut r = RingState::new(RingSize::new(32)?);
        assert_eq!(r.available(), 16);
        for i in 0..16 {
            assert_eq!(r.available(), 16 - i);
            r.take();
        }
        assert_eq!(r.available(), 0);
        assert_eq!(r.outstanding(), 16);
        r.ack(10)?;
        assert_eq!(r.available(), 10);
        // Across the wrap: hand out 10 more (indices 16..25), ack everything.
        for _ in 0..10 {
            r.take();
        }
        assert_eq!(r.available(), 0);
        r.ack(16)?;
        assert_eq!(r.available(), 16);
        assert_eq!(r.outstanding(), 0);
        for _ in 0..16 {
            r.take();
        }
        // next wrapped past 31 to 10.
        assert_eq!(r.next_index(), 10);
        assert_eq!(r.ring_id().bits().get(), 2);
        assert_eq!(r.available(), 0);
        assert_eq!(r.ack(17), Err(EINVAL));
        assert_eq!(r.outstanding(), 16);
        let big = RingState::new(RingSize::new(8192)?);
        assert_eq!(big.available(), 8176);
        // Index arithmetic across the wrap.
        let s = RingSize::new(32)?;
        assert_eq!(
            (s.index(33), s.distance(30, 2), s.distance(5, 5)),
            (1, 4, 0)
        );
        let mut slots = KVec::new();
        for i in s.slots(30, 4) {
            slots.push(i, GFP_KERNEL)?;
        }
        assert_eq!(&slots[..], &[30, 31, 0, 1]);
        // A marker in the reserve: 17 of 32 outstanding leaves no free space, not 31.
        let mut r = RingState::new(RingSize::new(32)?);
        for _ in 0..17 {
            r.take();
        }
        assert_eq!(r.available(), 0);
        for _ in 0..13 {
            r.take();
        }
        assert_eq!(r.outstanding(), 30);
        assert_eq!(r.available(), 0);
        r.ack(14)?;
        assert_eq!(r.available(), 0);
        r.ack(1)?;
        assert_eq!(r.available(), 1);
        Ok(())
    }

    #[test]
    fn ring_sizes() {
        assert_eq!(RingSize::new(0), Err(EINVAL));
        assert_eq!(RingSize::new(16), Err(EINVAL));
        assert_eq!(RingSize::new(48), Err(EINVAL));
        assert_eq!(RingSize::new(100), Err(EINVAL));
        assert_eq!(RingSize::new(1 << 24), Err(EINVAL));
        assert_eq!(RingSize::new(u32::MAX), Err(EINVAL));
        assert!(RingSize::new(32).is_ok());
        assert!(RingSize::new(1 << 23).is_ok());
        assert_eq!(RingSize::new(32).map(|s| s.bytes()), Ok(512));
    }
}
