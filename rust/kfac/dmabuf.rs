// SPDX-License-Identifier: GPL-2.0

//! dma-buf, which Linux 7.3's Rust has no abstraction for (C in `rust/kfac/dmabuf_export.c`,
//! `dmabuf_import.c` and, in KUnit builds, `dmabuf_kunit.c`): [`DmaBufExport`], a dma-buf of
//! device memory exported by the C `dma_buf_ops` (revoked at unbind by [`dmabuf_revoke_all`]),
//! the descriptor it is published as ([`ReservedFd`]), and [`DmaBufImport`], another exporter's
//! dma-buf attached, pinned and mapped, whose revocation calls `rust/buffer.rs`.

use kernel::{
    fs::file::{flags::O_CLOEXEC, FileDescriptorReservation},
    prelude::*,
};

super::generated! { include!("dmabuf_generated.rs"); }

/// An export's Rust side as C passes it back (`struct neuron_udma_export_hold`).
pub(crate) use ffi::neuron_udma_export_hold as RawExportHold;
/// What the KUnit importer of an export saw (`struct neuron_udma_kunit_report`).
#[cfg(neuron_udma_kunit)]
pub(crate) use ffi::neuron_udma_kunit_report as KunitReport;

/// A dma-buf of a range of device memory (BAR4), exported by the C `dma_buf_ops`
/// (`rust/kfac/dmabuf_export.c`), with one reference owned by this value: given to a file
/// descriptor by [`Self::install`], or dropped.
///
/// # Invariants
///
/// The pointer is a `neuron_udma_dmabuf_export()` result whose dma-buf reference this value
/// owns.
pub(crate) struct DmaBufExport(core::ptr::NonNull<ffi::neuron_udma_export>);

// SAFETY: a dma-buf reference may be used and given back from any task.
unsafe impl Send for DmaBufExport {}
// SAFETY: the methods taking `&self` call functions that serialise themselves (the dma-buf's
// reservation lock).
unsafe impl Sync for DmaBufExport {}

impl DmaBufExport {
    /// Exports bytes `[offset, offset + size)` of the device memory (BAR4) of the bound device
    /// `dev`; the dma-buf owns `hold` from now on and gives it back through
    /// `dmabuf::neuron_udma_dmabuf_released` when its last reference is gone.
    ///
    /// # Errors
    ///
    /// `EINVAL` for a range outside BAR4, `EOPNOTSUPP` without PCI peer-to-peer support,
    /// `ENOMEM`, `ENOENT` (the module is going away); `hold` is still the caller's then.
    ///
    /// # Safety
    ///
    /// `hold` is a valid `dmabuf::ExportHold` (`KBox::into_raw`) that the release callback
    /// accepts; the caller keeps `dev` bound for the duration of the call.
    pub(crate) unsafe fn new(
        dev: &kernel::device::Device<kernel::device::Bound>,
        offset: u64,
        size: u64,
        hold: *mut RawExportHold,
    ) -> Result<Self> {
        let raw = super::raw_device(dev);
        // SAFETY: `raw` is the bound device `dev`; `hold` per the function's contract.
        let p = unsafe { ffi::neuron_udma_dmabuf_export(raw, offset, size, hold) };
        let p = kernel::error::from_err_ptr(p)?;
        // INVARIANT: an export with the reference the caller (now this value) owns.
        core::ptr::NonNull::new(p).map(Self).ok_or(ENOMEM)
    }

    /// Publishes the dma-buf as the reserved descriptor `fd` (with this value's reference):
    /// cannot be undone, so everything that may fail was done first.
    pub(crate) fn install(self, fd: ReservedFd) {
        let this = core::mem::ManuallyDrop::new(self);
        let number = fd.number();
        // The descriptor is installed now (not given back).
        core::mem::forget(fd);
        // SAFETY: by the type invariant the export is live and this value's reference goes to
        // the descriptor (neither value is dropped); `number` was reserved in this task (a
        // reservation cannot leave its task) and is not installed yet.
        unsafe { ffi::neuron_udma_dmabuf_install(this.0.as_ptr(), number) }
    }

    /// Revokes the export: no new mapping, every importer is told to unmap. Returns true once
    /// every mapping is gone, false if a pinned importer still maps it after the unbind's
    /// bounded wait (`dmabuf_pinned_unbind_wait_ms`).
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn revoke(&self) -> bool {
        // SAFETY: by the type invariant the export is live.
        unsafe { ffi::neuron_udma_dmabuf_revoke(self.0.as_ptr()) }
    }

