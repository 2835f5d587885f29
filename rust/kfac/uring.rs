// SPDX-License-Identifier: GPL-2.0

//! The file operations of the device node that Linux 7.3's `MiscDevice` lacks (`uring_cmd`,
//! `uring_cmd_iopoll` and `poll`: C trampolines into `rust/file.rs`, put in the node's file
//! operations by `rust/node.rs`), and the io_uring command API (no Rust abstraction in 7.3): a
//! queued command's private bytes and its completion (C in `rust/kfac/uring.c`). The queued
//! command itself is owned by `events::UringCmd`.

use kernel::bindings;

super::generated! { include!("uring_generated.rs"); }

/// An io_uring command as C passes it (`struct io_uring_cmd`).
pub(crate) use bindings::io_uring_cmd as RawUringCmd;

/// The `poll`, `uring_cmd` and `uring_cmd_iopoll` file operations of the device node (C
/// trampolines that find the open file in `file->private_data` and call `rust/file.rs`).
pub(crate) use ffi::{neuron_udma_poll, neuron_udma_uring_cmd, neuron_udma_uring_cmd_iopoll};

/// Completes the queued (non-IOPOLL) io_uring command `cmd` with `res` from any context (its
/// CQE is posted from the submitter's task work).
///
/// # Safety
///
/// `cmd` is a command this driver's `uring_cmd` queued (`-EIOCBQUEUED`), completed once.
pub(crate) unsafe fn uring_cmd_complete(cmd: *mut RawUringCmd, res: i32) {
    // SAFETY: per the function's contract.
    unsafe { ffi::neuron_udma_uring_cmd_complete(cmd, res) }
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
