// SPDX-License-Identifier: GPL-2.0

//! What a submission holds (the pairs of one prepare call): each buffer its pairs read or
//! write, once, until the engine is done with them (`queue.rs` drops the [`Holds`] when the
//! submission's fence retires, or when a reset or a pause of the queue drops it), so that
//! `MEM_FREE` is refused meanwhile. A driver-allocated buffer is held by a count under the
//! lock of its pool [`Shard`] (one of [`SHARDS`] handle indexes, chosen by the file's id): no
//! reference count and no atomic read-modify-write per buffer, and the counts given back 32
//! per hold of the lock. An import is held by a counted reference ([`InFlight`]), which its
//! revocation waits for.

use crate::{
    buffer::{Buffer, InFlight},
    kfac::sched::ReleaseQueue,
};
use core::ptr::NonNull;
use kernel::{
    impl_has_work, new_work,
    prelude::*,
    sync::{Arc, ArcBorrow},
    workqueue::{Work, WorkItem},
    xarray::{AllocKind, XArray},
};

/// Handle indexes of a [`BufferPool`](crate::pool::BufferPool), each for the files whose id
/// has that remainder: files look their buffers up under different locks (one XArray lock for
/// all files made two threads of two files spin on it, Documentation/benchmarks.rst).
pub(crate) const SHARDS: usize = 16;

/// One of a pool's [`SHARDS`] handle indexes: handle -> buffer, for the open files whose id
/// has its remainder. Its lock also counts the submissions' holds on its driver-allocated
/// buffers ([`Buffer::hold_pooled`]), and a buffer such a hold counts never leaves it, so the
/// shard's reference keeps the record alive for the hold. Reference-counted: a submission's
/// [`Holds`] keeps the shard whose lock gives its holds back.
#[pin_data]
pub(crate) struct Shard {
    #[pin]
    pub(crate) xa: XArray<Arc<Buffer>>,
}

impl Shard {
    /// [`SHARDS`] empty shards.
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    pub(crate) fn new_all() -> Result<KVec<Arc<Shard>>> {
        let mut v = KVec::with_capacity(SHARDS, GFP_KERNEL)?;
        for _ in 0..SHARDS {
            let shard = Arc::pin_init(
                pin_init!(Shard {
                    xa <- XArray::new(AllocKind::Alloc),
                }),
                GFP_KERNEL,
            )?;
            v.push(shard, GFP_KERNEL)?;
        }
        Ok(v)
    }
}

/// Buffers held inline by a [`Holds`] before it allocates: a copy names two, a small
/// gather/scatter batch a few more.
const HOLDS_INLINE: usize = 4;

/// Pooled holds a [`Holds`] gives back per hold of the shard's lock.
const UNHOLD_BATCH: usize = 32;

/// One buffer of a [`Holds`].
enum Hold {
    /// A counted reference: an import (its revocation waits for it) or the registered range
    /// of an io_uring command (in no shard).
    Counted(InFlight),
    /// A driver-allocated buffer held by its shard's count ([`Buffer::hold_pooled`]), given
    /// back by the [`Holds`] that owns it ([`Holds::drop`]).
    Pooled(PooledHold),
}

/// The record of a buffer held by its shard's count ([`Buffer::hold_pooled`]).
///
/// # Invariants
///
/// The pointer is to a [`Buffer`] in the [`Shard`] that the owning [`Holds`] keeps, whose
/// `held` count includes this hold until [`Holds::drop`] gives it back. A buffer with a
/// non-zero count never leaves its shard (`BufferPool::unlink`, `BufferPool::shutdown`), and
/// the shard's reference keeps the record alive: the pointer is valid while the hold lives.
struct PooledHold(NonNull<Buffer>);

// SAFETY: a `PooledHold` is a shared reference to a `Buffer` (which is `Sync`) for as long as
// the hold lives (the type invariant); it gives the count back under the shard's lock, from
// whichever thread drops its `Holds`.
unsafe impl Send for PooledHold {}
// SAFETY: as for `Send`: only `&Buffer` is reached through it.
unsafe impl Sync for PooledHold {}

impl PooledHold {
    fn buffer(&self) -> &Buffer {
        // SAFETY: the type invariant: the record is alive while the hold lives, and the borrow
        // does not outlive `self`.
        unsafe { self.0.as_ref() }
    }
}

