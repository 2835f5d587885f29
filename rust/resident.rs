// SPDX-License-Identifier: GPL-2.0

//! The buffers a file's queue instance has been asked to copy, held across its submissions:
//! the queue's *resident set*. A driver-allocated buffer (host or device memory) that a prepare
//! call on the queue names is looked up in the pool once, held by one count of its pool shard
//! ([`Buffer::hold_pooled`]) for as long as it stays resident, and from then on found by its
//! handle in this table (open addressing in plain memory, under the set's lock, taken once per
//! call; a lock of the queue's own, so threads on different queues do not serialise). The entry
//! keeps what a pair needs of the buffer ([`Place`]): a call never touches the records.
//!
//! Calls are numbered (their *stamp*, one per hold of the lock), and each stamps the entries
//! it names, in plain memory too. A submission's use is one record per call ([`Uses`]: its
//! stamp, and a flag that the submission's [`Holds`] sets when it is dropped, wherever that
//! happens; the table reads it the next time it is locked). An entry is *settled*, free to
//! leave, once every submission with a stamp up to its own is done ([`Table::settled`]): every
//! submission that names it has such a stamp, whatever order they end in. A queue's
//! submissions end in the order they were written (the rings are FIFO; a reset or a pause ends
//! them all; only a write that failed, never rung, is done out of order), which makes this as
//! tight as a count per buffer. No per-buffer list or count: a call that fails puts back the
//! stamps it changed (a chain through the entries it stamped).
//!
//! An entry leaves, and its pool hold goes back, only when no submission uses it: when
//! `MEM_FREE` asks for the buffer ([`Resident::evict`]), and when the queue instance ends
//! (`Channel::end_resident`: released, its file closed, or unbound; [`Resident::end`]). Until
//! then `MEM_FREE` finds the buffer held: `EBUSY` while a submission that the engine has not
//! consumed uses it, as before.
//!
//! Why: with the lookup of every buffer in the pool per call (its shard's lock, the XArray
//! walk, the count, the record's fields), a call whose entries each name other buffers cost
//! 5.8x one that names two (Documentation/benchmarks.rst, (b)). Imports and io_uring registered
//! ranges are not resident: they are held per submission by a counted reference, which a
//! revocation waits for.

use crate::{
    buffer::Buffer,
    holds::{Holds, Shard, Uses},
    kfac::sched,
    pool::{BufferPool, Held},
};
use core::ptr::NonNull;
use kernel::{
    new_mutex,
    prelude::*,
    sync::{Arc, Mutex, MutexGuard},
    time::Delta,
};

/// Slots of a table when its first buffer comes (then doubled when half full).
const FIRST_SLOTS: usize = 64;

/// Pool holds given back per hold of the shard's lock when many entries leave at once.
const UNHOLD_BATCH: usize = 32;

/// Where a resident buffer is, for the pairs that name it: what a prepare call needs of it,
/// copied from the record when it became resident (they never change while it is), so that
/// a call touches only the table, never the records.
#[derive(Clone, Copy)]
pub(crate) struct Place {
    /// Bytes.
    pub(crate) size: u64,
    /// Device-fabric address of byte 0, the host route applied ([`Buffer::held_base`]).
    pub(crate) base: u64,
    /// Whether the engine may write it ([`Buffer::check_writable`]).
    pub(crate) writable: bool,
}

/// One resident buffer, or a free entry (`handle` 0: handles are never 0).
#[derive(Clone, Copy)]
struct Entry {
    handle: u64,
    /// The record, kept alive by the entry's hold of its pool shard (see [`Resident`]).
    buf: Option<NonNull<Buffer>>,
    place: Place,
    /// The last call that named the buffer and wrote its submission (or the call under way):
    /// the buffer is used until every submission up to it is done. 0: none.
    stamp: u64,
    /// While the call under way has stamped the entry: its stamp before, which that call puts
    /// back if it fails ([`Session`]).
    prev: u64,
    /// While the call under way has stamped the entry: the entry it stamped before this one
    /// (+ 1; 0 ends the chain).
    next: u32,
}

const FREE: Entry = Entry {
    handle: 0,
    buf: None,
    place: Place {
        size: 0,
        base: 0,
        writable: false,
    },
    stamp: 0,
    prev: 0,
    next: 0,
};

