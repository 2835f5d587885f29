// SPDX-License-Identifier: GPL-2.0

//! The copies of one prepare call (`COPY_PREPARE_ONE`, `COPY_PREPARE`) translated into
//! descriptor pairs: every entry validated in one pass, its buffers found once per call (in
//! the queue's resident set, `resident.rs`; an import in a per-call table of handles), each
//! buffer held once for the whole submission ([`Holds`]), and the pairs, as the splitter
//! (`split.rs`) cuts each copy, collected in one array for the submission engine to write
//! (`Channel::prepare`). Nothing here touches a queue.

use crate::{
    buffer::{Buffer, MAX_IMPORT_SIZE},
    desc::{Barrier, DescLen},
    holds::Holds,
    queue::Copy,
    resident::{self, Place, Resolved, Session},
    span::Span,
    split::{self, UserPairs},
    uapi,
};
use kernel::{prelude::*, sync::Arc};

/// Copies (and so pairs) one batch stages without a heap allocation.
const INLINE_PAIRS: usize = 16;
/// Slots of the per-call handle table before it grows (16 buffers cached).
const INLINE_SLOTS: usize = 32;
/// Most slots of the per-call handle table: buffers beyond half of it are looked up in the pool
/// for every entry that names them (correct, only slower).
const MAX_SLOTS: usize = 8192;
const _: () = assert!(INLINE_SLOTS.is_power_of_two() && MAX_SLOTS.is_power_of_two());
/// A slot of the per-call handle table: `handle` 0 is empty (handles are never 0); `index` is
/// the buffer's hold in the batch's [`Holds`].
#[derive(Clone, Copy, Default)]
struct Slot {
    handle: u64,
    index: u32,
}

/// The per-call handle table of the buffers that are not resident (imports, an io_uring
/// command's registered range): buffer handle -> index of its hold, open addressing with linear
/// probing. Sized by the distinct buffers of the call, not by its entries: [`INLINE_SLOTS`]
/// slots inline, doubled (and rehashed) when half full, at most [`MAX_SLOTS`]. At half load a
/// miss (the first lookup of every buffer) probes about 2.5 slots, at 3/4 about 8.5.
struct Handles {
    inline: [Slot; INLINE_SLOTS],
    heap: KVVec<Slot>,
    /// Slots in use.
    used: usize,
}

impl Handles {
    fn new() -> Self {
        Self {
            inline: [Slot::default(); INLINE_SLOTS],
            heap: KVVec::new(),
            used: 0,
        }
    }

    fn table(&self) -> &[Slot] {
        if self.heap.is_empty() {
            &self.inline
        } else {
            &self.heap
        }
    }