impl Hold {
    fn buffer(&self) -> &Buffer {
        match self {
            Hold::Counted(f) => f.buffer(),
            Hold::Pooled(p) => p.buffer(),
        }
    }
}

/// The buffers of one submission, one hold per distinct buffer (the caller adds each buffer
/// once): driver-allocated ones counted under their shard's lock
/// ([`BufferPool::hold`](crate::pool::BufferPool::hold)), imports by [`InFlight`] references,
/// and at most one buffer released in process context ([`Release`]).
#[derive(Default)]
pub(crate) struct Holds {
    few: [Option<Hold>; HOLDS_INLINE],
    n: usize,
    more: KVec<Hold>,
    /// The shard that counts the pooled holds (one file's buffers are all in one shard).
    shard: Option<Arc<Shard>>,
    release: Option<Arc<Release>>,
}

/// The last reference of a buffer whose memory is released in process context: an io_uring
/// command's registered buffer range (`file/uring.rs`), whose release unmaps it and dirties
/// and drops its pages, which may sleep. The submission that holds it lets go of it where
/// sleeping may not be allowed (`queue.rs` drops holds under its engine's register access, an
/// RCU read-side section), so [`Holds`] hands it to the driver's release workqueue instead
/// (`kfac::sched::ReleaseQueue`), whose work drops it.
#[pin_data]
pub(crate) struct Release {
    buf: Arc<Buffer>,
    #[pin]
    work: Work<Release>,
}

impl_has_work! {
    impl HasWork<Self> for Release { self.work }
}

impl WorkItem for Release {
    type Pointer = Arc<Release>;

    fn run(this: Arc<Release>) {
        // The buffer's last reference, in process context.
        drop(this);
    }
}

impl Drop for Holds {
    fn drop(&mut self) {
        if let Some(shard) = self.shard.take() {
            // The pooled holds go back under the lock that counts them, [`UNHOLD_BATCH`] per
            // hold of it (the shard is shared with other files: a submission may hold 8,192
            // buffers); a record may be freed as soon as its hold is back (nothing touches it
            // after).
            let mut xa = shard.xa.lock();
            let pooled = self.iter().filter_map(|h| match h {
                Hold::Pooled(p) => Some(p),
                Hold::Counted(_) => None,
            });
            for (k, p) in pooled.enumerate() {
                if k != 0 && k % UNHOLD_BATCH == 0 {
                    drop(xa);
                    xa = shard.xa.lock();
                }
                p.buffer().unhold_pooled();
            }
            drop(xa);
        }
        let Some(release) = self.release.take() else {
            return;
        };
        // The submission's own references go first: the release's is the buffer's last.
        self.few = [const { None }; HOLDS_INLINE];
        self.n = 0;
        self.more.clear();
        // Never fails: a release is queued once, here (a failure would drop it right here).
        let _ = ReleaseQueue::get().enqueue(release);
    }
}