/// The table behind a [`Resident`]'s lock.
struct Table {
    /// Open addressing, linear probing: 0 empty, else an entry index + 1. A power of two long,
    /// at most half full.
    slots: KVVec<u32>,
    entries: KVVec<Entry>,
    /// Indexes of free entries; room for every entry (so a removal never allocates).
    free: KVVec<u32>,
    /// The last call's stamp.
    stamp: u64,
    /// The uses of the submissions written, in stamp order, until seen done.
    live: KVVec<Arc<Uses>>,
    /// `live`'s length after its last full look ([`Table::collect`]).
    looked: usize,
    /// Why the queue instance ended ([`Resident::end`]): no call begins any more.
    ended: Option<Error>,
}

/// Where buffer handle `handle` (not 0) probes first in an open-addressing table of length
/// `mask + 1`, a power of two: Fibonacci hashing (handles are sequential). The resident table's
/// and the per-call table's (`batch.rs`).
pub(crate) fn home(handle: u64, mask: usize) -> usize {
    // CAST: the product's top bits, masked below the length.
    (handle.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize & mask
}

/// The slot of `handle` (not 0) in a [`Table`]'s `slots` and the index of its entry in
/// `entries`, if resident.
#[inline(always)]
fn probe(slots: &[u32], entries: &[Entry], handle: u64) -> Option<(usize, usize)> {
    if slots.is_empty() {
        return None;
    }
    let mask = slots.len() - 1;
    let mut i = home(handle, mask);
    // At most half full: the probe meets an empty slot.
    loop {
        // PANIC: `i` is masked to the slots.
        let s = slots[i] as usize;
        if s == 0 {
            return None;
        }
        // PANIC: a slot holds the index of an entry in use.
        if entries[s - 1].handle == handle {
            return Some((i, s - 1));
        }
        i = (i + 1) & mask;
    }
}

impl Table {
    /// A table of no buffer; nothing allocated.
    fn empty() -> Self {
        Self {
            slots: KVVec::new(),
            entries: KVVec::new(),
            free: KVVec::new(),
            stamp: 0,
            live: KVVec::new(),
            looked: 0,
            ended: None,
        }
    }

    /// The slot of `handle` (not 0) and its entry's index, if resident.
    #[inline(always)]
    fn find(&self, handle: u64) -> Option<(usize, usize)> {
        probe(&self.slots, &self.entries, handle)
    }

    /// Entries in use: every entry but the free ones.
    fn used(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// The stamp below which every entry is settled: that of the first submission written and
    /// not done, or `u64::MAX` if none is left (see the module documentation).
    fn settled(&self) -> u64 {
        self.live
            .iter()
            .find(|u| !u.is_done())
            .map_or(u64::MAX, |u| u.stamp)
    }

    /// Puts entry `e` (in use, not in `slots`) into `slots`, which has an empty slot.
    fn put(slots: &mut [u32], entries: &[Entry], e: usize) {
        let mask = slots.len() - 1;
        // PANIC: `e` is an entry.
        let mut i = home(entries[e].handle, mask);
        while slots[i] != 0 {
            i = (i + 1) & mask;
        }
        // CAST: at most `max_buffers` (a u32) entries.
        slots[i] = e as u32 + 1;
    }

    /// Makes room for one more entry: the slots doubled (and rehashed) if it would make them
    /// more than half full, an entry and its place in `free`.
    ///
    /// # Errors
    ///
    /// `ENOMEM`; nothing changes then.
    fn reserve_one(&mut self) -> Result {
        let len = self.slots.len();
        if 2 * (self.used() + 1) > len {
            let mut bigger =
                KVVec::from_elem(0u32, (2 * len).max(FIRST_SLOTS), GFP_KERNEL_ACCOUNT)?;
            for (e, entry) in self.entries.iter().enumerate() {
                if entry.handle != 0 {
                    Self::put(&mut bigger, &self.entries, e);
                }
            }
            self.slots = bigger;
        }
        if self.free.is_empty() {
            self.entries.reserve(1, GFP_KERNEL_ACCOUNT)?;
            self.free
                .reserve(self.entries.len() + 1, GFP_KERNEL_ACCOUNT)?;
        }
        Ok(())
    }

    /// Adds the entry of `handle`, for which [`Self::reserve_one`] made room; returns its index.
    fn add(&mut self, entry: Entry) -> usize {
        let e = match self.free.pop() {
            Some(e) => e as usize,
            None => {
                // Cannot fail: `reserve_one` made room.
                let _ = self.entries.push_within_capacity(entry);
                self.entries.len() - 1
            }
        };
        // PANIC: `e` is an entry.
        self.entries[e] = entry;
        Self::put(&mut self.slots, &self.entries, e);
        e
    }

    /// Takes the entry in slot `i` out of the table (backward-shift deletion: the entries
    /// after it in its probe run move up, so lookups need no tombstones) and frees it; returns
    /// its buffer.
    fn remove(&mut self, mut i: usize) -> Option<NonNull<Buffer>> {
        let mask = self.slots.len() - 1;
        // PANIC: `i` is a slot in use.
        let e = self.slots[i] as usize - 1;
        let buf = self.entries[e].buf;
        loop {
            let mut j = i;
            loop {
                j = (j + 1) & mask;
                let s = self.slots[j] as usize;
                if s == 0 {
                    self.slots[i] = 0;
                    self.entries[e] = FREE;
                    // Cannot fail: `free` has room for every entry.
                    // CAST: as in `put`.
                    let _ = self.free.push_within_capacity(e as u32);
                    return buf;
                }
                let k = home(self.entries[s - 1].handle, mask);
                // The entry at `j` may fill slot `i` unless its home lies cyclically in
                // `(i, j]`.
                let stays = if i <= j {
                    i < k && k <= j
                } else {
                    i < k || k <= j
                };
                if !stays {
                    break;
                }
            }
            self.slots[i] = self.slots[j];
            i = j;
        }
    }

    /// Forgets the uses of the submissions seen done at the front of `live` (a queue's
    /// submissions end in order). When `live` doubled since the last look, those seen done
    /// elsewhere go too (a submission whose write failed after its call finished is done at
    /// once, behind one that may not be for long), so that `live` stays as long as the
    /// submissions in flight: amortised O(1) per call.
    fn collect(&mut self) {
        let n = self.live.iter().take_while(|u| u.is_done()).count();
        if n != 0 {
            // O(live) only when something at the front retired, which that many calls paid for.
            let mut k = 0;
            self.live.retain(|_| {
                k += 1;
                k > n
            });
            self.looked = self.looked.min(self.live.len());
        } else if self.live.len() >= 2 * self.looked.max(16) {
            self.live.retain(|u| !u.is_done());
            self.looked = self.live.len();
        }
    }
}

/// The resident set of one queue instance of a file (see the module documentation).
///
/// # Invariants
///
/// Every entry in use holds its buffer by one count of the buffer's pool shard, `shard`
/// ([`Buffer::hold_pooled`]), taken when it was added and given back when it leaves; an entry
/// that is not settled ([`Table::settled`]) does not leave. So the record an entry names is
/// alive while the entry is in use (a buffer with a pool hold never leaves its shard, whose
/// reference keeps it).
#[pin_data(PinnedDrop)]
pub(crate) struct Resident {
    shard: Arc<Shard>,
    #[pin]
    table: Mutex<Table>,
}

// SAFETY: the records the entries point to are `Sync` and reached only as `&Buffer`, under the
// table's lock; the pool holds go back under the shard's lock, from any thread.
unsafe impl Send for Table {}

impl Resident {
    /// An empty resident set for a queue of the file whose buffers are in pool shard `shard`.
    pub(crate) fn new(shard: Arc<Shard>) -> impl PinInit<Self> {
        pin_init!(Resident {
            shard,
            table <- new_mutex!(Table::empty()),
        })
    }

    /// Starts a prepare call of the open file `owner`, whose buffers are in `pool`, on a
    /// device whose host route is `route`: locks the table for it (one hold of the lock per
    /// call, kept until the call's submission is written or failed, so that the instance's
    /// end never finds a stamp that a call in flight has not settled). With `spin` (io_uring's
    /// non-blocking issue) the lock is waited for that long at most.
    ///
    /// # Errors
    ///
    /// `EAGAIN` if the lock stayed held for `spin`; the errno of the instance's end
    /// (`ECANCELED`, `ENODEV`) if it ended ([`Self::end`]).
    pub(crate) fn begin<'a>(
        &'a self,
        pool: &'a BufferPool,
        owner: u64,
        route: u64,
        spin: Option<Delta>,
    ) -> Result<Session<'a>> {
        let mut t = match spin {
            None => self.table.lock(),
            Some(spin) => sched::lock_within(&self.table, spin)?,
        };
        if let Some(e) = t.ended {
            return Err(e);
        }
        t.collect();
        t.stamp += 1;
        let stamp = t.stamp;
        Ok(Session {
            t,
            set: self,
            pool,
            owner,
            route,
            stamp,
            chain: 0,
            written: false,
        })
    }

    /// Lets buffer `handle` leave the set if no submission uses it (for `MEM_FREE`, which
    /// then decides on the buffer as on any other): its pool hold goes back.
    pub(crate) fn evict(&self, handle: u64) {
        let mut t = self.table.lock();
        t.collect();
        let Some((i, e)) = t.find(handle) else {
            return;
        };
        // PANIC: `find` returns an entry in use.
        if t.entries[e].stamp >= t.settled() {
            return;
        }
        if let Some(buf) = t.remove(i) {
            // SAFETY: the entry held its buffer until it left (the type invariant).
            unsafe { self.unhold(&[buf]) };
        }
    }

    /// Ends the set with its queue instance (`Channel::end_resident`, once `Channel::quiesce`
    /// took the queue, and with it every submission's holds): no call begins any more (`err`),
    /// and every buffer leaves ([`Self::flush`]); a call that was under way had its submission
    /// written (then taken with the queue) or put its stamps back (it keeps the lock until
    /// then). Returns how many stay (0).
    pub(crate) fn end(&self, err: Error) -> usize {
        self.table.lock().ended = Some(err);
        self.flush()
    }

    /// Lets every buffer leave that no submission uses. Returns how many stay.
    pub(crate) fn flush(&self) -> usize {
        let mut t = self.table.lock();
        t.collect();
        let settled = t.settled();
        let mut gone = KVec::new();
        for i in 0..t.slots.len() {
            // Restart at `i` after a removal: backward shift may move an entry into it.
            // PANIC: `i` is below the length.
            while t.slots[i] != 0 {
                let e = t.slots[i] as usize - 1;
                if t.entries[e].stamp >= settled {
                    break;
                }
                if let Some(buf) = t.remove(i) {
                    if gone.push(buf, GFP_KERNEL).is_err() {
                        // Given back one at a time when no list can be made.
                        // SAFETY: as in `evict`.
                        unsafe { self.unhold(&[buf]) };
                    }
                }
            }
        }
        // What stays is in use (counted apart: a shifted entry may be met twice above).
        let stay = t.used();
        drop(t);
        // SAFETY: as in `evict`: each entry held its buffer until it left above.
        unsafe { self.unhold(&gone) };
        stay
    }

    /// Gives back the pool holds of `bufs`, [`UNHOLD_BATCH`] per hold of the shard's lock
    /// (shared with other files).
    ///
    /// # Safety
    ///
    /// Each of `bufs` is a buffer held by one count of this set's shard that the caller owns
    /// (an entry that left, or a hold never made an entry) and touches no more.
    unsafe fn unhold(&self, bufs: &[NonNull<Buffer>]) {
        for chunk in bufs.chunks(UNHOLD_BATCH) {
            let _xa = self.shard.xa.lock();
            for buf in chunk {
                // SAFETY: the count is held (the function's contract), so the shard keeps the
                // record alive until it goes back here; nothing touches the buffer after.
                unsafe { buf.as_ref() }.unhold_pooled();
            }
        }
    }
}

