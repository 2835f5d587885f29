// SPDX-License-Identifier: GPL-2.0

//! What a fence's state means to whoever asks: the one mapping of [`FenceState`] to the result
//! of a wait (`COPY_WAIT`, `FENCE_WAIT`, the in-kernel waits), of an io_uring command, and to the
//! fields of `FENCE_STATUS`.
//!
//! A waiter learns only that a fence failed (`EIO`); why (`EIO`, `ETIMEDOUT`, `ECANCELED`) is
//! in `FENCE_STATUS` and `QUEUE_EVENTS` (`Documentation/userspace-api.rst`).

use crate::{queue::FenceState, uapi};
use kernel::prelude::*;

/// The result of waiting for a fence in state `state`: `None` while it is pending, `Ok(())`
/// once it is done.
///
/// # Errors
///
/// `EIO` for a fence a queue reset dropped (whatever the reason), `ESTALE` for one older than
/// the failures its queue remembers (it may have failed).
pub(crate) fn outcome(state: FenceState) -> Option<Result> {
    match state {
        FenceState::Pending => None,
        FenceState::Done => Some(Ok(())),
        FenceState::Failed(_) => Some(Err(EIO)),
        FenceState::Expired => Some(Err(ESTALE)),
    }
}

/// The result with which an io_uring command waiting for a fence completes, given the fence's
/// state or the error of looking it up: `None` while the fence is pending, else 0 or a
/// negative errno ([`outcome`], or the lookup's error).
pub(crate) fn completion(state: Result<FenceState>) -> Option<c_int> {
    match state {
        Ok(s) => outcome(s).map(|r| r.map_or_else(|e| e.to_errno(), |()| 0)),
        Err(e) => Some(e.to_errno()),
    }
}

/// The `state` and `error` fields of `FENCE_STATUS` for a fence in state `state`: `error` is
/// the positive errno of why a reset dropped a failed fence, 0 otherwise.
pub(crate) fn status(state: FenceState) -> (u32, i32) {
    match state {
        FenceState::Pending => (uapi::NEURON_UDMA_FENCE_PENDING, 0),
        FenceState::Done => (uapi::NEURON_UDMA_FENCE_DONE, 0),
        FenceState::Failed(e) => (uapi::NEURON_UDMA_FENCE_FAILED, -e.to_errno()),
        FenceState::Expired => (uapi::NEURON_UDMA_FENCE_EXPIRED, 0),
    }
}
