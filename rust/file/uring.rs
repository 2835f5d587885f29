// SPDX-License-Identifier: GPL-2.0

//! io_uring commands of an open file (`NEURON_UDMA_URING_COPY`) and their trampolines: a
//! prepare, a fence and the command queued until the fence settles (completed at once if it
//! settled while the issue ran); on an IOPOLL ring the command is completed by polling. A
//! command is issued inline, from `io_uring_enter` in the submitting task, unless it would wait
//! for the queue lock or a device-ring move (then `EAGAIN` sends it to io_uring's workers).
//!
//! A command names its queue instance: one whose instance went away (released,
//! re-initialised, unbound) after its fence was submitted completes with `ECANCELED`.

use super::{queues::with_user_copies, OpenFile, MAX_BATCH};
use crate::{
    buffer::Buffer,
    channel::{Channel, Wait},
    charge::Charge,
    completion::Completer,
    events::UringCmd,
    fence,
    kfac::uring::{self as kuring, RawUringCmd, UringIssue},
    uapi,
};
use kernel::{prelude::*, sync::Arc};

impl OpenFile {
    /// An io_uring `NEURON_UDMA_URING_COPY` of this file: prepares `count` copies at `copies`
    /// on queue `(eng, qid)`, submits them with a fence and queues `cmd` until the fence
    /// settles (on an `iopoll` ring, [`Self::uring_poll`] completes it). Returns
    /// `-EIOCBQUEUED`; or, on an interrupt-driven ring whose fence settled before the call
    /// returns, the command's result (0, `-EIO`, `-ESTALE`, `-ECANCELED`, as a queued command
    /// would complete); or a negative errno with which io_uring completes the command: nothing
    /// was prepared then, except when only queueing the command failed after its fence was
    /// submitted (`ENOMEM`, or `ECANCELED` for a queue released or unbound meanwhile): its
    /// copies still run, their buffers held until done. With [`Wait::Never`] (a non-blocking
    /// issue), `EAGAIN` where the call would wait for the queue, nothing prepared: io_uring
    /// issues it again from a worker.
    ///
    /// With `IORING_URING_CMD_FIXED` the copies may name the SQE's registered buffer range as
    /// `NEURON_UDMA_FIXED_BUFFER` ([`Self::uring_fixed`]).
    ///
    /// # Safety
    ///
    /// `cmd` is the command being issued, as `issue` describes it.
    unsafe fn uring_submit(&self, cmd: *mut RawUringCmd, issue: &UringIssue) -> Result<i32> {
        let (eng, qid) = (issue.engine, issue.queue);
        let wait = if issue.nonblock {
            Wait::Never
        } else {
            Wait::Block
        };
        if !self.dev.is_alive() {
            return Err(ENODEV);
        }
        // Before the queue lookup, as `COPY_PREPARE` (`with_user_copies` checks it again): a bad
        // count is `EINVAL` also on a queue the file lacks.
        if issue.count == 0 || issue.count > MAX_BATCH {
            return Err(EINVAL);
        }
        let chan = self.queue(eng, qid)?;
        with_user_copies(issue.copies, issue.count, |staged| {
            // SAFETY: per the function's contract.
            unsafe { self.uring_staged(cmd, issue, &chan, staged, wait) }
        })
    }