    /// Runs the KUnit importer (`rust/kfac/dmabuf_kunit.c`) on the export from the bound device
    /// `dev`; it revokes the export on the way.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn kunit_import(
        &self,
        dev: &kernel::device::Device<kernel::device::Bound>,
    ) -> KunitReport {
        let mut r = KunitReport::default();
        let raw = super::raw_device(dev);
        // SAFETY: the export is live (type invariant), `raw` is the bound device `dev`, `r` a
        // valid out pointer.
        unsafe { ffi::neuron_udma_kunit_import(self.0.as_ptr(), raw, &mut r) };
        r
    }
}

impl Drop for DmaBufExport {
    fn drop(&mut self) {
        // SAFETY: by the type invariant this value owns a reference, given back once, here.
        unsafe { ffi::neuron_udma_dmabuf_put(self.0.as_ptr()) }
    }
}

/// Revokes every export of the device `dev` (unbind): returns once no importer maps any of them.
pub(crate) fn dmabuf_revoke_all(dev: &kernel::device::Device) {
    let raw = super::raw_device(dev);
    // SAFETY: `raw` is a valid device, only compared with the exports' devices.
    unsafe { ffi::neuron_udma_dmabuf_revoke_all(raw) }
}

/// The stranded export of the device `dev` (revoked by an unbind while a pinned importer still
/// mapped it) with the lowest instance above `after`: `(instance, offset, len)`, its bytes
/// `offset..offset + len` of the device memory.
pub(crate) fn stranded_next(dev: &kernel::device::Device, after: u64) -> Option<(u64, u64, u64)> {
    let raw = super::raw_device(dev);
    let (mut instance, mut offset, mut len) = (0, 0, 0);
    // SAFETY: `raw` is a valid device, only compared; the out pointers are valid.
    unsafe {
        ffi::neuron_udma_dmabuf_stranded_next(raw, after, &mut instance, &mut offset, &mut len)
    }
    .then_some((instance, offset, len))
}

/// Whether the export `instance` is still stranded (not released).
pub(crate) fn is_stranded(instance: u64) -> bool {
    // SAFETY: only reads the C list under its lock.
    unsafe { ffi::neuron_udma_dmabuf_is_stranded(instance) }
}

/// In KUnit builds, the debugfs file `neuron_udma_pinned_importer` through which user space
/// drives a pinned importer of an export (`rust/kfac/dmabuf_kunit.c`, for
/// `pinned_export_test`), removed on drop; nothing in other builds.
pub(crate) struct PinnedImporterFile {
    #[cfg(neuron_udma_kunit)]
    dentry: *mut kernel::bindings::dentry,
}

// SAFETY: the dentry is only handed back to debugfs, from any task.
unsafe impl Send for PinnedImporterFile {}
// SAFETY: no method reads it.
unsafe impl Sync for PinnedImporterFile {}

impl PinnedImporterFile {
    /// Creates the file (none without debugfs, or outside KUnit builds).
    pub(crate) fn create() -> Self {
        Self {
            // SAFETY: no precondition.
            #[cfg(neuron_udma_kunit)]
            dentry: unsafe { ffi::neuron_udma_kunit_pinned_importer_create() },
        }
    }
}

#[cfg(neuron_udma_kunit)]
impl Drop for PinnedImporterFile {
    fn drop(&mut self) {
        // SAFETY: the dentry `create` returned (or null), removed once.
        unsafe { ffi::neuron_udma_kunit_pinned_importer_remove(self.dentry) }
    }
}

/// A file descriptor number reserved in the calling process, not installed yet; given back on
/// drop (the kernel crate's reservation, which stays in the task that made it).
pub(crate) struct ReservedFd(FileDescriptorReservation);

impl ReservedFd {
    /// Reserves a descriptor (close-on-exec if `flags` has `O_CLOEXEC`; its other bits are
    /// ignored).
    ///
    /// # Errors
    ///
    /// `EMFILE` when the process has no free descriptor.
    pub(crate) fn new(flags: u32) -> Result<Self> {
        FileDescriptorReservation::get_unused_fd_flags(flags & O_CLOEXEC).map(Self)
    }

    /// The descriptor number.
    pub(crate) fn number(&self) -> i32 {
        // CAST: a descriptor number is below `INT_MAX` (`get_unused_fd_flags()` returns it as
        // an `int`).
        self.0.reserved_fd() as i32
    }
}

/// Another exporter's dma-buf attached to the device (a dynamic attachment with
/// `invalidate_mappings`), pinned and mapped (see `rust/kfac/dmabuf_import.c`). Dropping it
/// unmaps, unpins and detaches it: the owner makes sure no descriptor can reach it any more.
///
/// # Invariants
///
/// The pointer is a `neuron_udma_import_dmabuf()` result, released only by `drop`.
pub(crate) struct DmaBufImport(core::ptr::NonNull<ffi::neuron_udma_import>);