    /// The record index of `handle` (not 0), if cached.
    fn find(&self, handle: u64) -> Option<usize> {
        let t = self.table();
        let mask = t.len() - 1;
        let mut i = resident::home(handle, mask);
        // The table is never full (at most half), so the probe meets an empty slot.
        loop {
            // PANIC: `i` is masked to the table.
            let s = t[i];
            if s.handle == handle {
                // CAST: record indices fit in u32 (at most 2 * MAX_BATCH records).
                return Some(s.index as usize);
            }
            if s.handle == 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Puts `handle` (not 0, not cached) into `t`, which has a free slot.
    fn put(t: &mut [Slot], handle: u64, index: u32) {
        let mask = t.len() - 1;
        let mut i = resident::home(handle, mask);
        // PANIC: `i` is masked to the table.
        while t[i].handle != 0 {
            i = (i + 1) & mask;
        }
        t[i] = Slot { handle, index };
    }

    /// Caches record `index` for `handle` (not 0, not cached), doubling the table first if it
    /// would be more than half full; past [`MAX_SLOTS`] the handle is not cached.
    ///
    /// # Errors
    ///
    /// `ENOMEM` if a larger table cannot be allocated (nothing changes then).
    fn insert(&mut self, handle: u64, index: usize) -> Result {
        let len = self.table().len();
        if 2 * (self.used + 1) > len {
            if len >= MAX_SLOTS {
                return Ok(());
            }
            let mut bigger = KVVec::from_elem(Slot::default(), 2 * len, GFP_KERNEL_ACCOUNT)?;
            for s in self.table().iter().filter(|s| s.handle != 0) {
                Self::put(&mut bigger, s.handle, s.index);
            }
            self.heap = bigger;
        }
        let t: &mut [Slot] = if self.heap.is_empty() {
            &mut self.inline
        } else {
            &mut self.heap
        };
        // CAST: at most 2 * MAX_BATCH records.
        Self::put(t, handle, index as u32);
        self.used += 1;
        Ok(())
    }
}

/// The pairs of one prepare call, the largest number of pairs one of its copies took, the
/// buffers they hold, and the OR of their flags.
pub(crate) struct Batch {
    inline: [Copy; INLINE_PAIRS],
    n_inline: usize,
    heap: KVVec<Copy>,
    /// Pairs of the largest copy (1 unless split).
    pub(crate) largest: u32,
    /// One reference per distinct buffer: each buffer of the call is looked up once and held
    /// once; the copies name it by its hold's index.
    holds: Holds,
    /// The flags of every copy, OR-ed.
    pub(crate) flags: u32,
    /// Handle -> hold index, of the buffers not resident.
    handles: Handles,
    /// The buffers of the last copy added, when both are contiguous and the destination
    /// writable: a copy naming the same two handles (most entries of a batch) is checked
    /// against them without a lookup.
    last: Option<Last>,
    /// Bytes of all copies.
    pub(crate) bytes: u64,
}

/// One side of [`Last`]: a held, contiguous buffer.
#[derive(Clone, Copy)]
struct Side {
    handle: u64,
    /// Bytes.
    size: u64,
    /// Device-fabric address of byte 0 (route applied).
    base: u64,
}

impl Side {
    /// The side of buffer `handle`, resident at `p`.
    fn of(handle: u64, p: &Place) -> Self {
        Self {
            handle,
            size: p.size,
            base: p.base,
        }
    }

    /// The address of bytes `[offset, offset + len)` ([`Buffer::check_range`]).
    ///
    /// # Errors
    ///
    /// `ERANGE` if they do not lie inside the buffer.
    #[inline(always)]
    fn at(&self, offset: u64, len: u32) -> Result<u64> {
        crate::buffer::in_range(self.size, offset, u64::from(len))?;
        Ok(self.base + offset)
    }
}

/// A buffer a copy names, found for the call ([`Batch::resolve`]).
enum Found {
    /// Resident (driver-allocated, contiguous): where it is.
    Resident(Place),
    /// Held by the call's counted reference at this index (an import, or an io_uring
    /// command's registered range).
    Held(usize),
}

/// Where a buffer of a copy is, for its spans ([`Batch::located`]).
enum Located {
    /// Contiguous from this device-fabric address (a resident buffer).
    Linear(u64),
    /// A buffer the call holds, by a reference apart from the batch's holds.
    Held(Arc<Buffer>),
}

impl Located {
    /// The span from byte `offset` (the host route `route` applied).
    fn span(&self, route: u64, offset: u64) -> Span<'_> {
        match self {
            Located::Linear(base) => Span::Linear(base + offset),
            // Held: no check that the memory is still there.
            Located::Held(b) => b.span_at(b.held_base(route), offset),
        }
    }
}

/// The source and destination of the last copy of a [`Batch`] (see `Batch::last`).
#[derive(Clone, Copy)]
struct Last {
    src: Side,
    dst: Side,
}

/// A copy that names nothing (an unused inline slot).
const NO_COPY: Copy = Copy {
    src: 0,
    dst: 0,
    len: DescLen::MAX,
    barrier: Barrier::None,
};

impl Batch {
    /// An empty batch for `entries` copies.
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    pub(crate) fn new(entries: usize) -> Result<Self> {
        let mut b = Self {
            inline: [NO_COPY; INLINE_PAIRS],
            n_inline: 0,
            heap: KVVec::new(),
            largest: 1,
            holds: Holds::default(),
            flags: 0,
            handles: Handles::new(),
            last: None,
            bytes: 0,
        };
        // Sized by the batch: a pair per entry unless a copy is split. The buffer records and
        // the handle table grow with the distinct buffers named.
        if entries > INLINE_PAIRS {
            b.heap.reserve(entries, GFP_KERNEL_ACCOUNT)?;
        }
        Ok(b)
    }