#[pinned_drop]
impl PinnedDrop for Resident {
    fn drop(self: Pin<&mut Self>) {
        // The queue instance is gone, and every call that could use it: nothing uses an entry.
        // One still used would keep its buffer held (a leak, never a free under the engine).
        let stay = self.flush();
        kernel::warn_on!(stay != 0);
    }
}

/// One prepare call's hold of the resident table: its lock, its stamp, and the chain of the
/// entries it stamped. Dropped before [`Session::written`] (a failed call), it puts their
/// stamps back.
pub(crate) struct Session<'a> {
    t: MutexGuard<'a, Table>,
    set: &'a Resident,
    pool: &'a BufferPool,
    owner: u64,
    route: u64,
    stamp: u64,
    /// The last entry stamped (+ 1; 0: none), whose `next` leads to the one before. While a
    /// [`Pass`] lives, the pass's (written back when it is dropped).
    chain: u32,
    /// Whether the call's submission was written ([`Session::written`]).
    written: bool,
}

/// How a [`Session`] resolved a handle.
pub(crate) enum Resolved {
    /// Resident: used by the call until its submission's [`Holds`] is dropped.
    Resident(Place),
    /// An import (not resident): the caller holds it per submission.
    Import(Arc<Buffer>),
}

impl Session<'_> {
    /// Buffer `handle` of the call's file: a resident buffer is stamped with the call's stamp
    /// (once per call); a driver-allocated buffer not yet resident is looked up in the pool and
    /// held ([`BufferPool::hold_resident`]) first.
    ///
    /// # Errors
    ///
    /// `ENOENT` for an unknown handle, another file's buffer, or one that a `MEM_FREE` freed;
    /// `ENOMEM`. Nothing changes then.
    pub(crate) fn resolve(&mut self, handle: u64) -> Result<Resolved> {
        match self.resident(handle) {
            Some(p) => Ok(Resolved::Resident(p)),
            None => self.add(handle),
        }
    }

    /// [`Self::resolve`] of a buffer that is resident already: [`Pass::resident`] alone.
    #[inline(always)]
    pub(crate) fn resident(&mut self, handle: u64) -> Option<Place> {
        self.pass().resident(handle)
    }

    /// The call's lookups of resident buffers, for as long as the [`Pass`] lives.
    pub(crate) fn pass(&mut self) -> Pass<'_> {
        let t = &mut *self.t;
        Pass {
            slots: &t.slots,
            entries: &mut t.entries,
            stamp: self.stamp,
            chain: self.chain,
            session_chain: &mut self.chain,
        }
    }

    /// [`Self::resolve`] of a buffer that is not resident.
    #[inline(never)]
    fn add(&mut self, handle: u64) -> Result<Resolved> {
        let buf = match self
            .pool
            .hold_resident(self.owner, handle, &self.set.shard)?
        {
            Held::Import(buf) => return Ok(Resolved::Import(buf)),
            Held::Pooled(buf) => buf,
        };
        // Room after the lookup (an unknown handle is `ENOENT` however short memory is); if
        // there is none, the hold goes back and nothing changed.
        if let Err(e) = self.t.reserve_one() {
            // SAFETY: the pool counted this hold of `buf` in the set's shard just now, for this
            // call alone, and nothing touches it after.
            unsafe { self.set.unhold(&[buf]) };
            return Err(e);
        }
        // SAFETY: the pool counted a hold of `buf` for the entry made below, which keeps the
        // record alive while the entry is in use (the type invariant of `Resident`).
        let b = unsafe { buf.as_ref() };
        let place = Place {
            size: b.size,
            base: b.held_base(self.route),
            writable: b.check_writable().is_ok(),
        };
        let e = self.t.add(Entry {
            handle,
            buf: Some(buf),
            place,
            stamp: self.stamp,
            prev: 0,
            next: self.chain,
        });
        // CAST: as in `Table::put`.
        self.chain = e as u32 + 1;
        Ok(Resolved::Resident(place))
    }

    /// Ends the call's lookups: the buffers it stamped are used until `holds`, the
    /// submission's, is dropped. The session (and its lock) is kept until the submission is
    /// written ([`Self::written`]) or failed.
    ///
    /// # Errors
    ///
    /// `ENOMEM`; `holds` must be dropped unused then.
    pub(crate) fn finish(&mut self, holds: &mut Holds) -> Result {
        if self.chain == 0 {
            return Ok(());
        }
        self.t.live.reserve(1, GFP_KERNEL_ACCOUNT)?;
        let u = Arc::new(Uses::new(self.stamp), GFP_KERNEL_ACCOUNT)?;
        // Cannot fail: room was reserved.
        let _ = self.t.live.push_within_capacity(u.clone());
        holds.set_uses(u);
        Ok(())
    }

    /// Marks the call's submission written: the stamps stay. Without it, the session's drop
    /// puts them back (a call that failed, before or after [`Self::finish`]: its submission,
    /// never written, used nothing).
    pub(crate) fn written(mut self) {
        self.written = true;
    }
}

