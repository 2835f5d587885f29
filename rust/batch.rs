// SPDX-License-Identifier: GPL-2.0

//! The copies of one prepare call (`COPY_PREPARE_ONE`, `COPY_PREPARE`) translated into
//! descriptor pairs: every entry validated in one pass, its buffers found once per call (in
//! the queue's resident set, `resident.rs`; an import in a per-call table of handles), each
//! buffer held once for the whole submission ([`Holds`]). The pairs go:
//!
//! - one pass: when every copy names buffers resident on the queue, each pair is written ahead
//!   into the rings' free slots as its copy is checked ([`Batch::add_all_in_line`] into the
//!   queue's `Ahead`, under the queue lock: `Channel::prepare_in_line`), and published at the
//!   end;
//! - two passes: else (a buffer named for the first time, an import, a split copy), the pairs,
//!   as the splitter (`split.rs`) cuts each copy, are collected in an array ([`Copies`]) for
//!   the submission engine to write (`Channel::prepare`).

use crate::{
    buffer::{Buffer, MAX_IMPORT_SIZE},
    desc::{Barrier, DescLen},
    holds::Holds,
    queue::{Ahead, Copy},
    resident::{self, Pass, Place, Resolved, Session},
    span::Span,
    split::{self, UserPairs},
    uapi,
};
use kernel::{prelude::*, sync::Arc};

/// Copies (and so pairs) one batch stages without a heap allocation.
const INLINE_PAIRS: usize = 16;
/// Slots of the per-call handle table when its first buffer comes (16 buffers cached).
const FIRST_SLOTS: usize = 32;
/// Most slots of the per-call handle table: buffers beyond half of it are looked up in the pool
/// for every entry that names them (correct, only slower).
const MAX_SLOTS: usize = 8192;
const _: () = assert!(FIRST_SLOTS.is_power_of_two() && MAX_SLOTS.is_power_of_two());
/// A slot of the per-call handle table: `handle` 0 is empty (handles are never 0); `index` is
/// the buffer's hold in the batch's [`Holds`].
#[derive(Clone, Copy, Default)]
struct Slot {
    handle: u64,
    index: u32,
}

/// The per-call handle table of the buffers that are not resident (imports, an io_uring
/// command's registered range): buffer handle -> index of its hold, open addressing with linear
/// probing. Sized by the distinct buffers of the call, not by its entries: none until the first
/// such buffer, then [`FIRST_SLOTS`] slots, doubled (and rehashed) when half full, at most
/// [`MAX_SLOTS`]. At half load a miss (the first lookup of every buffer) probes about 2.5
/// slots, at 3/4 about 8.5. A call whose buffers are all resident (most) neither allocates nor
/// clears it.
struct Handles {
    slots: KVVec<Slot>,
    /// Slots in use.
    used: usize,
}

impl Handles {
    fn new() -> Self {
        Self {
            slots: KVVec::new(),
            used: 0,
        }
    }

    /// The record index of `handle` (not 0), if cached.
    fn find(&self, handle: u64) -> Option<usize> {
        let t = &self.slots;
        if t.is_empty() {
            return None;
        }
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
        let len = self.slots.len();
        if 2 * (self.used + 1) > len {
            if len >= MAX_SLOTS {
                return Ok(());
            }
            let size = (2 * len).max(FIRST_SLOTS);
            let mut bigger = KVVec::from_elem(Slot::default(), size, GFP_KERNEL_ACCOUNT)?;
            for s in self.slots.iter().filter(|s| s.handle != 0) {
                Self::put(&mut bigger, s.handle, s.index);
            }
            self.slots = bigger;
        }
        // CAST: at most 2 * MAX_BATCH records.
        Self::put(&mut self.slots, handle, index as u32);
        self.used += 1;
        Ok(())
    }
}

/// The pairs of a prepare call that goes the two-pass way, in order: inline while few, else in
/// a heap array reserved for a pair per entry.
pub(crate) struct Copies {
    inline: [Copy; INLINE_PAIRS],
    n_inline: usize,
    heap: KVVec<Copy>,
}

/// A copy that names nothing (an unused inline slot).
const NO_COPY: Copy = Copy {
    src: 0,
    dst: 0,
    len: DescLen::MAX,
    barrier: Barrier::None,
};

