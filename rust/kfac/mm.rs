// SPDX-License-Identifier: GPL-2.0

//! Memory of user mappings and pinned user pages, which Linux 7.3's Rust does not wrap (C in
//! `rust/kfac/mm.c`): the mapping of a host buffer whose pages are inserted on fault
//! ([`mmap_buffer`], [`VmFault`]; the VMA operations call `rust/buffer.rs`),
//! the removal of a file's user mappings ([`MappedFile`]: `unmap_mapping_range()`, exported,
//! called directly), the charge of pinned memory to the user's locked memory ([`UserCharge`]),
//! pinned user pages with their DMA mapping ([`PinnedPages`]) and the DMA segment boundary of a
//! device ([`dma_no_seg_boundary`]).

use kernel::{bindings, prelude::*};

super::generated! { include!("mm_generated.rs"); }

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
    /// No file (KUnit: the record of a buffer that no process can map; [`Self::zap`] does
    /// nothing for it).
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn none() -> Self {
        Self(core::ptr::null_mut())
    }

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
    /// The file must still be open (not yet released), unless it is [`Self::none`].
    pub(crate) unsafe fn zap(self, offset: u64, len: u64) {
        if self.0.is_null() {
            // No file: nothing was ever mapped.
            return;
        }
        // SAFETY: per the function's contract the file is open, so `self.0` is valid and so is
        // its mapping (set at open, fixed for the file's life).
        let mapping = unsafe { (*self.0).f_mapping };
        // CAST: `loff_t`, as C converts a `u64` argument (the same bits).
        let (offset, len) = (offset as i64, len as i64);
        // SAFETY: `mapping` is the open file's; `unmap_mapping_range()` takes any range, and
        // `even_cows` 1 removes private copies too.
        unsafe { bindings::unmap_mapping_range(mapping, offset, len, 1) }
    }
}

/// Makes `vma` a mapping of a whole host buffer of `size` bytes whose pages are inserted on
/// fault (see `buffer::Buffer`); `buf` becomes its private data, a counted reference given back
/// by the VMA's close (`buffer::neuron_udma_vma_put`).
///
/// # Errors
///
/// `EINVAL` if the mapping's length is not the buffer's size (rounded to pages).
///
/// # Safety
///
/// `vma` is being set up by the `mmap` call running now, and `buf` is a counted reference
/// (`Arc::into_raw`) to the buffer that the callbacks of `buffer.rs` accept.
pub(crate) unsafe fn mmap_buffer<T>(
    vma: &kernel::mm::virt::VmaNew,
    buf: *const T,
    size: u64,
    wc: bool,
) -> Result {
    // SAFETY: per the function's contract.
    kernel::error::to_result(unsafe {
        ffi::neuron_udma_mmap_buffer(vma.as_ptr(), buf.cast(), size, wc)
    })
}

/// A page fault of a buffer mapping being handled (`struct vm_fault`), for the duration of the
/// fault handler's call.
///
/// # Invariants
///
/// The pointer is the `struct vm_fault` of the fault whose handler runs for `'a`.
pub(crate) struct VmFault<'a>(
    core::ptr::NonNull<bindings::vm_fault>,
    core::marker::PhantomData<&'a mut bindings::vm_fault>,
);

impl VmFault<'_> {
    /// The fault `vmf` (`None` for a null pointer).
    ///
    /// # Safety
    ///
    /// `vmf` is the fault the handler running now was called for; the value is not kept past
    /// that call (its lifetime is the handler's).
    pub(crate) unsafe fn from_raw(vmf: *mut bindings::vm_fault) -> Option<Self> {
        // INVARIANT: per the function's contract.
        core::ptr::NonNull::new(vmf).map(|p| Self(p, core::marker::PhantomData))
    }

    /// Maps the page frame `pfn` (device memory, BAR4) at the faulting address, with the
    /// mapping's protection; returns the `vm_fault_t`.
    ///
    /// # Safety
    ///
    /// `pfn` is a page of BAR4 that the faulting mapping's buffer owns until the insertion
    /// returns.
    pub(crate) unsafe fn insert_pfn(&mut self, pfn: u64) -> u32 {
        // SAFETY: the fault is being handled (type invariant); `pfn` per the contract.
        unsafe { ffi::neuron_udma_insert_pfn(self.0.as_ptr(), pfn) }
    }

    /// Maps the page of coherent memory at `cpu_addr` at the faulting address; returns the
    /// `vm_fault_t`.
    ///
    /// # Safety
    ///
    /// `cpu_addr` is a page of coherent memory that stays allocated until the insertion
    /// returns.
    pub(crate) unsafe fn insert_page(&mut self, cpu_addr: *mut c_void) -> u32 {
        // SAFETY: the fault is being handled (type invariant); `cpu_addr` per the contract.
        unsafe { ffi::neuron_udma_insert_page(self.0.as_ptr(), cpu_addr) }
    }
}

