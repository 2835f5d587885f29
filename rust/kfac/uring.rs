// SPDX-License-Identifier: GPL-2.0

//! The file operations of the device node that Linux 7.3's `MiscDevice` lacks (`uring_cmd`,
//! `uring_cmd_iopoll` and `poll`: C trampolines into `rust/file.rs`, put in the node's file
//! operations by `rust/node.rs`), and the io_uring command API (no Rust abstraction in 7.3): a
//! queued command's private bytes and its completion (C in `rust/kfac/uring.c`): [`QueuedCmd`]
//! owns a queued command until it completes.

use kernel::{bindings, prelude::*};

super::generated! { include!("uring_generated.rs"); }

/// An io_uring command as C passes it (`struct io_uring_cmd`).
pub(crate) use bindings::io_uring_cmd as RawUringCmd;

/// The `poll`, `uring_cmd` and `uring_cmd_iopoll` file operations of the device node (C
/// trampolines that find the open file in `file->private_data` and call `rust/file.rs`).
pub(crate) use ffi::{neuron_udma_poll, neuron_udma_uring_cmd, neuron_udma_uring_cmd_iopoll};

/// A queued (non-IOPOLL) io_uring command: its issue returned `-EIOCBQUEUED`, and it completes
/// through this value, from any context (the CQE is posted from the submitter's task work).
/// Dropped without an outcome, it completes with `-ECANCELED`: a queued command must always
/// complete.
///
/// # Invariants
///
/// The pointer is a `struct io_uring_cmd` whose `uring_cmd` returned `-EIOCBQUEUED`, not yet
/// completed, owned by this value.
pub(crate) struct QueuedCmd(core::ptr::NonNull<RawUringCmd>);

// SAFETY: a queued command may be completed from any task (the completion is handed to the
// submitter's task work).
unsafe impl Send for QueuedCmd {}
// SAFETY: no method takes `&self`.
unsafe impl Sync for QueuedCmd {}

impl QueuedCmd {
    /// Takes ownership of `cmd` (`None` for a null pointer).
    ///
    /// # Safety
    ///
    /// `cmd` is a non-IOPOLL command of this driver's `uring_cmd` that returns `-EIOCBQUEUED`
    /// now, and is completed only through the returned value (or given back by
    /// [`Self::into_raw`] before that return).
    pub(crate) unsafe fn from_raw(cmd: *mut RawUringCmd) -> Option<Self> {
        // INVARIANT: per the function's contract.
        core::ptr::NonNull::new(cmd).map(Self)
    }

    /// Gives the command back without completing it (its issue fails with an error instead).
    pub(crate) fn into_raw(self) -> *mut RawUringCmd {
        core::mem::ManuallyDrop::new(self).0.as_ptr()
    }

    /// Completes the command with `res` (0 or a negative errno): its CQE is posted.
    pub(crate) fn complete(self, res: i32) {
        let this = core::mem::ManuallyDrop::new(self);
        // SAFETY: by the type invariant the command is queued and ours; `self` is consumed
        // (not dropped: the drop would complete it a second time).
        unsafe { ffi::neuron_udma_uring_cmd_complete(this.0.as_ptr(), res) };
    }
}

impl Drop for QueuedCmd {
    fn drop(&mut self) {
        // SAFETY: by the type invariant the command is queued and ours, completed once, here.
        unsafe { ffi::neuron_udma_uring_cmd_complete(self.0.as_ptr(), ECANCELED.to_errno()) };
    }
}

/// Completes the queued IOPOLL io_uring command `cmd` with `res`, from its `uring_cmd_iopoll`.
///
/// # Safety
///
/// `cmd` is an IOPOLL command this driver's `uring_cmd` queued, completed once, from the
/// `uring_cmd_iopoll` call running now.
pub(crate) unsafe fn uring_cmd_done(cmd: *mut RawUringCmd, res: i32) {
    // SAFETY: per the function's contract.
    unsafe { ffi::neuron_udma_uring_cmd_done(cmd, res) }
}

/// Records in `cmd` (its private bytes) the queue `engine`/`queue`, its instance `instance`
/// ([`Channel::instance`](crate::channel::Channel)) and the fence `fence` it waits for.
///
/// # Safety
///
/// `cmd` is a command of this driver's `uring_cmd`, not completed.
pub(crate) unsafe fn uring_pdu_set(
    cmd: *mut RawUringCmd,
    engine: u32,
    queue: u32,
    instance: u64,
    fence: u64,
) {
    // SAFETY: per the function's contract.
    unsafe { ffi::neuron_udma_uring_pdu_set(cmd, engine, queue, instance, fence) }
}

/// What [`uring_pdu_set`] recorded in `cmd`: `(engine, queue, instance, fence)`.
///
/// # Safety
///
/// As [`uring_pdu_set`], after it.
pub(crate) unsafe fn uring_pdu_get(cmd: *mut RawUringCmd) -> (u32, u32, u64, u64) {
    let (mut e, mut q, mut i, mut f) = (0, 0, 0, 0);
    // SAFETY: per the function's contract; the out pointers are valid locals.
    unsafe { ffi::neuron_udma_uring_pdu_get(cmd, &mut e, &mut q, &mut i, &mut f) };
    (e, q, i, f)
}

/// A `NEURON_UDMA_URING_COPY` being issued, as `rust/kfac/uring.c` read it from its SQE.
pub(crate) use ffi::neuron_udma_uring_issue as UringIssue;

/// The pages of the registered buffer range `[addr, addr + len)` (bytes) that the command `cmd`
/// names (its `buf_index`), held by page references of the returned value and tabled (not
/// mapped for a device yet); the device may write them if `write`. The pages stay held however
/// long the engine needs them, after the buffer is unregistered or the command completed.
///
/// # Errors
///
/// `EINVAL` (`len` 0), `EFAULT` (no such buffer, or the range not inside it), `EOPNOTSUPP` (a
/// registered buffer that is not page-contiguous), `ENOMEM`.
///
/// # Safety
///
/// `cmd` is the command being issued (`uring_cmd`), with `IORING_URING_CMD_FIXED`, and
/// `issue_flags` its issue flags.
pub(crate) unsafe fn fixed_pages(
    cmd: *mut RawUringCmd,
    addr: u64,
    len: u32,
    write: bool,
    issue_flags: u32,
) -> Result<super::mm::PinnedPages> {
    use kernel::page::PAGE_SIZE;
    if len == 0 {
        return Err(EINVAL);
    }
    // The range's pages, plus one for a start inside a page.
    let max = len / PAGE_SIZE as u32 + 2;
    // CAST: a `u32`.
    let mut pages = KVVec::from_elem(core::ptr::null_mut(), max as usize, GFP_KERNEL_ACCOUNT)?;
    let mut offset = 0;
    // SAFETY: `cmd` per the function's contract; `pages` has room for `max` entries.
    let n = unsafe {
        ffi::neuron_udma_uring_fixed_pages(
            cmd,
            addr,
            len,
            write,
            issue_flags,
            pages.as_mut_ptr(),
            max,
            &mut offset,
        )
    };
    kernel::error::to_result(n)?;
    // CAST: non-negative, at most `max`.
    pages.truncate(n as usize);
    // SAFETY: the first `n` entries each have a page reference that is ours.
    unsafe { super::mm::PinnedPages::referenced(pages, offset, u64::from(len), write) }
}