impl Copies {
    /// An empty array for the pairs of `entries` copies.
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    pub(crate) fn new(entries: usize) -> Result<Self> {
        let mut c = Self {
            inline: [NO_COPY; INLINE_PAIRS],
            n_inline: 0,
            heap: KVVec::new(),
        };
        // Sized by the batch: a pair per entry unless a copy is split.
        if entries > INLINE_PAIRS {
            c.heap.reserve(entries, GFP_KERNEL_ACCOUNT)?;
        }
        Ok(c)
    }

    /// The pairs, in order.
    pub(crate) fn as_slice(&self) -> &[Copy] {
        if self.heap.capacity() == 0 {
            &self.inline[..self.n_inline]
        } else {
            &self.heap
        }
    }

    /// Number of pairs.
    pub(crate) fn pairs(&self) -> u32 {
        // CAST: at most MAX_BATCH copies of at most 33 pairs each.
        self.as_slice().len() as u32
    }

    /// Appends `c`: into the inline array while the batch is small, else into the heap array
    /// (reserved for a pair per entry by [`Copies::new`], so it grows only for split copies).
    ///
    /// # Errors
    ///
    /// `ENOMEM` (a split copy's pairs beyond the reserve, and the array cannot grow).
    #[inline(always)]
    fn take(&mut self, c: Copy) -> Result {
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

    /// [`Self::take`] when the array in use is full: the inline pairs move to the heap first.
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
}

/// The checks of one prepare call's copies: the largest number of pairs one of them took, the
/// buffers they hold, the OR of their flags and their bytes (the pairs go into the rings ahead,
/// or into [`Copies`]).
pub(crate) struct Batch {
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

impl Last {
    /// The pair of copy `c` between these two buffers, whose ranges were checked: one pair, as
    /// `UserPairs::new` makes of two linear spans.
    #[inline(always)]
    fn pair(&self, c: &uapi::neuron_udma_copy, len: DescLen, barrier: Barrier) -> Copy {
        Copy {
            src: self.src.base + c.src_offset,
            dst: self.dst.base + c.dst_offset,
            len,
            barrier,
        }
    }

    /// The pair of copy `c` between these two buffers, its ranges checked ([`Side::at`]).
    ///
    /// # Errors
    ///
    /// `ERANGE` if either range does not lie inside its buffer (the source's checked first).
    #[inline(always)]
    fn checked_pair(
        &self,
        c: &uapi::neuron_udma_copy,
        len: DescLen,
        barrier: Barrier,
    ) -> Result<Copy> {
        Ok(Copy {
            src: self.src.at(c.src_offset, c.size)?,
            dst: self.dst.at(c.dst_offset, c.size)?,
            len,
            barrier,
        })
    }

    /// Whether copy `c` names these two buffers.
    #[inline(always)]
    fn names(&self, c: &uapi::neuron_udma_copy) -> bool {
        self.src.handle == c.src_handle && self.dst.handle == c.dst_handle
    }
}

/// The checks of copy `c`'s own fields, before any lookup: its pair's length and barrier.
///
/// # Errors
///
/// `EINVAL`: a reserved field or an unknown flag set (`NEURON_UDMA_COPY_DST_INT` is reserved
/// since ABI 3: no interrupt is handled), size 0 or above one pair, a bad barrier.
#[inline(always)]
fn fields(c: &uapi::neuron_udma_copy) -> Result<(DescLen, Barrier)> {
    if c.reserved != 0 || c.flags & !uapi::NEURON_UDMA_COPY_SPLIT != 0 {
        return Err(EINVAL);
    }
    Ok((split::copy_len(c.size)?, Barrier::try_from(c.barrier)?))
}

/// The buffers copy `c` names, if both are resident on the queue of the call's lookups `res`
/// already ([`Pass::resident`]), checked for the copy as `Batch::add_looked_up` checks
/// them, in its order; `None` if either is not (an import, a buffer not named on the queue
/// before, an unknown handle: the two-pass way looks them up).
///
/// # Errors
///
/// `ERANGE` (a range outside its buffer), `EPERM` (a destination the engine may not write).
#[inline(always)]
fn resident_sides(res: &mut Pass<'_>, c: &uapi::neuron_udma_copy) -> Result<Option<Last>> {
    let Some(sp) = res.resident(c.src_handle) else {
        return Ok(None);
    };
    let Some(dp) = res.resident(c.dst_handle) else {
        return Ok(None);
    };
    let size = u64::from(c.size);
    crate::buffer::in_range(sp.size, c.src_offset, size)?;
    crate::buffer::in_range(dp.size, c.dst_offset, size)?;
    if !dp.writable {
        return Err(EPERM);
    }
    Ok(Some(Last {
        src: Side::of(c.src_handle, &sp),
        dst: Side::of(c.dst_handle, &dp),
    }))
}

impl Batch {
    /// An empty batch: the buffer records and the handle table grow with the distinct buffers
    /// named.
    pub(crate) fn new() -> Self {
        Self {
            largest: 1,
            holds: Holds::default(),
            flags: 0,
            handles: Handles::new(),
            last: None,
            bytes: 0,
        }
    }