/// A number of pages charged to a user's locked memory (see `charge::Charge`).
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

/// The caller's pages under a user range, pinned for long-term DMA (`pin_user_pages_fast()`
/// with `FOLL_LONGTERM`, which Linux 7.3's Rust does not wrap, and whose `SGTable` takes only
/// pages it allocated), with their scatter-gather table. Dropping it unmaps the table, unpins
/// the pages (marked dirty if the device may have written them) and frees it: the owner makes
/// sure no descriptor can reach the pages any more.
///
/// # Invariants
///
/// `0` is a `struct neuron_udma_pin` from `neuron_udma_pin_user()`, released only by `drop`.
pub(crate) struct PinnedPages(core::ptr::NonNull<ffi::neuron_udma_pin>);

// SAFETY: the pin is owned by this value and may be released from any task.
unsafe impl Send for PinnedPages {}
// SAFETY: `&self` methods only read the table, which changes only in `map` (`&mut self`).
unsafe impl Sync for PinnedPages {}

impl PinnedPages {
    /// Pins the calling process's pages under `[addr, addr + size)` (bytes, any alignment),
    /// writable by the device if `write`.
    ///
    /// # Errors
    ///
    /// `EINVAL` (empty or wrapping range), `EFAULT` (a page not mapped, or read-only with
    /// `write`), `ENOMEM`, `EOPNOTSUPP` (not pinnable long-term), `EINTR` (SIGKILL); nothing
    /// stays pinned then.
    pub(crate) fn new(addr: u64, size: u64, write: bool) -> Result<Self> {
        // SAFETY: the function takes plain values and pins the current task's memory.
        let p = unsafe { ffi::neuron_udma_pin_user(addr, size, write) };
        let p = kernel::error::from_err_ptr(p)?;
        // INVARIANT: a pin from `neuron_udma_pin_user()`, not an error pointer.
        core::ptr::NonNull::new(p).map(Self).ok_or(ENOMEM)
    }

    /// Maps the pages for DMA by `dev` (once).
    ///
    /// # Errors
    ///
    /// `EOPNOTSUPP` if `dev` could reach them only through bounce buffers, the DMA API's
    /// `ENOMEM`/`EIO`/`EINVAL`.
    pub(crate) fn map(&mut self, dev: &kernel::device::Device<kernel::device::Bound>) -> Result {
        let raw = super::raw_device(dev);
        // SAFETY: `self.0` is a valid, unmapped pin (`map` is called once, by its owner); `raw`
        // is the bound device `dev`, and the pin keeps its own reference to it.
        kernel::error::to_result(unsafe { ffi::neuron_udma_pin_map(self.0.as_ptr(), raw) })
    }

    /// The DMA segments `(address, bytes)` of the mapped pages, in the order of the range.
    pub(crate) fn dma_segments(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        // SAFETY: the pin's table lives as long as `self` and is not modified while borrowed.
        let sgt = unsafe {
            kernel::scatterlist::SGTable::from_raw(ffi::neuron_udma_pin_sgt(self.0.as_ptr()))
        };
        sgt.iter().map(|e| (e.dma_address(), e.dma_len()))
    }
}

impl Drop for PinnedPages {
    fn drop(&mut self) {
        // SAFETY: by the type invariant, a live pin released exactly once, here.
        unsafe { ffi::neuron_udma_pin_release(self.0.as_ptr()) };
    }
}

/// Lifts the DMA API's segment boundary of `dev` (4 GiB by default; the length limit is lifted
/// with `dma::Device::dma_set_max_seg_size`): the engine never walks a scatter-gather list, the
/// driver splits every copy into descriptor pairs of at most 64 KiB within one mapped segment
/// itself (`span.rs`), so imported buffers' segments may cross any boundary (DMA-API debug checks
/// mappings against the limits).
///
/// # Safety
///
/// No DMA mapping of `dev` exists yet (called at probe).
pub(crate) unsafe fn dma_no_seg_boundary(dev: &kernel::device::Device<kernel::device::Bound>) {
    let raw = super::raw_device(dev);
    // SAFETY: `raw` is the bound device `dev`; no mapping exists (per the contract).
    unsafe { ffi::neuron_udma_dma_no_seg_boundary(raw) }
}