impl Holds {
    /// Holds `buf` for the submission.
    ///
    /// # Errors
    ///
    /// `ENOENT` if a `MEM_FREE` freed the buffer, `ENOMEM`.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn add(&mut self, buf: &Arc<Buffer>) -> Result {
        self.take(buf.clone()).map(|_| ())
    }

    /// Every hold, in the order taken.
    fn iter(&self) -> impl Iterator<Item = &Hold> {
        Iterator::chain(self.few[..self.n].iter().flatten(), self.more.iter())
    }

    /// Makes room for one more hold.
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    fn reserve_one(&mut self) -> Result {
        if self.n < HOLDS_INLINE {
            return Ok(());
        }
        self.more.reserve(1, GFP_KERNEL_ACCOUNT)?;
        Ok(())
    }

    /// Appends `h`, for which [`Self::reserve_one`] made room; returns its index.
    fn push(&mut self, h: Hold) -> usize {
        let i = self.n + self.more.len();
        if self.n < HOLDS_INLINE {
            // PANIC: `n` is below HOLDS_INLINE.
            self.few[self.n] = Some(h);
            self.n += 1;
        } else {
            // Cannot fail: `reserve_one` made room.
            let _ = self.more.push_within_capacity(h);
        }
        i
    }

    /// Holds `buf`, taking over the caller's reference, by an [`InFlight`] reference. Returns
    /// the hold's index (for [`Self::get`]): 0, 1, 2, ... in the order of the holds taken.
    ///
    /// # Errors
    ///
    /// `ENOENT` if a `MEM_FREE` freed the buffer, `ENXIO` if its exporter revoked it,
    /// `ENOMEM`; nothing is held then.
    pub(crate) fn take(&mut self, buf: Arc<Buffer>) -> Result<usize> {
        self.reserve_one()?;
        Ok(self.push(Hold::Counted(InFlight::take(buf)?)))
    }

    /// Makes room for a pooled hold of a buffer in `shard`
    /// ([`BufferPool::hold`](crate::pool::BufferPool::hold)).
    ///
    /// # Errors
    ///
    /// `ENOMEM`; `EINVAL` if the holds count in another shard (one submission's buffers are
    /// one file's, in one shard).
    pub(crate) fn reserve_pooled(&mut self, shard: &Arc<Shard>) -> Result {
        if self.shard.as_ref().is_some_and(|s| !Arc::ptr_eq(s, shard)) {
            return Err(EINVAL);
        }
        self.reserve_one()
    }

    /// Records the pooled hold of `buf` in `shard`. Returns the hold's index.
    ///
    /// # Safety
    ///
    /// `buf` is the data of the `Arc` that `shard`'s XArray holds, looked up under the shard's
    /// lock, which the caller still holds, and [`Buffer::hold_pooled`] counted this hold
    /// under it; [`Self::reserve_pooled`] made room for a hold in `shard`.
    pub(crate) unsafe fn push_pooled(&mut self, shard: &Arc<Shard>, buf: &Buffer) -> usize {
        if self.shard.is_none() {
            self.shard = Some(shard.clone());
        }
        // INVARIANT: `buf` is in `shard` and its count includes this hold (the function's
        // safety contract); `self` keeps `shard` (`reserve_pooled` checked that any shard it
        // had is this one) until its drop gives the hold back under that shard's lock.
        self.push(Hold::Pooled(PooledHold(NonNull::from(buf))))
    }

    /// Holds `buf` as [`Self::take`] does, and makes the hold its last reference, released in
    /// process context when the submission lets go of it ([`Release`]). At most one such
    /// buffer per submission. Returns the hold's index.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, `EBUSY` if the submission holds such a buffer already; nothing is held then.
    pub(crate) fn take_released(&mut self, buf: Arc<Buffer>) -> Result<usize> {
        if self.release.is_some() {
            return Err(EBUSY);
        }
        let last = buf.clone();
        let release = Arc::pin_init(
            pin_init!(Release {
                buf: last,
                work <- new_work!("Release::work"),
            }),
            GFP_KERNEL_ACCOUNT,
        )?;
        let i = self.take(buf)?;
        self.release = Some(release);
        Ok(i)
    }

    fn hold(&self, i: usize) -> Option<&Hold> {
        if i < HOLDS_INLINE {
            self.few.get(i)?.as_ref()
        } else {
            self.more.get(i - HOLDS_INLINE)
        }
    }

    /// The buffer of hold `i` ([`Self::take`]'s index).
    pub(crate) fn get(&self, i: usize) -> Option<&Buffer> {
        self.hold(i).map(Hold::buffer)
    }

    /// A counted reference to the buffer of hold `i`.
    pub(crate) fn get_arc(&self, i: usize) -> Option<Arc<Buffer>> {
        Some(match self.hold(i)? {
            Hold::Counted(f) => f.buffer().clone(),
            Hold::Pooled(p) => {
                // SAFETY: the pointer is the data pointer of the shard's `Arc` of the record
                // (`push_pooled` got it from the shard's borrow of that `Arc`), which is alive
                // while the hold lives (the type invariant of `PooledHold`), and so during
                // this borrow; `from_raw` only borrows it, `into` counts one more reference.
                unsafe { ArcBorrow::from_raw(p.0.as_ptr().cast_const()) }.into()
            }
        })
    }

    /// Whether `buf` is one of the buffers held.
    pub(crate) fn contains(&self, buf: &Buffer) -> bool {
        self.iter().any(|h| core::ptr::eq(h.buffer(), buf))
    }

    /// Whether no buffer is held.
    pub(crate) fn is_empty(&self) -> bool {
        self.n == 0
    }
}