    /// Holds `buf` as the buffer the copies name as `NEURON_UDMA_FIXED_BUFFER` (an io_uring
    /// command's registered buffer range, in no file's table). Called before any copy is added.
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    pub(crate) fn hold_fixed(&mut self, buf: Arc<Buffer>) -> Result {
        // Its only references are the submission's: released in process context.
        let index = self.holds.take_released(buf)?;
        self.handles.insert(uapi::FIXED_BUFFER, index)
    }

    /// The pairs, in order.
    pub(crate) fn copies(&self) -> &[Copy] {
        if self.heap.capacity() == 0 {
            &self.inline[..self.n_inline]
        } else {
            &self.heap
        }
    }

    /// Number of pairs.
    pub(crate) fn pairs(&self) -> u32 {
        // CAST: at most MAX_BATCH copies of at most 33 pairs each.
        self.copies().len() as u32
    }

    /// Takes the buffer holds, for the queue to keep until the engine is done, with the use of
    /// the resident buffers that `res`, the call's session, stamped: it ends when the holds
    /// are dropped.
    ///
    /// # Errors
    ///
    /// `ENOMEM` (the batch is dropped unused, and the session unwritten).
    pub(crate) fn take_holds(&mut self, res: &mut Session<'_>) -> Result<Holds> {
        res.finish(&mut self.holds)?;
        Ok(core::mem::take(&mut self.holds))
    }

    /// The buffer of hold `i`.
    fn get(&self, i: usize) -> Result<&Arc<Buffer>> {
        // Never `EINVAL`: `resolve` returns indices of holds.
        self.holds.get(i).ok_or(EINVAL)
    }

    /// Checks that bytes `[offset, offset + len)` lie inside `f` ([`Buffer::check_range`]).
    ///
    /// # Errors
    ///
    /// `ERANGE` if they do not.
    fn check_range(&self, f: &Found, offset: u64, len: u64) -> Result {
        match f {
            Found::Resident(p) => crate::buffer::in_range(p.size, offset, len),
            Found::Held(i) => self.get(*i)?.check_range(offset, len),
        }
    }

    /// Checks that the engine may write `f` ([`Buffer::check_writable`]).
    ///
    /// # Errors
    ///
    /// `EPERM` if it may not.
    fn check_writable(&self, f: &Found) -> Result {
        match f {
            Found::Resident(Place {
                writable: false, ..
            }) => Err(EPERM),
            Found::Resident(_) => Ok(()),
            Found::Held(i) => self.get(*i)?.check_writable(),
        }
    }

    /// The [`Side`] of `f`, buffer `handle`, for a copy that found it contiguous.
    fn side(&self, f: &Found, handle: u64, route: u64) -> Result<Side> {
        match f {
            Found::Resident(p) => Ok(Side::of(handle, p)),
            Found::Held(i) => {
                let b = self.get(*i)?;
                Ok(Side {
                    handle,
                    size: b.size,
                    base: b.held_base(route),
                })
            }
        }
    }

    /// Where `f` is, for its spans: a resident buffer's address, or a counted reference to
    /// the buffer the call holds (an import's runs).
    fn located(&self, f: &Found) -> Result<Located> {
        match f {
            Found::Resident(p) => Ok(Located::Linear(p.base)),
            Found::Held(i) => Ok(Located::Held(self.get(*i)?.clone())),
        }
    }

    /// Appends pair `c`: into the inline array while the batch is small, else into the heap
    /// array (reserved for a pair per entry by [`Self::new`], so it grows only for split
    /// copies).
    #[inline(always)]
    fn push(&mut self, c: Copy) -> Result {
        if self.heap.capacity() != 0 {
            return match self.heap.push_within_capacity(c) {
                Ok(()) => Ok(()),
                Err(e) => self.push_grow(e.0),
            };
        }
        if let Some(slot) = self.inline.get_mut(self.n_inline) {
            *slot = c;
            self.n_inline += 1;
            return Ok(());
        }
        self.push_grow(c)
    }

