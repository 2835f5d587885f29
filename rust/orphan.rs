// SPDX-License-Identifier: GPL-2.0

//! Work the engine may still touch after its caller left: an *orphan* is the last submission of
//! a driver copy on the H2T queues (a `MEMCPY`, a `MEMSET`, a device-memory scrub; one
//! submission per queue of a striped one) whose caller returned early (timeout, SIGKILL) while
//! it was in flight. What it used stays reserved —
//! the two buffers of a `MEMCPY` (busy), the buffer and fill block of a `MEMSET`, the
//! device-memory range of a scrub — until the fence that
//! covers it is settled; then [`Orphans::reap`] gives it back.
//!
//! Adopting an orphan never fails: its caller reserves the room before it submits
//! ([`Orphans::reserve`]). Reaping never allocates: a settled orphan is taken out of the list
//! and released outside the lock, one at a time, so an allocation failure cannot leave a
//! released buffer (or its memory charge) behind.

use crate::{
    buffer::BusyGuard,
    channel::{Channel, MAX_SPLIT},
    pattern::PatternRef,
    pool::BufferPool,
};
use kernel::{
    new_mutex,
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, Mutex,
    },
};

/// What an orphan keeps from being reused.
pub(crate) enum Hold {
    /// The source and destination buffers of a `MEMCPY` (busy: `MEM_FREE` is `EBUSY`).
    Buffers([BusyGuard; 2]),
    /// A device-memory range at this address whose scrub was interrupted (the allocator gets it
    /// back then).
    Dram(u64),
    /// The destination buffer of a `MEMSET` (busy) and the block its fill reads.
    Fill(BusyGuard, PatternRef),
}

impl Hold {
    /// Whether a buffer it holds is an imported dma-buf its exporter revoked: a copy naming it
    /// submits nothing more ([`Channel::transfer_until`]).
    pub(crate) fn revoked(&self) -> bool {
        match self {
            Hold::Buffers(g) => g.iter().any(|g| g.buffer().is_revoked()),
            Hold::Fill(g, _) => g.buffer().is_revoked(),
            Hold::Dram(_) => false,
        }
    }
}

/// One orphan: its queue, the fence that covers it, its owner, and what it holds.
pub(crate) struct Orphan {
    /// The queue the submission is on.
    pub(crate) chan: Arc<Channel>,
    /// The fence of that queue that covers it.
    pub(crate) seq: u64,
    /// The other queues and fences of a copy striped across engines (all must settle).
    pub(crate) more: [Option<(Arc<Channel>, u64)>; MAX_SPLIT - 1],
    /// The open file whose `MEMCPY` it was (0 for the driver's own scrub).
    pub(crate) file: u64,
    /// What stays reserved until the fence is settled.
    pub(crate) hold: Hold,
}

impl Orphan {
    /// An orphan of one submission: fence `seq` of `chan`.
    pub(crate) fn new(chan: Arc<Channel>, seq: u64, file: u64, hold: Hold) -> Self {
        Self {
            chan,
            seq,
            more: [const { None }; MAX_SPLIT - 1],
            file,
            hold,
        }
    }

    /// Whether every fence that covers it is settled.
    fn is_settled(&self) -> bool {
        self.chan.is_settled(self.seq) && self.more.iter().flatten().all(|(c, s)| c.is_settled(*s))
    }
}

struct List {
    items: KVec<Orphan>,
    /// Room promised to callers that may adopt an orphan ([`OrphanSlot`]).
    reserved: usize,
}

/// The orphans of one device.
#[pin_data]
pub(crate) struct Orphans {
    #[pin]
    list: Mutex<List>,
    /// Length of the list (updated under the lock), so that [`Self::any`] takes no lock.
    count: Atomic<u32>,
}

/// Room for one orphan in [`Orphans`], reserved before a copy starts; given back on drop unless
/// [`Orphans::adopt`] used it.
pub(crate) struct OrphanSlot<'a> {
    orphans: &'a Orphans,
}

impl Drop for OrphanSlot<'_> {
    fn drop(&mut self) {
        let mut l = self.orphans.list.lock();
        l.reserved -= 1;
    }
}

