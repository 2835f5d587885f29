// SPDX-License-Identifier: GPL-2.0

//! Memory of user mappings and pinned user pages, which Linux 7.3's Rust does not wrap (C in
//! `rust/kfac/mm.c`): the mapping of a host buffer whose pages are inserted on fault
//! ([`mmap_buffer`], [`VmFault`]; the VMA operations call `rust/buffer.rs`),
//! the removal of a file's user mappings ([`MappedFile`]: `unmap_mapping_range()`, exported,
//! called directly), the charge of pinned memory to the user's locked memory ([`UserCharge`]),
//! pinned user pages with their DMA mapping ([`PinnedPages`]) and the DMA segment boundary of a
//! device ([`dma_no_seg_boundary`]).

use kernel::{
    alloc::flags::GFP_KERNEL_ACCOUNT,
    bindings,
    page::{PAGE_MASK, PAGE_SHIFT, PAGE_SIZE},
    prelude::*,
    sync::aref::ARef,
    types::Opaque,
};

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

/// Pages pinned per `pin_user_pages_fast()` call: bounds the time between signal checks.
const PIN_BATCH: usize = 4096;

/// The DMA attributes of a pin's mapping (see [`PinnedPages::map`]).
// CAST: a flag bit of the `unsigned long` attributes.
const PIN_DMA_ATTRS: c_ulong = bindings::DMA_ATTR_REQUIRE_COHERENT as c_ulong;

/// The caller's pages under a user range, pinned for long-term DMA (`pin_user_pages_fast()`
/// with `FOLL_LONGTERM`, which Linux 7.3's Rust does not wrap, and whose `SGTable` takes only
/// pages it allocated), with their scatter-gather table. Dropping it unmaps the table, unpins
/// the pages (marked dirty if the device may have written them) and frees it: the owner makes
/// sure no descriptor can reach the pages any more.
///
/// The same type holds pages that something else keeps pinned, with a page reference of its
/// own each ([`PinnedPages::referenced`]: an io_uring registered buffer's).
///
/// # Invariants
///
/// `pages` are pinned (`FOLL_LONGTERM`, and `FOLL_WRITE` if `write`) by this value, or, if
/// `referenced`, each holds a page reference of this value's (`get_page()`); `sgt` is their
/// table of exactly the pinned bytes (`sg_alloc_table_from_pages_segment()`), mapped for `dev`
/// while `dev` is `Some`.
pub(crate) struct PinnedPages {
    sgt: KBox<Opaque<bindings::sg_table>>,
    pages: KVVec<*mut bindings::page>,
    /// The device the table is mapped for, `None` while unmapped.
    dev: Option<ARef<kernel::device::Device>>,
    write: bool,
    /// Held by page references rather than pins.
    referenced: bool,
}

// SAFETY: the pages and the table are owned by this value; pins are released and tables
// unmapped and freed from any task.
unsafe impl Send for PinnedPages {}
// SAFETY: `&self` methods only read the table, which changes only in `map` (`&mut self`).
unsafe impl Sync for PinnedPages {}