    /// [`Self::push`] when the array in use is full: the inline pairs move to the heap first.
    #[inline(never)]
    fn push_grow(&mut self, c: Copy) -> Result {
        if self.heap.capacity() == 0 {
            self.heap.reserve(INLINE_PAIRS * 2, GFP_KERNEL_ACCOUNT)?;
            for x in &self.inline[..self.n_inline] {
                self.heap.push(*x, GFP_KERNEL_ACCOUNT)?;
            }
        }
        self.heap.push(c, GFP_KERNEL_ACCOUNT)?;
        Ok(())
    }

    /// Buffer `handle` of the call's file (its session `res`), once per call: a
    /// driver-allocated buffer through the queue's resident set ([`Session::resolve`]), which
    /// stamps it with the call, or an import (or the io_uring command's range) held by a reference
    /// of the call's own, found again in the per-call table.
    ///
    /// # Errors
    ///
    /// `ENOENT` for an unknown handle or a buffer being freed, `ENXIO` for a revoked import,
    /// `ENOMEM` (see [`Session::resolve`]).
    #[inline(always)]
    fn resolve(&mut self, res: &mut Session<'_>, handle: u64) -> Result<Found> {
        if handle != 0 && self.handles.used != 0 {
            if let Some(index) = self.handles.find(handle) {
                return Ok(Found::Held(index));
            }
        }
        match res.resolve(handle)? {
            Resolved::Resident(p) => Ok(Found::Resident(p)),
            Resolved::Import(buf) => {
                let index = self.holds.take(buf)?;
                // Cached once held (a failed call drops the whole batch anyway).
                self.handles.insert(handle, index)?;
                Ok(Found::Held(index))
            }
        }
    }

    /// Validates `copies`, in order, and appends their pairs ([`Self::add`] each).
    ///
    /// # Errors
    ///
    /// Those of [`Self::add`], for the first copy that fails (the batch is then dropped).
    pub(crate) fn add_all(
        &mut self,
        res: &mut Session<'_>,
        route: u64,
        copies: &[uapi::neuron_udma_copy],
    ) -> Result {
        for c in copies {
            self.add(res, route, c)?;
        }
        Ok(())
    }

    /// Validates copy `c` of the open file of the call's session `res` (its buffers found
    /// through it, host route `route`) and appends its pair, or with `NEURON_UDMA_COPY_SPLIT`
    /// one pair per piece of a copy that crosses runs of an imported buffer (each with the
    /// copy's barrier).
    ///
    /// A copy naming the same two handles as the one before, both contiguous, is checked
    /// against that copy's buffers ([`Last`]) in line: the same checks in the same order, so
    /// the same errors, without a lookup; one naming two buffers resident on the queue is
    /// checked in line too ([`Session::resident`]).
    ///
    /// # Errors
    ///
    /// `EINVAL` (size 0 or above 64 KiB, bad barrier, unknown flags, reserved field set),
    /// `ENOENT` (unknown handle, or a buffer whose `MEM_FREE` is under way), `ERANGE` (range
    /// outside a buffer), `EPERM` (a destination the engine may not write), `EXDEV` (a copy
    /// that needs several pairs without `NEURON_UDMA_COPY_SPLIT`), `ENODEV`, `ENOMEM`.
    #[inline(always)]
    fn add(&mut self, res: &mut Session<'_>, route: u64, c: &uapi::neuron_udma_copy) -> Result {
        use uapi::NEURON_UDMA_COPY_SPLIT as SPLIT;
        // `NEURON_UDMA_COPY_DST_INT` is reserved since ABI 3 (no interrupt is handled).
        if c.reserved != 0 || c.flags & !SPLIT != 0 {
            return Err(EINVAL);
        }
        // EINVAL for size 0 or above one pair, before any lookup.
        let len = split::copy_len(c.size)?;
        let barrier = Barrier::try_from(c.barrier)?;
        self.bytes += u64::from(c.size);
        if let Some(last) = &self.last {
            if last.src.handle == c.src_handle && last.dst.handle == c.dst_handle {
                let src = last.src.at(c.src_offset, c.size)?;
                let dst = last.dst.at(c.dst_offset, c.size)?;
                self.flags |= c.flags;
                return self.push(Copy {
                    src,
                    dst,
                    len,
                    barrier,
                });
            }
        }
        // Two buffers resident on the queue already (in line): the checks of `add_looked_up`,
        // in its order.
        if let Some(sp) = res.resident(c.src_handle) {
            if let Some(dp) = res.resident(c.dst_handle) {
                let size = u64::from(c.size);
                crate::buffer::in_range(sp.size, c.src_offset, size)?;
                crate::buffer::in_range(dp.size, c.dst_offset, size)?;
                if !dp.writable {
                    return Err(EPERM);
                }
                return self.add_linear(
                    c,
                    Side::of(c.src_handle, &sp),
                    Side::of(c.dst_handle, &dp),
                    len,
                    barrier,
                );
            }
        }
        self.add_looked_up(res, route, c, len, barrier)
    }