    /// Whether the copies may name an io_uring command's registered range ([`Self::hold_fixed`]):
    /// a lookup in the per-call table, so not a call for the one pass.
    pub(crate) fn has_fixed(&self) -> bool {
        self.handles.used != 0
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

    /// Validates `copies`, in order, and appends their pairs to `out` ([`Self::add`] each).
    ///
    /// # Errors
    ///
    /// Those of [`Self::add`], for the first copy that fails (the batch is then dropped).
    pub(crate) fn add_all(
        &mut self,
        res: &mut Session<'_>,
        route: u64,
        copies: &[uapi::neuron_udma_copy],
        out: &mut Copies,
    ) -> Result {
        for c in copies {
            self.add(res, route, c, out)?;
        }
        Ok(())
    }

    /// The one pass: validates `copies`, in order, and writes their pairs ahead into `out` as
    /// long as [`Self::pair_in_line`] makes them; the copies after one that name the same two
    /// buffers are a run ([`Self::add_run`]). Returns `false` at the first copy it cannot take
    /// (one that needs a lookup): the batch and what `out` took are then dropped, and the call
    /// goes the two-pass way ([`Self::add_all`] into a [`Copies`]), with the same session.
    ///
    /// # Errors
    ///
    /// Those of [`Self::pair_in_line`], for the first copy that fails, and `out`'s (the batch
    /// is then dropped).
    pub(crate) fn add_all_in_line(
        &mut self,
        res: &mut Session<'_>,
        copies: &[uapi::neuron_udma_copy],
        out: &mut Ahead<'_>,
    ) -> Result<bool> {
        let mut rest = copies;
        // The handles of the copy before (0: none; handles are never 0).
        let mut prev = (0, 0);
        let mut pass = res.pass();
        while !rest.is_empty() {
            // Copies that each name other buffers than the one before (as `pair_in_line`, whose
            // look at the copy before is the run's), up to a run or a copy that needs a lookup.
            let n = out.write_while(rest, |c| {
                if (c.src_handle, c.dst_handle) == prev {
                    return Ok(None);
                }
                let (len, barrier) = fields(c)?;
                let Some(sides) = resident_sides(&mut pass, c)? else {
                    return Ok(None);
                };
                prev = (c.src_handle, c.dst_handle);
                Ok(Some(sides.pair(c, len, barrier)))
            })?;
            // A run from `rest[n]` on: the copy before it (which passed) names its buffers.
            if n == rest.len() {
                break;
            }
            let (Some(before), Some(next)) = (n.checked_sub(1).map(|i| &rest[i]), rest.get(n))
            else {
                // A lookup at the first.
                return Ok(false);
            };
            if (next.src_handle, next.dst_handle) != prev {
                // A copy that needs a lookup.
                return Ok(false);
            }
            let Some(last) = resident_sides(&mut pass, before)? else {
                return Ok(false);
            };
            rest = &rest[n..];
            rest = &rest[self.add_run(last, rest, out)?..];
        }
        // Outside the loops of the pairs: every copy took one.
        for c in copies {
            self.flags |= c.flags;
            self.bytes += u64::from(c.size);
        }
        Ok(true)
    }

    /// Validates the copies from the first of `copies` on that name the buffers of `last`, as
    /// [`Self::pair_in_line`] does each, and writes their pairs ahead into `out` in one loop
    /// ([`Ahead::write_while`]: nothing in it but the checks and the stores). Returns how many
    /// it took: up to the first copy that names other buffers.
    ///
    /// # Errors
    ///
    /// `EINVAL`, `ERANGE` as [`Self::pair_in_line`] says, `out`'s.
    #[inline(always)]
    fn add_run(
        &mut self,
        last: Last,
        copies: &[uapi::neuron_udma_copy],
        out: &mut Ahead<'_>,
    ) -> Result<usize> {
        out.write_while(copies, |c| {
            if !last.names(c) {
                return Ok(None);
            }
            let (len, barrier) = fields(c)?;
            last.checked_pair(c, len, barrier).map(Some)
        })
    }

    /// Validates copy `c` of the open file of the call's session `res` (its buffers found
    /// through it, host route `route`) and appends its pair to `out`, or with
    /// `NEURON_UDMA_COPY_SPLIT` one pair per piece of a copy that crosses runs of an imported
    /// buffer (each with the copy's barrier): [`Self::pair_in_line`], else both buffers looked
    /// up and checked ([`Self::add_looked_up`]).
    ///
    /// # Errors
    ///
    /// `EINVAL` (size 0 or above 64 KiB, bad barrier, unknown flags, reserved field set),
    /// `ENOENT` (unknown handle, or a buffer whose `MEM_FREE` is under way), `ERANGE` (range
    /// outside a buffer), `EPERM` (a destination the engine may not write), `EXDEV` (a copy
    /// that needs several pairs without `NEURON_UDMA_COPY_SPLIT`), `ENODEV`, `ENOMEM`.
    #[inline(always)]
    fn add(
        &mut self,
        res: &mut Session<'_>,
        route: u64,
        c: &uapi::neuron_udma_copy,
        out: &mut Copies,
    ) -> Result {
        if let Some(pair) = self.pair_in_line(res, c)? {
            self.flags |= c.flags;
            self.bytes += u64::from(c.size);
            return out.take(pair);
        }
        // Checked by `pair_in_line` already.
        let (len, barrier) = fields(c)?;
        self.add_looked_up(res, route, c, len, barrier, out)
    }

    /// Validates copy `c` and returns its pair when that needs no lookup: a copy naming the
    /// same two handles as the one before, both contiguous, is checked against that copy's
    /// buffers ([`Last`]), and one naming two buffers resident on the queue against them
    /// ([`Pass::resident`]), in line. Returns `None` for any other copy, having checked only
    /// its fields (and stamped a side it found resident, as the call would anyway). The copy's
    /// flags and bytes are the caller's to count.
    ///
    /// # Errors
    ///
    /// `EINVAL` (size 0 or above 64 KiB, bad barrier, unknown flags, reserved field set),
    /// `ERANGE`, `EPERM` as [`Self::add`] says.
    #[inline(always)]
    fn pair_in_line(
        &mut self,
        res: &mut Session<'_>,
        c: &uapi::neuron_udma_copy,
    ) -> Result<Option<Copy>> {
        let (len, barrier) = fields(c)?;
        if let Some(last) = &self.last {
            if last.names(c) {
                return last.checked_pair(c, len, barrier).map(Some);
            }
        }
        let Some(sides) = resident_sides(&mut res.pass(), c)? else {
            return Ok(None);
        };
        self.last = Some(sides);
        Ok(Some(sides.pair(c, len, barrier)))
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
        out: &mut Copies,
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
            let last = Last {
                src: Side::of(c.src_handle, sp),
                dst: Side::of(c.dst_handle, dp),
            };
            // The next copy between the same two is checked against them in line.
            self.last = Some(last);
            self.flags |= c.flags;
            self.bytes += size;
            return out.take(last.pair(c, len, barrier));
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
            self.bytes += size;
            return out.take(pair);
        }
        // ERANGE for a span too short for the copy (the ranges were checked above).
        let n = pairs.count_pairs()?;
        if n > 1 && c.flags & SPLIT == 0 {
            return Err(EXDEV);
        }
        self.flags |= c.flags;
        self.bytes += size;
        self.largest = self.largest.max(n);
        for pair in &mut pairs {
            out.take(pair?)?;
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
        // Nothing until the first buffer.
        assert!(h.slots.is_empty());
        assert_eq!(h.find(handle(0)), None);
        for k in 0..16 {
            h.insert(handle(k), k)?;
        }
        // 16 buffers fit the first 32 slots at half.
        assert_eq!(h.slots.len(), FIRST_SLOTS);
        h.insert(handle(16), 16)?;
        assert_eq!(h.slots.len(), 2 * FIRST_SLOTS);
        for k in 17..MAX_SLOTS {
            h.insert(handle(k), k)?;
        }
        // The table stops at MAX_SLOTS; past half of it a handle is not cached.
        assert_eq!(h.slots.len(), MAX_SLOTS);
        let cached = MAX_SLOTS / 2;
        for k in 0..MAX_SLOTS {
            let want = if k < cached { Some(k) } else { None };
            assert_eq!(h.find(handle(k)), want);
        }
        assert_eq!(h.find(u64::MAX), None);
        Ok(())
    }
}