    /// [`Self::uring_submit`] once the copies are read (`staged`), on the queue instance
    /// `chan`, its lock taken as `wait` says.
    ///
    /// # Safety
    ///
    /// As [`Self::uring_submit`].
    unsafe fn uring_staged(
        &self,
        cmd: *mut RawUringCmd,
        issue: &UringIssue,
        chan: &Arc<Channel>,
        staged: &[uapi::neuron_udma_copy],
        wait: Wait,
    ) -> Result<i32> {
        let (eng, qid, iopoll) = (issue.engine, issue.queue, issue.iopoll);
        // A registered range is mapped for the device inside a section that keeps it bound
        // until the submission holds the range or has let go of it: unbind waits for the
        // section before it stops the queues and flushes the release queue, so no mapping of
        // a range outlives the binding.
        let entered = if issue.fixed {
            Some(self.dev.enter()?)
        } else {
            None
        };
        let fixed = match &entered {
            // SAFETY: per the function's contract.
            Some(e) => Some(unsafe { self.uring_fixed(cmd, issue, staged, e.bound()) }?),
            None => None,
        };
        // The pairs and their fence under one queue lock: a fence slot taken meanwhile by
        // another thread of the file fails the command with nothing prepared.
        // On the instance looked up above: a release and re-init of the id meanwhile fails
        // the command (`ECANCELED`) rather than moving it to the new instance.
        // A non-blocking issue (`Wait::Never`) gets `EAGAIN` from the queue, with nothing
        // prepared, where the call would wait for the queue: a contended queue lock, or rings
        // in device memory the H2T queue fills.
        // The registered range's buffer is held by the submission (until the engine is done).
        let prepared = self.prepare_on(chan, staged, Some(wait), fixed);
        drop(entered);
        let (_, seq) = prepared?;
        // SAFETY: `cmd` is the command being issued; the driver's `uring_cmd` owns its bytes.
        unsafe { kuring::uring_pdu_set(cmd, eng, qid, chan.instance, seq) };
        // A fence that settled already (the engine finished while the call rang the doorbells)
        // completes the command now, as its issue's result: nothing queued, no task work.
        let settled = if iopoll {
            None
        } else {
            chan.try_state(seq)
                .and_then(|s| fence::completion(s.map_err(cancelled_if_gone)))
        };
        if let Some(res) = settled {
            Completer::look_then_watch(&self.dev.completer, chan);
            return Ok(res);
        }
        let queued = (!iopoll).then(|| {
            // SAFETY: `cmd` is queued from here on (`-EIOCBQUEUED` below) and completed only
            // through the `UringCmd`.
            unsafe { UringCmd::new(cmd, seq) }.map(|c| chan.add_uring(c))
        });
        // The queue's listeners (an eventfd, a poller, queued commands: this one too once
        // queued) hear of the fence just submitted, whatever happened to `cmd` above.
        Completer::look_then_watch(&self.dev.completer, chan);
        match queued {
            Some(None) => Err(EINVAL),
            Some(Some(Err((e, c)))) => {
                // Not queued: io_uring completes it with `e`; its fence was submitted, so a
                // queue gone meanwhile (released, or unbound: `ENODEV`) cancelled it.
                c.into_raw();
                Err(cancelled_if_gone(e))
            }
            None | Some(Some(Ok(()))) => Ok(EIOCBQUEUED.to_errno()),
        }
    }

    /// The registered buffer range of the command `cmd`: from `issue.fixed_addr` to the
    /// furthest byte a copy of `staged` names as `NEURON_UDMA_FIXED_BUFFER` (offsets from that
    /// address), as a buffer of this file that only this command's copies can name (never in
    /// the file's table): its pages held by references, mapped for `dev`, charged to
    /// `RLIMIT_MEMLOCK` as a `MEM_IMPORT` of the range; the engine may write it if a copy of
    /// `staged` does. It goes when the submission's holds drop: once the engine is done with
    /// the copies, however the command ends.
    ///
    /// # Errors
    ///
    /// `EINVAL` (the SQE's `len` set: reserved; no copy names the range), `EFAULT` (no such
    /// buffer, the range not inside it), `ENOMEM` (`RLIMIT_MEMLOCK`, memory), `EAGAIN` (a
    /// non-blocking issue past `RLIMIT_MEMLOCK`: the worker's issue waits for the releases
    /// queued), `EOPNOTSUPP` (pages the device reaches only through bounce buffers, or a buffer
    /// that is not page-contiguous).
    ///
    /// # Safety
    ///
    /// `cmd` is the command being issued, with `IORING_URING_CMD_FIXED`, as `issue` describes.
    unsafe fn uring_fixed(
        &self,
        cmd: *mut RawUringCmd,
        issue: &UringIssue,
        staged: &[uapi::neuron_udma_copy],
        dev: &kernel::device::Device<kernel::device::Bound>,
    ) -> Result<Arc<Buffer>> {
        if issue.fixed_len != 0 {
            return Err(EINVAL);
        }
        let (len, write) = crate::batch::fixed_extent(staged)?;
        let addr = issue.fixed_addr;
        let end = addr.checked_add(len).ok_or(EFAULT)?;
        let page = kernel::page::PAGE_SIZE as u64;
        // Charged first, as MEM_IMPORT: every page the range touches. Past the limit, the
        // releases queued go first (a non-blocking issue does not wait for them: `EAGAIN`).
        let bytes = (end.div_ceil(page) - addr / page) * page;
        let charge = if issue.nonblock {
            Charge::new(bytes).map_err(|e| if e == ENOMEM { EAGAIN } else { e })?
        } else {
            Charge::new_after_releases(bytes)?
        };
        // CAST: at most MAX_IMPORT_SIZE (`batch::fixed_extent`).
        let len32 = len as u32;
        // SAFETY: per the function's contract.
        let mut pages = unsafe { kuring::fixed_pages(cmd, addr, len32, write, issue.issue_flags) }?;
        pages.map(dev)?;
        let handle = super::buffers::next_handle();
        Buffer::imported(handle, len, self.id, self.file, pages, charge, write)
    }