impl PinnedPages {
    /// Pins the calling process's pages under `[addr, addr + size)` (bytes, any alignment) for
    /// long-term DMA (`FOLL_LONGTERM`: migrated out of movable zones first), writable by the
    /// device if `write`, and builds the scatter-gather table of exactly those bytes (the first
    /// entry starts at `addr`'s offset in its page, physically contiguous pages share an
    /// entry). Nothing is mapped for a device yet.
    ///
    /// # Errors
    ///
    /// `EINVAL` (empty or wrapping range), `EFAULT` (a page not mapped, or read-only with
    /// `write`), `ENOMEM`, `EOPNOTSUPP` (not pinnable long-term), `EINTR` (SIGKILL); nothing
    /// stays pinned then.
    pub(crate) fn new(addr: u64, size: u64, write: bool) -> Result<Self> {
        let flags = GFP_KERNEL_ACCOUNT;
        let end = match addr.checked_add(size) {
            Some(end) if size != 0 => end,
            _ => return Err(EINVAL),
        };
        let first = addr >> PAGE_SHIFT;
        let npages = usize::try_from(((end - 1) >> PAGE_SHIFT) - first + 1).map_err(|_| ENOMEM)?;
        let sgt = KBox::new(Opaque::zeroed(), flags)?;
        let mut pages = KVVec::from_elem(core::ptr::null_mut::<bindings::page>(), npages, flags)?;
        let gup = bindings::FOLL_LONGTERM | if write { bindings::FOLL_WRITE } else { 0 };
        let mut done = 0;
        let pinned = loop {
            if done == npages {
                break Ok(());
            }
            if super::sched::fatal_signal_pending() {
                break Err(EINTR);
            }
            // CAST: at most `PIN_BATCH`.
            let batch = (npages - done).min(PIN_BATCH) as c_int;
            // CAST: a user address (below `end`), as C converts it.
            let start = ((first + done as u64) << PAGE_SHIFT) as c_ulong;
            // SAFETY: `pages[done..]` has room for `batch` entries; the function pins pages of
            // the current task's memory.
            let ret = unsafe {
                bindings::pin_user_pages_fast(start, batch, gup, pages.as_mut_ptr().add(done))
            };
            if ret <= 0 {
                break Err(if ret == 0 {
                    EFAULT
                } else {
                    Error::from_errno(ret)
                });
            }
            // CAST: positive, at most `batch`.
            done += ret as usize;
            super::sched::cond_resched();
        };
        // CAST: the offset in the first page, below `PAGE_SIZE`.
        let table =
            pinned.and_then(|()| table(&sgt, &mut pages, (addr as usize % PAGE_SIZE) as u32, size));
        if let Err(e) = table {
            // SAFETY: the first `done` pages were pinned above, and nothing refers to them.
            unsafe { bindings::unpin_user_pages(pages.as_mut_ptr(), done) };
            return Err(e);
        }
        // INVARIANT: `npages` pages pinned, `sgt` their table, not mapped.
        Ok(Self {
            sgt,
            pages,
            dev: None,
            write,
            referenced: false,
        })
    }

    /// Takes over `pages`, each with a page reference of the caller's (`get_page()`), that
    /// something else keeps pinned (an io_uring registered buffer's), and builds the table of
    /// `size` bytes from `offset` in the first (as [`Self::new`]); the device may write them if
    /// `write`. Dropping it drops the references.
    ///
    /// # Errors
    ///
    /// `EINVAL` if `size` bytes from `offset` do not fill the pages' last one, `ENOMEM`; the
    /// references are dropped then.
    ///
    /// # Safety
    ///
    /// Every entry of `pages` is a page with a reference the caller gives to this value.
    pub(crate) unsafe fn referenced(
        mut pages: KVVec<*mut bindings::page>,
        offset: u32,
        size: u64,
        write: bool,
    ) -> Result<Self> {
        let fits = u64::from(offset)
            .checked_add(size)
            .map(|end| end.div_ceil(PAGE_SIZE as u64) == pages.len() as u64);
        let table = KBox::new(Opaque::zeroed(), GFP_KERNEL_ACCOUNT)
            .map_err(Error::from)
            .and_then(|sgt| {
                if size == 0 || fits != Some(true) || offset as usize >= PAGE_SIZE {
                    return Err(EINVAL);
                }
                table(&sgt, &mut pages, offset, size).map(|()| sgt)
            });
        match table {
            // INVARIANT: the caller's references, `sgt` their table, not mapped.
            Ok(sgt) => Ok(Self {
                sgt,
                pages,
                dev: None,
                write,
                referenced: true,
            }),
            Err(e) => {
                // SAFETY: per the function's contract each page has a reference of ours, and
                // the device never saw them.
                unsafe { ffi::neuron_udma_put_pages(pages.as_mut_ptr(), pages.len(), false) };
                Err(e)
            }
        }
    }

    fn dir(&self) -> bindings::dma_data_direction {
        if self.write {
            bindings::dma_data_direction::DMA_BIDIRECTIONAL
        } else {
            bindings::dma_data_direction::DMA_TO_DEVICE
        }
    }

