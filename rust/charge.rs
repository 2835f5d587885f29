// SPDX-License-Identifier: GPL-2.0

//! What a user's requests make the kernel hold, charged to that user: pinned memory (host
//! buffers, queue rings, imported pages) against `RLIMIT_MEMLOCK`, as io_uring charges it.

use crate::kfac::mm::UserCharge;
use kernel::{page::PAGE_SIZE, prelude::*};

/// Pinned host memory (buffers, queue rings) charged to the locked-memory count of the user
/// who allocated it, limited by `RLIMIT_MEMLOCK` (as io_uring charges pinned pages); given back
/// on drop. The charge belongs to the user, so a process cannot escape the limit by allocating
/// through a shared file and exiting.
pub(crate) struct Charge {
    /// Given back when dropped.
    _user: UserCharge,
    /// Bytes charged (whole pages).
    bytes: u64,
}

impl Charge {
    /// Charges `bytes` (rounded up to pages) to the calling user.
    ///
    /// # Errors
    ///
    /// `ENOMEM` if the user's pinned memory would exceed `RLIMIT_MEMLOCK` (callers with
    /// `CAP_IPC_LOCK` are not limited).
    pub(crate) fn new(bytes: u64) -> Result<Self> {
        let pages = usize::try_from(bytes.div_ceil(PAGE_SIZE as u64)).map_err(|_| ENOMEM)?;
        Ok(Self {
            _user: UserCharge::new(pages)?,
            bytes: bytes.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64,
        })
    }

    /// As [`Self::new`], but past the limit it first waits for the releases queued on the
    /// driver's release workqueue (`kfac::sched::ReleaseQueue`) and tries again: the registered
    /// buffer range of a finished io_uring command is given back there, which a CQE does not
    /// wait for. Process context, no driver lock held (the releases take none).
    ///
    /// # Errors
    ///
    /// As [`Self::new`].
    pub(crate) fn new_after_releases(bytes: u64) -> Result<Self> {
        Self::new(bytes).or_else(|e| {
            if e != ENOMEM {
                return Err(e);
            }
            crate::kfac::sched::ReleaseQueue::flush();
            Self::new(bytes)
        })
    }

    /// Bytes charged (whole pages).
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}
