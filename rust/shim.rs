// SPDX-License-Identifier: GPL-2.0

//! Typed wrappers of `rust/shim.c`: the kernel facilities Linux 7.3 has no Rust abstraction for
//! (VMA operations with a fault handler, `vmf_insert_pfn()`, `unmap_mapping_range()`, locked
//! memory accounting, `fatal_signal_pending()`). Every raw pointer the C side takes is behind a
//! type here; the rest of the driver calls these functions only.

use kernel::{bindings, prelude::*};

mod ffi {
    use kernel::{bindings, prelude::*};

    // The kernel structs are only passed by pointer, as bindgen's own declarations do; some of
    // them contain zero-sized members that the lint cannot see through.
    #[allow(improper_ctypes)]
    extern "C" {
        pub(super) fn neuron_udma_mmap_buffer(
            vma: *mut bindings::vm_area_struct,
            priv_: *const c_void,
            size: u64,
        ) -> c_int;
        pub(super) fn neuron_udma_zap(file: *mut bindings::file, offset: u64, len: u64);
        pub(super) fn neuron_udma_insert_page(
            vmf: *mut bindings::vm_fault,
            cpu_addr: *mut c_void,
        ) -> u32;
        pub(super) fn neuron_udma_charge(
            pages: usize,
            user: *mut *mut bindings::user_struct,
        ) -> c_int;
        pub(super) fn neuron_udma_uncharge(user: *mut bindings::user_struct, pages: usize);
        pub(super) fn neuron_udma_fatal_signal_pending() -> bool;
    }
}

/// The `struct file` of an open device node, kept by its buffers to remove their user mappings
/// (`unmap_mapping_range()` on the file's mapping).
///
/// # Invariants
///
/// The pointer is the `struct file` of an open neuron_udma node. It is only dereferenced (by
/// [`Self::zap`]) while that file is open, which its callers guarantee.
#[derive(Clone, Copy)]
pub(crate) struct MappedFile(*mut bindings::file);

// SAFETY: `MappedFile` is an address; it is dereferenced only by `zap`, whose callers guarantee
// that the file is open, from whichever task they run in. This is the only raw pointer the
// driver's open-file and buffer records keep.
unsafe impl Send for MappedFile {}
// SAFETY: As above; it has no interior mutability.
unsafe impl Sync for MappedFile {}

impl MappedFile {
    /// The file of an open node.
    pub(crate) fn new(file: &kernel::fs::File) -> Self {
        // INVARIANT: `file` is open now.
        Self(file.as_ptr())
    }

    /// Removes every user mapping of bytes `[offset, offset + len)` of the file (its page
    /// offsets), before the memory behind them is freed: later accesses fault.
    ///
    /// # Safety
    ///
    /// The file must still be open (not yet released).
    pub(crate) unsafe fn zap(self, offset: u64, len: u64) {
        // SAFETY: per the function's contract the file is open, so `self.0` is valid.
        unsafe { ffi::neuron_udma_zap(self.0, offset, len) }
    }
}

/// Makes `vma` a mapping of a whole host buffer of `size` bytes whose pages are inserted on
/// fault (see `mem::Buffer`); `priv_` becomes its private data, a counted reference given back
/// by the VMA's close.
///
/// # Errors
///
/// `EINVAL` if the mapping's length is not the buffer's size (rounded to pages).
///
/// # Safety
///
/// `vma` is being set up by the `mmap` call running now, and `priv_` comes from
/// `mem::vma_private`.
pub(crate) unsafe fn mmap_buffer(
    vma: &kernel::mm::virt::VmaNew,
    priv_: *const c_void,
    size: u64,
) -> Result {
    // SAFETY: per the function's contract.
    kernel::error::to_result(unsafe { ffi::neuron_udma_mmap_buffer(vma.as_ptr(), priv_, size) })
}

/// Maps the page of coherent memory at `cpu_addr` at the faulting address of `vmf`; returns the
/// `vm_fault_t`.
///
/// # Safety
///
/// `vmf` is the fault being handled, and `cpu_addr` a page of coherent memory that stays
/// allocated until the insertion returns.
pub(crate) unsafe fn insert_page(vmf: *mut bindings::vm_fault, cpu_addr: *mut c_void) -> u32 {
    // SAFETY: per the function's contract.
    unsafe { ffi::neuron_udma_insert_page(vmf, cpu_addr) }
}

/// A number of pages charged to a user's locked memory (see `mem::Charge`).
pub(crate) struct UserCharge {
    /// The charged `struct user_struct` (a counted reference).
    user: *mut bindings::user_struct,
    pages: usize,
}

// SAFETY: `user` is a counted reference that may be given back from any task; the uncharge is an
// atomic subtraction.
unsafe impl Send for UserCharge {}
// SAFETY: `UserCharge` has no method taking `&self`.
unsafe impl Sync for UserCharge {}

impl UserCharge {
    /// Charges `pages` to the calling user, limited by `RLIMIT_MEMLOCK`.
    ///
    /// # Errors
    ///
    /// `ENOMEM` past the limit (callers with `CAP_IPC_LOCK` are not limited).
    pub(crate) fn new(pages: usize) -> Result<Self> {
        let mut user = core::ptr::null_mut();
        // SAFETY: `user` is a valid out pointer; the function charges the current user.
        kernel::error::to_result(unsafe { ffi::neuron_udma_charge(pages, &mut user) })?;
        Ok(Self { user, pages })
    }
}

impl Drop for UserCharge {
    fn drop(&mut self) {
        // SAFETY: `user` was charged `pages` by `neuron_udma_charge`, which took the reference
        // this gives back.
        unsafe { ffi::neuron_udma_uncharge(self.user, self.pages) };
    }
}

/// Whether the current task was killed (SIGKILL): waits that ignore other signals end on it.
pub(crate) fn fatal_signal_pending() -> bool {
    // SAFETY: plain query of the current task.
    unsafe { ffi::neuron_udma_fatal_signal_pending() }
}