// SAFETY: the import may be used and released from any task; its state is under the dma-buf's
// reservation lock.
unsafe impl Send for DmaBufImport {}
// SAFETY: `&self` methods read the mapping (fixed until unmapped, which only the owner does) or
// take the reservation lock.
unsafe impl Sync for DmaBufImport {}

impl DmaBufImport {
    /// Attaches the dma-buf `fd` of the calling process to the bound device `dev`, pins and maps
    /// it (writable by the device if `write`). Returns it and the dma-buf's size.
    ///
    /// # Errors
    ///
    /// `EBADF` (`fd` is not a dma-buf), `EACCES` (`write` for a dma-buf not open for writing),
    /// `EOPNOTSUPP` (the exporter cannot give this device its memory), `ENOMEM`, `EINTR`.
    ///
    /// # Safety
    ///
    /// The caller keeps `dev` bound for the duration of the call, and releases the import
    /// before the device is unbound.
    pub(crate) unsafe fn new(
        fd: i32,
        dev: &kernel::device::Device<kernel::device::Bound>,
        write: bool,
    ) -> Result<(Self, u64)> {
        let raw = super::raw_device(dev);
        let mut size = 0;
        // SAFETY: `raw` is the bound device `dev`; `size` is a valid out pointer.
        let p = unsafe { ffi::neuron_udma_import_dmabuf(fd, raw, write, &mut size) };
        let p = kernel::error::from_err_ptr(p)?;
        // INVARIANT: an import from `neuron_udma_import_dmabuf()`.
        let imp = core::ptr::NonNull::new(p).map(Self).ok_or(ENOMEM)?;
        Ok((imp, size))
    }

    /// [`Self::new`] of the dma-buf of `exp` (KUnit: no descriptor), writable.
    ///
    /// # Errors
    ///
    /// As [`Self::new`].
    ///
    /// # Safety
    ///
    /// As [`Self::new`].
    #[cfg(neuron_udma_kunit)]
    pub(crate) unsafe fn of_export(
        exp: &DmaBufExport,
        dev: &kernel::device::Device<kernel::device::Bound>,
    ) -> Result<(Self, u64)> {
        let raw = super::raw_device(dev);
        let mut size = 0;
        // SAFETY: the export is live; `raw` is the bound device `dev`; `size` is a valid out
        // pointer. The function takes its own reference to the dma-buf.
        let p = unsafe { ffi::neuron_udma_kunit_import_export(exp.0.as_ptr(), raw, &mut size) };
        let p = kernel::error::from_err_ptr(p)?;
        // INVARIANT: an import from `neuron_udma_import_dmabuf()`'s own path.
        let imp = core::ptr::NonNull::new(p).map(Self).ok_or(ENOMEM)?;
        Ok((imp, size))
    }

    /// The DMA segments `(address, bytes)` of the mapping, in the order of the buffer.
    pub(crate) fn dma_segments(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        // SAFETY: mapped since `new` (only the owner unmaps, after it built its runs, or the
        // drop); the table is not modified while borrowed.
        let sgt = unsafe {
            kernel::scatterlist::SGTable::from_raw(ffi::neuron_udma_import_sgt(self.0.as_ptr()))
        };
        sgt.iter().map(|e| (e.dma_address(), e.dma_len()))
    }

    /// The bus address of this device's BAR4 if the dma-buf is this driver's own export of the
    /// same device's memory (its mapping addresses minus it are device addresses).
    pub(crate) fn local_base(&self) -> Option<u64> {
        let mut base = 0;
        // SAFETY: the import is live (type invariant); `base` is a valid out pointer.
        unsafe { ffi::neuron_udma_import_local(self.0.as_ptr(), &mut base) }.then_some(base)
    }

    /// Connects the import to its buffer record `buf`, whose revocation callbacks
    /// (`buffer::neuron_udma_import_revoke`, `neuron_udma_import_drain`) it calls from now on.
    ///
    /// # Errors
    ///
    /// `ENXIO` if the exporter revoked it meanwhile.
    ///
    /// # Safety
    ///
    /// `buf` is the record whose backing holds this import: it outlives the import.
    pub(crate) unsafe fn connect<T>(&self, buf: *const T) -> Result {
        // SAFETY: the import is live; `buf` per the function's contract.
        kernel::error::to_result(unsafe {
            ffi::neuron_udma_import_connect(self.0.as_ptr(), buf.cast())
        })
    }

    /// Unmaps and unpins the dma-buf (revoked, and no descriptor can reach it any more).
    pub(crate) fn unmap(&self) {
        // SAFETY: the import is live (type invariant).
        unsafe { ffi::neuron_udma_import_unmap(self.0.as_ptr()) }
    }
}

impl Drop for DmaBufImport {
    fn drop(&mut self) {
        // SAFETY: by the type invariant a live import released exactly once, here.
        unsafe { ffi::neuron_udma_import_release(self.0.as_ptr()) };
    }
}
