// SPDX-License-Identifier: GPL-2.0

//! Who hears of a queue's completions besides a thread blocked in a wait: the owning file's
//! poll wait queue ([`FileEvents`]: `poll()`/epoll), an eventfd per queue ([`EventFd`]), and
//! io_uring commands waiting for a fence ([`UringCmd`]). The completion worker (`watch.rs`)
//! notifies them through the channel that owns them (`channel.rs`).

use crate::kfac::uring::{self, RawUringCmd};
use kernel::{
    new_poll_condvar,
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        poll::PollCondVar,
    },
};

/// The poll wait queue of one open file: woken when a fence of one of its queues completes or
/// fails.
#[pin_data]
pub(crate) struct FileEvents {
    #[pin]
    cv: PollCondVar,
    /// Non-zero once the file was polled: from then on its queues' fences are watched.
    polled: Atomic<u32>,
}

impl FileEvents {
    /// A wait queue nobody polls yet.
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            cv <- new_poll_condvar!("neuron_udma::file_events"),
            polled: Atomic::new(0),
        })
    }

    /// The wait queue `poll()` registers with.
    pub(crate) fn condvar(&self) -> &PollCondVar {
        &self.cv
    }

    /// Records that the file is polled (its queues' fences are watched from now on).
    pub(crate) fn mark_polled(&self) {
        self.polled.store(1, Relaxed);
    }

    /// Whether the file was ever polled.
    pub(crate) fn is_polled(&self) -> bool {
        self.polled.load(Relaxed) != 0
    }

    /// Wakes the file's pollers.
    pub(crate) fn wake(&self) {
        self.cv.notify_all();
    }
}

/// A registered eventfd (a counted `struct eventfd_ctx` reference, put on drop).
pub(crate) use crate::kfac::eventfd::EventFd;

/// An io_uring command (`NEURON_UDMA_URING_COPY`) waiting for fence `seq` of a queue; completing
/// it posts its CQE (from the submitter's task context).
///
/// # Invariants
///
/// The pointer is a `struct io_uring_cmd` whose `uring_cmd` returned `-EIOCBQUEUED`, not yet
/// completed, owned by this value.
pub(crate) struct UringCmd {
    cmd: core::ptr::NonNull<RawUringCmd>,
    /// The fence it waits for.
    pub(crate) seq: u64,
}

// SAFETY: a queued command may be completed from any task (the completion is handed to the
// submitter's task work).
unsafe impl Send for UringCmd {}
// SAFETY: no method takes `&self` to touch the command.
unsafe impl Sync for UringCmd {}

impl UringCmd {
    /// Takes ownership of the queued command `cmd`, which waits for fence `seq`.
    ///
    /// # Safety
    ///
    /// `cmd` is a command of this driver's `uring_cmd` that returns `-EIOCBQUEUED` now and is
    /// completed only through the returned value.
    pub(crate) unsafe fn new(cmd: *mut RawUringCmd, seq: u64) -> Option<Self> {
        // INVARIANT: per the function's contract.
        core::ptr::NonNull::new(cmd).map(|cmd| Self { cmd, seq })
    }

    /// Gives the command back without completing it (its issue fails with an error instead).
    pub(crate) fn into_raw(self) -> *mut RawUringCmd {
        core::mem::ManuallyDrop::new(self).cmd.as_ptr()
    }

    /// Completes the command with `res` (0 or a negative errno): its CQE is posted.
    pub(crate) fn complete(self, res: i32) {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: by the type invariant the command is queued and ours; `self` is consumed
        // (not dropped: the drop would complete it a second time).
        unsafe { uring::uring_cmd_complete(this.cmd.as_ptr(), res) };
    }
}

impl Drop for UringCmd {
    /// A command dropped without an outcome (its queue went away) completes as cancelled: a
    /// queued io_uring command must always complete.
    fn drop(&mut self) {
        // SAFETY: by the type invariant the command is queued and ours, completed once, here.
        unsafe { uring::uring_cmd_complete(self.cmd.as_ptr(), ECANCELED.to_errno()) };
    }
}