/// A [`Session`]'s lookups of buffers resident already (the common case, in line: the one
/// pass over a call's copies, `Batch::add_all_in_line`): the table's slots and entries as
/// slices and the chain of the entries the call stamped in the pass itself, so that a lookup
/// reloads none of them through the lock guard; the chain goes back to the session when the
/// pass is dropped (a failed call's stamps are put back from it).
pub(crate) struct Pass<'p> {
    slots: &'p [u32],
    entries: &'p mut [Entry],
    stamp: u64,
    /// As [`Session`]'s, until the pass is dropped.
    chain: u32,
    session_chain: &'p mut u32,
}

impl Pass<'_> {
    /// Where buffer `handle` is, stamped with the call's stamp (once per call), or `None` if it
    /// is not resident (an import, a buffer not named on the queue before, an unknown handle).
    #[inline(always)]
    pub(crate) fn resident(&mut self, handle: u64) -> Option<Place> {
        let (_, e) = probe(self.slots, self.entries, handle)?;
        // PANIC: `probe` returns an entry in use.
        let entry = &mut self.entries[e];
        if entry.stamp != self.stamp {
            entry.prev = entry.stamp;
            entry.stamp = self.stamp;
            entry.next = self.chain;
            // CAST: as in `Table::put`.
            self.chain = e as u32 + 1;
        }
        Some(entry.place)
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        *self.session_chain = self.chain;
    }
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if self.written {
            return;
        }
        // A failed call: the entries it stamped get their stamps back, latest first.
        let Self { t, chain, .. } = self;
        while *chain != 0 {
            // PANIC: the chain links entries in use.
            let e = &mut t.entries[*chain as usize - 1];
            e.stamp = e.prev;
            *chain = e.next;
        }
    }
}