    /// Completes the IOPOLL command `cmd` if its fence settled, or with `-ECANCELED` if its
    /// queue instance is gone (released, re-initialised, unbound); returns whether it did.
    fn uring_poll(&self, cmd: *mut RawUringCmd) -> bool {
        // SAFETY: `cmd` is a queued command of `uring_submit`, which recorded its queue
        // instance and fence.
        let (eng, qid, instance, seq) = unsafe { kuring::uring_pdu_get(cmd) };
        // The queue by id, then the instance: a queue of the same id initialised since is
        // another instance, whose fence numbers never name this command's.
        let state = match self.queue(eng, qid) {
            Ok(c) if c.instance == instance => c.poll_fence(seq),
            _ => Err(ECANCELED),
        };
        let Some(res) = fence::completion(state.map_err(cancelled_if_gone)) else {
            return false;
        };
        // SAFETY: queued and not completed (it completes only here, once its fence settled).
        unsafe { kuring::uring_cmd_done(cmd, res) };
        true
    }
}

/// The error of an io_uring command whose fence was submitted: a queue instance gone since
/// (released: `ECANCELED`; unbound: `ENODEV`) cancelled it, so both are `ECANCELED`.
fn cancelled_if_gone(e: Error) -> Error {
    if e == ENODEV {
        ECANCELED
    } else {
        e
    }
}

/// An io_uring `NEURON_UDMA_URING_COPY` of an open file (the trampoline of `rust/kfac/uring.c`):
/// `-EIOCBQUEUED` once queued, or the result io_uring completes the command with at once (0 or
/// a negative errno: [`OpenFile::uring_submit`]).
///
/// # Safety
///
/// `file` is the private data of the command's open file, `cmd` the command being issued and
/// `issue` its SQE's fields.
#[no_mangle]
unsafe extern "C" fn neuron_udma_uring_submit(
    file: *const OpenFile,
    cmd: *mut RawUringCmd,
    issue: *const UringIssue,
) -> c_int {
    // SAFETY: per the function's contract the file is open (io_uring holds it), and `issue`
    // is the command's, read from its SQE by the caller.
    let (me, issue) = unsafe { (&*file, &*issue) };
    if !issue.writable {
        return EBADF.to_errno();
    }
    // SAFETY: `cmd` is the command being issued, as `issue` describes.
    unsafe { me.uring_submit(cmd, issue) }.unwrap_or_else(|e| e.to_errno())
}

/// `uring_cmd_iopoll` of an open file: 1 if the IOPOLL command `cmd` completed now.
///
/// # Safety
///
/// `file` is the private data of the command's open file, `cmd` a command queued by
/// [`neuron_udma_uring_submit`] on an IOPOLL ring and not completed yet.
#[no_mangle]
unsafe extern "C" fn neuron_udma_uring_poll(file: *const OpenFile, cmd: *mut RawUringCmd) -> c_int {
    // SAFETY: per the function's contract the file is open.
    let me = unsafe { &*file };
    c_int::from(me.uring_poll(cmd))
}