    /// Appends the pair of copy `c` between the contiguous buffers `src` and `dst`, checked:
    /// one pair, as `UserPairs::new` makes of two linear spans; the next copy between the same
    /// two is checked against them in line ([`Last`]).
    #[inline(always)]
    fn add_linear(
        &mut self,
        c: &uapi::neuron_udma_copy,
        src: Side,
        dst: Side,
        len: DescLen,
        barrier: Barrier,
    ) -> Result {
        let pair = Copy {
            src: src.base + c.src_offset,
            dst: dst.base + c.dst_offset,
            len,
            barrier,
        };
        self.last = Some(Last { src, dst });
        self.flags |= c.flags;
        self.push(pair)
    }

    /// [`Self::add`] for a copy that names other buffers than the one before, not both
    /// resident: both looked up (once per call, [`Self::resolve`]) and checked.
    #[inline(never)]
    fn add_looked_up(
        &mut self,
        res: &mut Session<'_>,
        route: u64,
        c: &uapi::neuron_udma_copy,
        len: DescLen,
        barrier: Barrier,
    ) -> Result {
        use uapi::NEURON_UDMA_COPY_SPLIT as SPLIT;
        let size = u64::from(c.size);
        let s = self.resolve(res, c.src_handle)?;
        self.check_range(&s, c.src_offset, size)?;
        let d = self.resolve(res, c.dst_handle)?;
        self.check_range(&d, c.dst_offset, size)?;
        self.check_writable(&d)?;
        if let (Found::Resident(sp), Found::Resident(dp)) = (&s, &d) {
            // Two driver-allocated (contiguous) buffers, one not resident before this call.
            let (src, dst) = (Side::of(c.src_handle, sp), Side::of(c.dst_handle, dp));
            return self.add_linear(c, src, dst, len, barrier);
        }
        // A side is an import: its runs are borrowed from references taken apart from the
        // batch's holds, which the pairs are pushed beside. Both are held (or resident): their
        // bases need no check that the memory is still there.
        let (sl, dl) = (self.located(&s)?, self.located(&d)?);
        let mut pairs = UserPairs::new(
            sl.span(route, c.src_offset),
            dl.span(route, c.dst_offset),
            len,
            barrier,
        );
        if let UserPairs::One(Some(pair)) = pairs {
            // An import of one run: contiguous too, so the next copy between the same two is
            // checked in line as well.
            self.last = Some(Last {
                src: self.side(&s, c.src_handle, route)?,
                dst: self.side(&d, c.dst_handle, route)?,
            });
            self.flags |= c.flags;
            return self.push(pair);
        }
        // ERANGE for a span too short for the copy (the ranges were checked above).
        let n = pairs.count_pairs()?;
        if n > 1 && c.flags & SPLIT == 0 {
            return Err(EXDEV);
        }
        self.flags |= c.flags;
        self.largest = self.largest.max(n);
        for pair in &mut pairs {
            self.push(pair?)?;
        }
        Ok(())
    }
}

/// The bytes of an io_uring command's registered range that its copies `staged` name as
/// `NEURON_UDMA_FIXED_BUFFER` (up to the furthest, from offset 0), and whether one writes it.
///
/// # Errors
///
/// `EINVAL` if no copy names it, `EFAULT` if a copy reaches past [`MAX_IMPORT_SIZE`] (the
/// largest registered buffer io_uring takes is 1 GiB: no range of one reaches that far).
pub(crate) fn fixed_extent(staged: &[uapi::neuron_udma_copy]) -> Result<(u64, bool)> {
    let (mut len, mut write) = (0u64, false);
    for c in staged {
        for (handle, offset, dst) in [
            (c.src_handle, c.src_offset, false),
            (c.dst_handle, c.dst_offset, true),
        ] {
            if handle == uapi::FIXED_BUFFER {
                let end = offset.checked_add(u64::from(c.size)).ok_or(EFAULT)?;
                len = len.max(end);
                write |= dst;
            }
        }
    }
    match len {
        0 => Err(EINVAL),
        n if n > MAX_IMPORT_SIZE => Err(EFAULT),
        n => Ok((n, write)),
    }
}

#[cfg(neuron_udma_kunit)]
#[kunit_tests(neuron_udma_batch)]
mod tests {
    use super::*;

