// SPDX-License-Identifier: GPL-2.0

//! Who hears of a queue's completions besides a thread blocked in a wait: the owning file's
//! poll wait queue ([`FileEvents`]: `poll()`/epoll), an eventfd per queue ([`EventFd`]), and
//! io_uring commands waiting for a fence ([`UringCmd`]). The completion engine (`completion.rs`)
//! notifies them through the channel that owns them (`channel.rs`).

use crate::kfac::uring::{QueuedCmd, RawUringCmd};
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
/// it posts its CQE (from the submitter's task context). Dropped without an outcome (its queue
/// went away), it completes as cancelled (`ECANCELED`, [`QueuedCmd`]).
pub(crate) struct UringCmd {
    cmd: QueuedCmd,
    /// The fence it waits for.
    pub(crate) seq: u64,
    /// The result it completes with, once a look found its fence settled (completed after
    /// the queue lock is dropped: `Channel::notify`).
    pub(crate) result: Option<i32>,
}

impl UringCmd {
    /// Takes ownership of the queued command `cmd`, which waits for fence `seq`.
    ///
    /// # Safety
    ///
    /// As [`QueuedCmd::from_raw`].
    pub(crate) unsafe fn new(cmd: *mut RawUringCmd, seq: u64) -> Option<Self> {
        // SAFETY: per the function's contract.
        let cmd = unsafe { QueuedCmd::from_raw(cmd) }?;
        Some(Self {
            cmd,
            seq,
            result: None,
        })
    }

    /// Gives the command back without completing it (its issue fails with an error instead).
    pub(crate) fn into_raw(self) -> *mut RawUringCmd {
        self.cmd.into_raw()
    }

    /// Completes the command with `res` (0 or a negative errno): its CQE is posted.
    pub(crate) fn complete(self, res: i32) {
        self.cmd.complete(res);
    }
}
