// SPDX-License-Identifier: GPL-2.0

//! The device node `/dev/neuron_udmaN`: a misc device whose file operations are those of 7.3's
//! `MiscDevice` abstraction for [`OpenFile`] (open, release, ioctl, mmap, show_fdinfo) plus the
//! three it does not offer: `poll`, `uring_cmd` and `uring_cmd_iopoll` (trampolines in
//! `rust/kfac/uring.c` into `rust/file.rs`).
//!
//! [`Node`] is registered the way `MiscDeviceRegistration` registers itself, with the same layout
//! (a transparent `struct miscdevice`), because `MiscDevice`'s open trampoline finds the
//! registration through the `struct miscdevice` that `misc_open()` leaves in the file's private
//! data: the abstraction's own operations work unchanged.

use crate::{file::OpenFile, kfac::uring};
use kernel::{
    bindings,
    error::to_result,
    miscdevice::{MiscDeviceOptions, MiscDeviceRegistration},
    prelude::*,
    types::Opaque,
};

/// `MiscDevice`'s file operations of [`OpenFile`], with `poll` and io_uring's commands added.
static FOPS: Fops = Fops({
    let raw = MiscDeviceOptions { name: c"" }.into_raw::<OpenFile>();
    // SAFETY: `into_raw` points `fops` at the abstraction's static file operations of
    // `OpenFile`, which this copies.
    let base = unsafe { *raw.fops };
    bindings::file_operations {
        poll: Some(uring::neuron_udma_poll),
        uring_cmd: Some(uring::neuron_udma_uring_cmd),
        uring_cmd_iopoll: Some(uring::neuron_udma_uring_cmd_iopoll),
        ..base
    }
});

/// File operations in a static: read-only after build time (the `owner` pointer in them is
/// what makes the bindings' type not `Sync`).
#[repr(transparent)]
struct Fops(bindings::file_operations);

// SAFETY: never written after initialisation; the kernel reads it from any task.
unsafe impl Sync for Fops {}

// The open trampoline of `MiscDevice` reads the file's private data as a
// `MiscDeviceRegistration<OpenFile>`; a `Node` must be laid out as one.
const _: () = assert!(
    core::mem::size_of::<Node>() == core::mem::size_of::<MiscDeviceRegistration<OpenFile>>()
);

/// A registered device node (see the module documentation). Deregistered on drop.
///
/// # Invariants
///
/// `inner` holds a `struct miscdevice` registered with `misc_register()` for the lifetime of
/// this value, with [`FOPS`] as its file operations.
#[repr(transparent)]
#[pin_data(PinnedDrop)]
pub(crate) struct Node {
    #[pin]
    inner: Opaque<bindings::miscdevice>,
}

// SAFETY: `misc_deregister()` may be called from any task.
unsafe impl Send for Node {}
// SAFETY: the methods taking `&self` only read the registered device.
unsafe impl Sync for Node {}

impl Node {
    /// Registers the node `name` (`/dev/<name>`) as a child of the bound device `parent`, so
    /// that `/sys/class/misc/<name>/device` leads to it (the node is deregistered first at
    /// unbind: the parent outlives it).
    ///
    /// # Safety
    ///
    /// `parent` is a bound device that stays alive until the returned node is dropped.
    pub(crate) unsafe fn register(
        name: &'static CStr,
        parent: *mut bindings::device,
    ) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            inner <- Opaque::try_ffi_init(move |slot: *mut bindings::miscdevice| {
                let mut raw = MiscDeviceOptions { name }.into_raw::<OpenFile>();
                raw.fops = &FOPS.0;
                // 7.3's `MiscDeviceOptions` has no parent; the field is set as C drivers do.
                raw.parent = parent;
                // SAFETY: the initializer may write the slot.
                unsafe { slot.write(raw) };
                // SAFETY: the slot holds a misc device description; it stays pinned until the
                // drop deregisters it.
                // INVARIANT: registered with FOPS if this returns Ok.
                to_result(unsafe { bindings::misc_register(slot) })
            }),
        })
    }
}

#[pinned_drop]
impl PinnedDrop for Node {
    fn drop(self: Pin<&mut Self>) {
        // SAFETY: registered (type invariant); deregistered once, here.
        unsafe { bindings::misc_deregister(self.inner.get()) };
    }
}