    #[test]
    fn fixed_extent_is_the_furthest_byte_named() -> Result {
        use uapi::FIXED_BUFFER as F;
        let c = |src_handle, src_offset, dst_handle, dst_offset, size| uapi::neuron_udma_copy {
            src_handle,
            src_offset,
            dst_handle,
            dst_offset,
            size,
            ..Default::default()
        };
        // Read only: the furthest source byte; written: a destination names it.
        assert_eq!(fixed_extent(&[c(F, 100, 7, 0, 4096)])?, (4196, false));
        let both = [c(F, 0, 7, 0, 10), c(7, 0, F, 65536, 1), c(F, 5000, 7, 0, 3)];
        assert_eq!(fixed_extent(&both)?, (65537, true));
        // Up to 1 GiB exactly; past it, or wrapping: EFAULT; not named at all: EINVAL.
        let gib = MAX_IMPORT_SIZE;
        assert_eq!(fixed_extent(&[c(7, 0, F, gib - 4096, 4096)])?, (gib, true));
        assert_eq!(fixed_extent(&[c(F, gib, 7, 0, 1)]), Err(EFAULT));
        assert_eq!(
            fixed_extent(&[c(F, u64::MAX - 10, 7, 0, 4096)]),
            Err(EFAULT)
        );
        assert_eq!(fixed_extent(&[c(7, 0, 8, 0, 4096)]), Err(EINVAL));
        Ok(())
    }

    #[test]
    fn handle_table_grows_with_the_buffers_not_the_entries() -> Result {
        let mut h = Handles::new();
        // Sequential handles, as the pool hands them out, and a few far apart.
        let handle = |k: usize| {
            if k % 7 == 0 {
                (k as u64) << 32 | 1
            } else {
                k as u64 + 1
            }
        };
        for k in 0..16 {
            h.insert(handle(k), k)?;
        }
        // 16 buffers fit the inline 32 slots at half: nothing allocated.
        assert!(h.heap.is_empty());
        h.insert(handle(16), 16)?;
        assert_eq!(h.table().len(), 2 * INLINE_SLOTS);
        for k in 17..MAX_SLOTS {
            h.insert(handle(k), k)?;
        }
        // The table stops at MAX_SLOTS; past half of it a handle is not cached.
        assert_eq!(h.table().len(), MAX_SLOTS);
        let cached = MAX_SLOTS / 2;
        for k in 0..MAX_SLOTS {
            let want = if k < cached { Some(k) } else { None };
            assert_eq!(h.find(handle(k)), want);
        }
        assert_eq!(h.find(u64::MAX), None);
        Ok(())
    }
}