    /// Maps the pages for DMA by `dev` (once). Memory that `dev` could reach only through bounce
    /// buffers is refused: the engine writes the pages at any time, and a bounce buffer would be
    /// copied back only at unmap. `DMA_ATTR_REQUIRE_COHERENT`: dma-direct and dma-iommu refuse
    /// (`EIO`) a non-coherent device and any bounce buffer, so no mapping needs a sync; and
    /// DMA-API debug does not track cacheline overlaps (a user may import one page any number of
    /// times).
    ///
    /// # Errors
    ///
    /// `EOPNOTSUPP` if `dev` could reach them only through bounce buffers, the DMA API's
    /// `ENOMEM`/`EINVAL`.
    pub(crate) fn map(&mut self, dev: &kernel::device::Device<kernel::device::Bound>) -> Result {
        let raw = super::raw_device(dev);
        // SAFETY: `raw` is the bound device `dev`; the table is this value's, built by `new`
        // and not mapped (`map` is called once, by its owner).
        let ret =
            unsafe { bindings::dma_map_sgtable(raw, self.sgt.get(), self.dir(), PIN_DMA_ATTRS) };
        if ret == EIO.to_errno() {
            return Err(EOPNOTSUPP);
        }
        kernel::error::to_result(ret)?;
        // INVARIANT: mapped for `dev`, whose reference is kept until the unmap.
        let dev: &kernel::device::Device = dev;
        self.dev = Some(dev.into());
        Ok(())
    }

    /// The DMA segments `(address, bytes)` of the mapped pages, in the order of the range.
    pub(crate) fn dma_segments(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        // SAFETY: the table lives as long as `self` and is not modified while borrowed.
        let sgt = unsafe { kernel::scatterlist::SGTable::from_raw(self.sgt.get()) };
        sgt.iter().map(|e| (e.dma_address(), e.dma_len()))
    }
}

impl Drop for PinnedPages {
    fn drop(&mut self) {
        if let Some(dev) = self.dev.take() {
            // SAFETY: by the type invariant the table is mapped for `dev`, with these
            // direction and attributes; the owner made sure no descriptor reaches it.
            unsafe {
                bindings::dma_unmap_sgtable(
                    super::raw_device(&dev),
                    self.sgt.get(),
                    self.dir(),
                    PIN_DMA_ATTRS,
                )
            };
        }
        // SAFETY: the table was built by `new` or `referenced` and is no longer mapped.
        unsafe { bindings::sg_free_table(self.sgt.get()) };
        let (pages, n) = (self.pages.as_mut_ptr(), self.pages.len());
        if self.referenced {
            // SAFETY: by the type invariant every page has a reference of this value's;
            // dirtied if the device may have written them.
            unsafe { ffi::neuron_udma_put_pages(pages, n, self.write) };
        } else {
            // SAFETY: by the type invariant every page is pinned by this value; dirtied if the
            // device may have written them.
            unsafe { bindings::unpin_user_pages_dirty_lock(pages, n, self.write) };
        }
    }
}

/// Builds `sgt`, the scatter-gather table of `size` bytes from `offset` in `pages[0]`
/// (physically contiguous pages share an entry, segments of whole pages up to 4 GiB).
///
/// # Errors
///
/// `ENOMEM`; `sgt` holds nothing then.
fn table(
    sgt: &Opaque<bindings::sg_table>,
    pages: &mut KVVec<*mut bindings::page>,
    offset: u32,
    size: u64,
) -> Result {
    // CAST: the arguments' C types, converted as C converts them (the page count to `unsigned
    // int`, the byte count to `unsigned long`).
    let (n, bytes) = (pages.len() as c_uint, size as c_ulong);
    // SAFETY: `sgt` is a zeroed table the caller owns, `pages` holds `n` pages the caller holds.
    kernel::error::to_result(unsafe {
        bindings::sg_alloc_table_from_pages_segment(
            sgt.get(),
            pages.as_mut_ptr(),
            n,
            offset,
            bytes,
            // CAST: `UINT_MAX & PAGE_MASK`, the largest segment of whole pages.
            PAGE_MASK as u32,
            bindings::GFP_KERNEL_ACCOUNT,
        )
    })
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