#[cfg(neuron_udma_kunit)]
#[kunit_tests(neuron_udma_resident)]
mod tests {
    use super::*;

    fn entry(handle: u64) -> Entry {
        Entry { handle, ..FREE }
    }

    #[test]
    fn table_finds_what_it_holds_after_removals() -> Result {
        let mut t = Table::empty();
        // Sequential handles, as the pool hands them out, and some far apart.
        let handle = |k: u64| if k % 5 == 0 { k << 33 | 1 } else { k + 1 };
        const N: u64 = 300;
        for k in 0..N {
            t.reserve_one()?;
            t.add(entry(handle(k)));
        }
        assert_eq!(t.used(), N as usize);
        assert!(2 * t.used() <= t.slots.len());
        // Remove every third; the rest are still found, the removed not.
        for k in (0..N).step_by(3) {
            let (i, _) = t.find(handle(k)).ok_or(EINVAL)?;
            t.remove(i);
        }
        for k in 0..N {
            assert_eq!(t.find(handle(k)).is_some(), k % 3 != 0);
        }
        // Freed entries are reused: adding them back allocates no entry.
        let len = t.entries.len();
        for k in (0..N).step_by(3) {
            t.reserve_one()?;
            t.add(entry(handle(k)));
        }
        assert_eq!(t.entries.len(), len);
        assert!((0..N).all(|k| t.find(handle(k)).is_some()));
        assert_eq!(t.find(u64::MAX), None);
        Ok(())
    }