impl Orphans {
    /// No orphans.
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            list <- new_mutex!(List {
                items: KVec::new(),
                reserved: 0,
            }),
            count: Atomic::new(0),
        })
    }

    /// Reserves room for one orphan, so that the copy that may leave it can adopt it whatever
    /// happens ([`Self::adopt`] does not allocate).
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    pub(crate) fn reserve(&self) -> Result<OrphanSlot<'_>> {
        let mut l = self.list.lock();
        let extra = l.reserved + 1;
        l.items.reserve(extra, GFP_KERNEL_ACCOUNT)?;
        l.reserved = extra;
        Ok(OrphanSlot { orphans: self })
    }

    /// Takes `orphan` into the list, in the room `slot` reserved.
    pub(crate) fn adopt(&self, slot: OrphanSlot<'_>, orphan: Orphan) {
        let mut l = self.list.lock();
        // `slot` reserved the capacity, and every other reservation has its own; only after
        // `shutdown` (every queue paused: nothing can reach what it holds) is there none, and
        // the orphan is dropped at once.
        if let Err(e) = l.items.push_within_capacity(orphan) {
            drop(e);
        }
        self.count.store(l.items.len() as u32, Relaxed);
        // The slot is used: its drop would give the room back a second time.
        l.reserved -= 1;
        drop(l);
        core::mem::forget(slot);
    }

    /// Whether any orphan exists (no lock taken).
    pub(crate) fn any(&self) -> bool {
        self.count.load(Relaxed) != 0
    }

    /// Whether an orphan of the open file `file` exists.
    pub(crate) fn held_by(&self, file: u64) -> bool {
        self.any() && self.list.lock().items.iter().any(|o| o.file == file)
    }

    /// Gives back what every settled orphan holds: buffers out of use (a buffer whose file was
    /// released is freed then) and device-memory ranges to the allocator of `pool`. A queue of
    /// an orphan left whose engine aborted, or that made no progress for the default timeout,
    /// is reset ([`Channel::recover`]), so its fence settles as lost.
    /// Returns the orphans left. Never allocates; the queue lock is taken inside the list lock,
    /// never the other way round.
    pub(crate) fn reap(&self, pool: &BufferPool) -> usize {
        loop {
            let (settled, left) = {
                let mut l = self.list.lock();
                let pos = l.items.iter().position(|o| o.is_settled());
                let settled = pos.and_then(|i| l.items.remove(i).ok());
                self.count.store(l.items.len() as u32, Relaxed);
                (settled, l.items.len())
            };
            let Some(o) = settled else {
                if left != 0 {
                    self.recover_queues();
                }
                return left;
            };
            // Released outside the lock: freeing a buffer takes the pool lock and may take the
            // mmap lock (its memory charge).
            match o.hold {
                Hold::Buffers(guards) => {
                    let bufs = [guards[0].buffer().clone(), guards[1].buffer().clone()];
                    drop(guards);
                    for b in bufs.iter() {
                        pool.free_if_released(b);
                    }
                }
                Hold::Dram(addr) => pool.free_dram(addr),
                Hold::Fill(guard, pattern) => {
                    let buf = guard.buffer().clone();
                    drop(guard);
                    drop(pattern);
                    pool.free_if_released(&buf);
                }
            }
        }
    }

    /// Resets every queue of the orphans left whose engine aborted or that made no progress for
    /// the default timeout ([`Channel::recover`]): their fences then settle as lost. An abort
    /// is seen at once, not after the stuck rule: nothing else looks at the queue of a part an
    /// early end left on another H2T engine, and a later copy's part there would otherwise
    /// find the engine aborted and fail with `EIO` (another caller's copy).
    fn recover_queues(&self) {
        let chans = {
            let l = self.list.lock();
            let mut v: KVec<Arc<Channel>> = KVec::new();
            'items: for o in l.items.iter() {
                let more = o.more.iter().flatten().map(|(c, _)| c);
                for chan in Iterator::chain(core::iter::once(&o.chan), more) {
                    if v.iter().any(|c| Arc::ptr_eq(c, chan)) {
                        continue;
                    }
                    // Without memory the next round tries again.
                    if v.push(chan.clone(), GFP_KERNEL).is_err() {
                        break 'items;
                    }
                }
            }
            v
        };
        for c in chans.iter() {
            let _ = c.recover();
        }
    }

    /// Drops every orphan (unbind, after every queue was paused: no engine reaches what they
    /// hold); the pool frees the memory itself.
    pub(crate) fn shutdown(&self) {
        let items = {
            let mut l = self.list.lock();
            self.count.store(0, Relaxed);
            core::mem::replace(&mut l.items, KVec::new())
        };
        drop(items);
    }
}
