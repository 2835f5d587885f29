// SPDX-License-Identifier: GPL-2.0

//! What a submission holds (the pairs of one prepare call): each buffer its pairs read or
//! write, once, until the engine is done with them (`queue.rs` drops the [`Holds`] when the
//! submission's fence retires, or when a reset or a pause of the queue drops it), so that
//! `MEM_FREE` is refused meanwhile. A driver-allocated buffer is held through its queue's
//! resident set (`resident.rs`): the set holds it by a count of its pool [`Shard`] (one of
//! [`SHARDS`] handle indexes, chosen by the file's id), and the submission's use is one record
//! per call, done when the [`Holds`] is dropped ([`Uses`]): no lock, reference count, list
//! entry or atomic read-modify-write per buffer. An import is held by a counted reference
//! ([`InFlight`]), which its revocation waits for.

use crate::{
    buffer::{Buffer, InFlight},
    kfac::sched::ReleaseQueue,
};
use kernel::{
    impl_has_work, new_work,
    prelude::*,
    sync::{
        atomic::{self, Acquire, Atomic},
        Arc,
    },
    workqueue::{Work, WorkItem},
    xarray::{AllocKind, XArray},
};

/// Handle indexes of a [`BufferPool`](crate::pool::BufferPool), each for the files whose id
/// has that remainder: files look their buffers up under different locks (one XArray lock for
/// all files made two threads of two files spin on it, Documentation/benchmarks.rst).
pub(crate) const SHARDS: usize = 16;

/// One of a pool's [`SHARDS`] handle indexes: handle -> buffer, for the open files whose id
/// has its remainder. Its lock also counts the resident sets' holds on its driver-allocated
/// buffers ([`Buffer::hold_pooled`]), and a buffer such a hold counts never leaves it, so the
/// shard's reference keeps the record alive for the hold. Reference-counted: each resident set
/// of a file's queues (`resident.rs`) keeps the shard whose lock gives its holds back.
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

/// One submission's use of its queue's resident set (`resident.rs`): the stamp of the prepare
/// call that made it (every resident buffer the call named carries that stamp or a later
/// one); done when the submission's [`Holds`] is dropped (the engine is done with its pairs,
/// or they were never written), which the set sees the next time it is locked. No list of
/// the buffers: a buffer may leave the set once every submission up to its stamp is done.
pub(crate) struct Uses {
    done: Atomic<u32>,
    /// The call's stamp (`Session`, `resident.rs`).
    pub(crate) stamp: u64,
}

impl Uses {
    /// The uses of the call with stamp `stamp`, not done.
    pub(crate) fn new(stamp: u64) -> Self {
        Self {
            done: Atomic::new(0),
            stamp,
        }
    }

    /// Marks the submission's uses given back (from [`Holds`]' drop, in any context).
    pub(crate) fn retire(&self) {
        self.done.store(1, atomic::Release);
    }

    /// Whether [`Self::retire`] was called.
    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Acquire) != 0
    }
}

/// What one submission holds: the buffers that are not resident by a counted reference
/// each ([`InFlight`]: imports, whose revocation waits for them, and an io_uring command's
/// registered range), at most one of them released in process context ([`Release`]), and the
/// uses of the resident buffers ([`Uses`]), given back when this is dropped. A resident buffer
/// is not listed here: the batch reaches it through its resident entry (`resident.rs`).
#[derive(Default)]
pub(crate) struct Holds {
    counted: KVec<InFlight>,
    /// The uses of resident buffers, given back when this is dropped.
    uses: Option<Arc<Uses>>,
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
        if let Some(uses) = self.uses.take() {
            // The resident set gives the uses back the next time it is locked; a record may
            // leave it from then on (nothing here touches the resident buffers after this).
            uses.retire();
        }
        let Some(release) = self.release.take() else {
            return;
        };
        // The submission's own references go first: the release's is the buffer's last.
        self.counted.clear();
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

    /// Holds `buf`, taking over the caller's reference, by an [`InFlight`] reference. Returns
    /// the hold's index (for [`Self::get`]): 0, 1, 2, ... in the order of the holds taken.
    ///
    /// # Errors
    ///
    /// `ENOENT` if a `MEM_FREE` freed the buffer, `ENXIO` if its exporter revoked it,
    /// `ENOMEM`; nothing is held then.
    pub(crate) fn take(&mut self, buf: Arc<Buffer>) -> Result<usize> {
        self.counted.reserve(1, GFP_KERNEL_ACCOUNT)?;
        let f = InFlight::take(buf)?;
        // Cannot fail: room was reserved.
        let _ = self.counted.push_within_capacity(f);
        Ok(self.counted.len() - 1)
    }

    /// The uses of resident buffers that the submission's drop gives back.
    pub(crate) fn set_uses(&mut self, uses: Arc<Uses>) {
        self.uses = Some(uses);
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

    /// The buffer of hold `i` ([`Self::take`]'s index).
    pub(crate) fn get(&self, i: usize) -> Option<&Arc<Buffer>> {
        self.counted.get(i).map(InFlight::buffer)
    }

    /// Whether `buf` is one of the buffers held by a counted reference.
    pub(crate) fn contains(&self, buf: &Buffer) -> bool {
        self.counted
            .iter()
            .any(|f| core::ptr::eq(&**f.buffer(), buf))
    }

    /// Whether nothing is held: no counted reference and no use of a resident buffer (then
    /// the submission needs no record of its holds).
    pub(crate) fn is_empty(&self) -> bool {
        self.counted.is_empty() && self.uses.is_none() && self.release.is_none()
    }
}