    #[test]
    fn entries_settle_when_the_submissions_up_to_their_stamp_are_done() -> Result {
        let mut t = Table::empty();
        let (a, b) = (
            Arc::new(Uses::new(2), GFP_KERNEL)?,
            Arc::new(Uses::new(4), GFP_KERNEL)?,
        );
        t.live.push(a.clone(), GFP_KERNEL)?;
        t.live.push(b.clone(), GFP_KERNEL)?;
        assert_eq!(t.settled(), 2);
        // The second done first (a write that failed): the first still bounds.
        b.retire();
        t.collect();
        assert_eq!((t.settled(), t.live.len()), (2, 2));
        a.retire();
        assert_eq!(t.settled(), u64::MAX);
        t.collect();
        assert!(t.live.is_empty());
        // Many done behind one that is not: gone once `live` doubled.
        let c = Arc::new(Uses::new(5), GFP_KERNEL)?;
        t.live.push(c.clone(), GFP_KERNEL)?;
        for stamp in 6..40 {
            let u = Arc::new(Uses::new(stamp), GFP_KERNEL)?;
            u.retire();
            t.live.push(u, GFP_KERNEL)?;
        }
        t.collect();
        assert_eq!((t.settled(), t.live.len()), (5, 1));
        Ok(())
    }
}
