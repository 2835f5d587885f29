// SPDX-License-Identifier: GPL-2.0

//! Typed wrappers of `rust/shim.c` (declared in `rust/shim.h`): the kernel facilities Linux 7.3
//! has no Rust abstraction for (VMA operations with a fault handler, `vmf_insert_pfn()`,
//! `unmap_mapping_range()`, locked memory accounting, `fatal_signal_pending()`, pinned user pages,
//! the DMA segment boundary, a sysfs-visible module parameter, the dmaengine provider's
//! `dma_device`, cookies and descriptors, `flush_work()`). Every raw pointer the C side takes is
//! behind a type here; the rest of the driver calls these functions only. The callbacks C makes
//! into Rust are defined where their types live (`buffer.rs`, `dmaengine.rs`) with the
//! pointer types of `rust/shim.h`.

use kernel::{bindings, prelude::*};

mod ffi {
    use kernel::{bindings, prelude::*};

    /// Declares C types that Rust only passes by pointer (`rust/shim.h`).
    macro_rules! opaque {
        ($($(#[$m:meta])* $name:ident;)*) => {$(
            $(#[$m])*
            #[repr(C)]
            pub(crate) struct $name {
                _opaque: [u8; 0],
            }
        )*};
    }

    opaque! {
        /// `struct neuron_udma_buffer`: a `buffer::Buffer` reference, as C passes it back.
        neuron_udma_buffer;
        /// `struct neuron_udma_dma_chan`: a `dmaengine::DmaChan` reference, as C passes it back.
        neuron_udma_dma_chan;
        /// `struct neuron_udma_pin`: pinned user pages and their scatter-gather table.
        neuron_udma_pin;
        /// `struct neuron_udma_dma`: a registered `dma_device` with its channels.
        neuron_udma_dma;
        /// `struct neuron_udma_usage`: the sysfs group of a device's usage counters.
        neuron_udma_usage;
        /// `struct dma_async_tx_descriptor` (7.3's bindings have no dmaengine types).
        dma_async_tx_descriptor;
        /// `struct eventfd_ctx`.
        eventfd_ctx;
        /// `struct neuron_udma_export_hold`: a `dmabuf::ExportHold`, as C passes it back.
        neuron_udma_export_hold;
        /// `struct neuron_udma_export`: a dma-buf of device memory.
        neuron_udma_export;
        /// `struct neuron_udma_import`: another exporter's dma-buf, attached and mapped.
        neuron_udma_import;
    }

    /// `struct neuron_udma_kunit_report` (`rust/shim.h`): what the KUnit importer saw.
    #[cfg(neuron_udma_kunit)]
    #[repr(C)]
    #[derive(Default, Debug)]
    pub(crate) struct neuron_udma_kunit_report {
        pub(crate) static_attach: c_int,
        pub(crate) attach: c_int,
        pub(crate) map: c_int,
        pub(crate) nents: u32,
        pub(crate) first_addr: u64,
        pub(crate) bytes: u64,
        pub(crate) invalidations: u32,
        pub(crate) unmapped: u32,
        pub(crate) map_after: c_int,
        pub(crate) attach_after: c_int,
    }

    // The functions of rust/shim.c, as rust/shim.h declares them. The kernel structs are only
    // passed by pointer, as bindgen's own declarations do; some of them contain zero-sized
    // members that the lint cannot see through.
    #[allow(improper_ctypes)]
    extern "C" {
        pub(super) fn neuron_udma_mmap_buffer(
            vma: *mut bindings::vm_area_struct,
            buf: *const neuron_udma_buffer,
            size: u64,
            wc: bool,
        ) -> c_int;
        pub(super) fn neuron_udma_insert_pfn(vmf: *mut bindings::vm_fault, pfn: u64) -> u32;
        pub(super) fn neuron_udma_insert_page(
            vmf: *mut bindings::vm_fault,
            cpu_addr: *mut c_void,
        ) -> u32;
        pub(super) fn neuron_udma_zap(file: *mut bindings::file, offset: u64, len: u64);
        pub(super) fn neuron_udma_charge(
            pages: usize,
            user: *mut *mut bindings::user_struct,
        ) -> c_int;
        pub(super) fn neuron_udma_uncharge(user: *mut bindings::user_struct, pages: usize);
        pub(super) fn neuron_udma_fatal_signal_pending() -> bool;
        pub(super) fn neuron_udma_dma_channels() -> c_uint;
        pub(super) fn neuron_udma_device_rings_by_engine() -> bool;
        pub(super) fn neuron_udma_max_buffers() -> c_uint;
        pub(super) fn neuron_udma_pin_user(
            addr: u64,
            size: u64,
            write: bool,
        ) -> *mut neuron_udma_pin;
        pub(super) fn neuron_udma_pin_map(
            pin: *mut neuron_udma_pin,
            dev: *mut bindings::device,
        ) -> c_int;
        pub(super) fn neuron_udma_pin_sgt(pin: *mut neuron_udma_pin) -> *mut bindings::sg_table;
        pub(super) fn neuron_udma_pin_release(pin: *mut neuron_udma_pin);
        pub(super) fn neuron_udma_dma_no_seg_boundary(dev: *mut bindings::device);
        pub(super) fn neuron_udma_flush_work(work: *mut bindings::work_struct);
        pub(super) fn neuron_udma_dma_register(
            dev: *mut bindings::device,
            chans: *const *const neuron_udma_dma_chan,
            nr: c_uint,
        ) -> *mut neuron_udma_dma;
        pub(super) fn neuron_udma_dma_unregister(dma: *mut neuron_udma_dma);
        pub(super) fn neuron_udma_usage_add(
            dev: *mut bindings::device,
            vals: *const *const u64,
        ) -> *mut neuron_udma_usage;
        pub(super) fn neuron_udma_usage_remove(usage: *mut neuron_udma_usage);
        pub(super) fn neuron_udma_dma_free_released();
        pub(super) fn neuron_udma_txd_assign_cookie(txd: *mut dma_async_tx_descriptor) -> i32;
        pub(super) fn neuron_udma_txd_cookie_complete(txd: *mut dma_async_tx_descriptor);
        pub(super) fn neuron_udma_txd_callback(
            txd: *mut dma_async_tx_descriptor,
            result: u32,
            residue: u32,
        );
        pub(super) fn neuron_udma_txd_acked(txd: *mut dma_async_tx_descriptor) -> bool;
        pub(super) fn neuron_udma_txd_free(txd: *mut dma_async_tx_descriptor);
        pub(super) fn neuron_udma_eventfd_get(fd: c_int) -> *mut eventfd_ctx;
        pub(super) fn neuron_udma_eventfd_signal(ctx: *mut eventfd_ctx);
        pub(super) fn neuron_udma_eventfd_put(ctx: *mut eventfd_ctx);
        pub(super) fn neuron_udma_uring_cmd_complete(cmd: *mut bindings::io_uring_cmd, res: c_int);
        pub(super) fn neuron_udma_uring_cmd_done(cmd: *mut bindings::io_uring_cmd, res: c_int);
        pub(super) fn neuron_udma_uring_pdu_set(
            cmd: *mut bindings::io_uring_cmd,
            engine: u32,
            queue: u32,
            instance: u64,
            fence: u64,
        );
        pub(super) fn neuron_udma_uring_pdu_get(
            cmd: *mut bindings::io_uring_cmd,
            engine: *mut u32,
            queue: *mut u32,
            instance: *mut u64,
            fence: *mut u64,
        );
        pub(super) fn neuron_udma_dmabuf_export(
            dev: *mut bindings::device,
            offset: u64,
            size: u64,
            hold: *mut neuron_udma_export_hold,
        ) -> *mut neuron_udma_export;
        pub(super) fn neuron_udma_dmabuf_put(exp: *mut neuron_udma_export);
        pub(super) fn neuron_udma_fd_reserve(flags: u32) -> c_int;
        pub(super) fn neuron_udma_fd_unreserve(fd: c_int);
        pub(super) fn neuron_udma_dmabuf_install(exp: *mut neuron_udma_export, fd: c_int);
        // Only the KUnit suites revoke an export on their own (unbind revokes them all).
        #[cfg(neuron_udma_kunit)]
        pub(super) fn neuron_udma_dmabuf_revoke(exp: *mut neuron_udma_export);
        pub(super) fn neuron_udma_dmabuf_revoke_all(dev: *mut bindings::device);
        pub(super) fn neuron_udma_import_dmabuf(
            fd: c_int,
            dev: *mut bindings::device,
            write: bool,
            size: *mut u64,
        ) -> *mut neuron_udma_import;
        pub(super) fn neuron_udma_import_sgt(
            imp: *mut neuron_udma_import,
        ) -> *mut bindings::sg_table;
        pub(super) fn neuron_udma_import_local(
            imp: *mut neuron_udma_import,
            bus_base: *mut u64,
        ) -> bool;
        pub(super) fn neuron_udma_import_connect(
            imp: *mut neuron_udma_import,
            buf: *const neuron_udma_buffer,
        ) -> c_int;
        pub(super) fn neuron_udma_import_unmap(imp: *mut neuron_udma_import);
        pub(super) fn neuron_udma_import_release(imp: *mut neuron_udma_import);
        #[cfg(neuron_udma_kunit)]
        pub(super) fn neuron_udma_kunit_import(
            exp: *mut neuron_udma_export,
            dev: *mut bindings::device,
            report: *mut neuron_udma_kunit_report,
        );
        #[cfg(neuron_udma_kunit)]
        pub(super) fn neuron_udma_kunit_import_export(
            exp: *mut neuron_udma_export,
            dev: *mut bindings::device,
            size: *mut u64,
        ) -> *mut neuron_udma_import;
        pub(crate) fn neuron_udma_poll(
            file: *mut bindings::file,
            wait: *mut bindings::poll_table_struct,
        ) -> bindings::__poll_t;
        pub(crate) fn neuron_udma_uring_cmd(
            cmd: *mut bindings::io_uring_cmd,
            issue_flags: c_uint,
        ) -> c_int;
        pub(crate) fn neuron_udma_uring_cmd_iopoll(
            cmd: *mut bindings::io_uring_cmd,
            iob: *mut bindings::io_comp_batch,
            poll_flags: c_uint,
        ) -> c_int;
    }
}

/// An io_uring command as C passes it (`struct io_uring_cmd`).
pub(crate) use bindings::io_uring_cmd as RawUringCmd;
/// A dmaengine client descriptor as C passes it (`struct dma_async_tx_descriptor`).
pub(crate) use ffi::dma_async_tx_descriptor as RawTxd;
/// An eventfd context as C passes it (`struct eventfd_ctx`).
pub(crate) use ffi::eventfd_ctx as RawEventFd;
/// The file operations of the device node that 7.3's `MiscDevice` lacks (`rust/node.rs`).
pub(crate) use ffi::{neuron_udma_poll, neuron_udma_uring_cmd, neuron_udma_uring_cmd_iopoll};

/// The eventfd of file descriptor `fd` of the calling process (a counted reference).
///
/// # Errors
///
/// `EBADF` if `fd` is not open, `EINVAL` if it is not an eventfd.
pub(crate) fn eventfd_get(fd: i32) -> Result<core::ptr::NonNull<RawEventFd>> {
    // SAFETY: plain call; the function takes its own reference to the file's context.
    let p = kernel::error::from_err_ptr(unsafe { ffi::neuron_udma_eventfd_get(fd) })?;
    core::ptr::NonNull::new(p).ok_or(EINVAL)
}

/// Adds 1 to the counter of the eventfd `ctx`.
///
/// # Safety
///
/// `ctx` is a live reference from [`eventfd_get`].
pub(crate) unsafe fn eventfd_signal(ctx: core::ptr::NonNull<RawEventFd>) {
    // SAFETY: per the function's contract.
    unsafe { ffi::neuron_udma_eventfd_signal(ctx.as_ptr()) }
}

/// Gives back a reference of [`eventfd_get`].
///
/// # Safety
///
/// `ctx` is a live reference from [`eventfd_get`], not used afterwards.
pub(crate) unsafe fn eventfd_put(ctx: core::ptr::NonNull<RawEventFd>) {
    // SAFETY: per the function's contract.
    unsafe { ffi::neuron_udma_eventfd_put(ctx.as_ptr()) }
}

/// Completes the queued (non-IOPOLL) io_uring command `cmd` with `res` from any context.
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
        // SAFETY: per the function's contract the file is open, so `self.0` is valid.
        unsafe { ffi::neuron_udma_zap(self.0, offset, len) }
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

/// Maps the page frame `pfn` (device memory, BAR4) at the faulting address of `vmf`; returns
/// the `vm_fault_t`.
///
/// # Safety
///
/// `vmf` is the fault being handled, and `pfn` a page of BAR4 that the faulting mapping's
/// buffer owns until the insertion returns.
pub(crate) unsafe fn insert_pfn(vmf: *mut bindings::vm_fault, pfn: u64) -> u32 {
    // SAFETY: per the function's contract.
    unsafe { ffi::neuron_udma_insert_pfn(vmf, pfn) }
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

/// The `struct device` of `dev`, for the C side: `Device` is a transparent wrapper of it (7.3
/// keeps `Device::as_raw` private). Valid while `dev` is borrowed.
pub(crate) fn raw_device(
    dev: &kernel::device::Device<kernel::device::Bound>,
) -> *mut bindings::device {
    core::ptr::from_ref(dev)
        .cast::<bindings::device>()
        .cast_mut()
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
        let raw = raw_device(dev);
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
    let raw = raw_device(dev);
    // SAFETY: `raw` is the bound device `dev`; no mapping exists (per the contract).
    unsafe { ffi::neuron_udma_dma_no_seg_boundary(raw) }
}

/// The `dma_channels` module parameter (dmaengine channels per device, as given at load; the
/// provider clamps it), registered in C so that it shows in
/// `/sys/module/neuron_udma/parameters/`.
pub(crate) fn dma_channels() -> u32 {
    // SAFETY: reads an integer module parameter.
    unsafe { ffi::neuron_udma_dma_channels() }
}

/// The `device_ring_fill` module parameter: whether the descriptors of a queue whose rings are
/// in device memory are moved there by the engine (`engine`) rather than written through BAR4
/// (`bar4`); read when such a queue is created, writable at run time in
/// `/sys/module/neuron_udma/parameters/`.
pub(crate) fn device_rings_by_engine() -> bool {
    // SAFETY: reads a module parameter.
    unsafe { ffi::neuron_udma_device_rings_by_engine() }
}

/// The `max_buffers` module parameter: the most live buffers one open file may hold (1 to
/// 2^20, default 65536; `/sys/module/neuron_udma/parameters/max_buffers`, writable by root).
pub(crate) fn max_buffers() -> u32 {
    // SAFETY: reads an integer module parameter.
    unsafe { ffi::neuron_udma_max_buffers() }
}

/// Whether the current task was killed (SIGKILL): waits that ignore other signals end on it.
pub(crate) fn fatal_signal_pending() -> bool {
    // SAFETY: plain query of the current task.
    unsafe { ffi::neuron_udma_fatal_signal_pending() }
}

/// A dmaengine client descriptor (`struct dma_async_tx_descriptor`, allocated by the shim's
/// `device_prep_dma_memcpy`); freed on drop.
///
/// # Invariants
///
/// The pointer is a descriptor of `neuron_udma_prep_memcpy`, not freed, owned by this value.
pub(crate) struct Txd(core::ptr::NonNull<RawTxd>);

// SAFETY: a descriptor may be completed and freed from any task; the client does not touch it
// concurrently (dmaengine's rules: after submit the provider owns it until completion).
unsafe impl Send for Txd {}
// SAFETY: the methods taking `&self` are read-only or called by one owner at a time.
unsafe impl Sync for Txd {}

/// Outcome of a transfer (`enum dmaengine_tx_result`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TxResult {
    /// The copy completed.
    NoError = 0,
    /// The copy was aborted (engine error, timeout, unbind): the destination is undefined.
    Aborted = 3,
}

impl Txd {
    /// Takes ownership of `ptr`.
    ///
    /// # Safety
    ///
    /// `ptr` is the descriptor `neuron_udma_prep_memcpy` is preparing, owned by nobody else.
    pub(crate) unsafe fn from_raw(ptr: *mut RawTxd) -> Option<Self> {
        // INVARIANT: per the function's contract.
        core::ptr::NonNull::new(ptr).map(Self)
    }

    /// Assigns the next cookie of the descriptor's channel (`dma_cookie_assign()`) and returns
    /// it. The caller serialises the submissions of a channel.
    pub(crate) fn assign_cookie(&self) -> i32 {
        // SAFETY: by the type invariant the descriptor is alive.
        unsafe { ffi::neuron_udma_txd_assign_cookie(self.0.as_ptr()) }
    }

    /// Marks the descriptor's cookie complete on its channel (`dma_cookie_complete()`): called
    /// in cookie order, under the lock that serialises the channel's cookies.
    pub(crate) fn cookie_complete(&self) {
        // SAFETY: by the type invariant the descriptor is alive.
        unsafe { ffi::neuron_udma_txd_cookie_complete(self.0.as_ptr()) }
    }

    /// Whether the client acked the descriptor (`DMA_CTRL_ACK`): it may be freed once done.
    pub(crate) fn acked(&self) -> bool {
        // SAFETY: by the type invariant the descriptor is alive.
        unsafe { ffi::neuron_udma_txd_acked(self.0.as_ptr()) }
    }

    /// A handle to complete the descriptor while its owner keeps it.
    pub(crate) fn handle(&self) -> TxdRef {
        TxdRef(self.0)
    }
}

/// A borrowed [`Txd`], to complete it without the lock that guards its owner.
#[derive(Clone, Copy)]
pub(crate) struct TxdRef(core::ptr::NonNull<RawTxd>);

impl TxdRef {
    /// Unmaps the client's unmap data and runs its callback if it asked for one
    /// (`DMA_PREP_INTERRUPT`), with `result` and `residue` bytes not copied. Must be called
    /// without any driver lock held (the callback may submit more work), once.
    ///
    /// # Safety
    ///
    /// The [`Txd`] is alive until this returns.
    pub(crate) unsafe fn complete(self, result: TxResult, residue: u32) {
        // SAFETY: per the function's contract the descriptor is alive.
        unsafe { ffi::neuron_udma_txd_callback(self.0.as_ptr(), result as u32, residue) }
    }
}

impl Drop for Txd {
    fn drop(&mut self) {
        // SAFETY: by the type invariant the descriptor is alive and ours; not used again.
        unsafe { ffi::neuron_udma_txd_free(self.0.as_ptr()) }
    }
}

/// A registered `dma_device` (see `rust/dmaengine.rs`).
///
/// # Invariants
///
/// The pointer is a `neuron_udma_dma_register` result, registered until [`Self::unregister`].
/// The sysfs group of a device's usage counters (`neuron_udma/` under the PCI device), removed
/// on drop.
///
/// # Invariants
///
/// The group was created by `neuron_udma_usage_add` and not removed yet.
pub(crate) struct UsageAttrs(core::ptr::NonNull<ffi::neuron_udma_usage>);

// SAFETY: the group is an address; removing it works from any task.
unsafe impl Send for UsageAttrs {}
// SAFETY: no method takes `&self`.
unsafe impl Sync for UsageAttrs {}

impl UsageAttrs {
    /// Publishes the counters `vals` (in the order of the shim's names) as read-only files of
    /// `dev`.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, or the error of `sysfs_create_group()`.
    ///
    /// # Safety
    ///
    /// Every pointer of `vals` stays valid (and aligned) until the returned value is dropped.
    pub(crate) unsafe fn add(
        dev: &kernel::device::Device<kernel::device::Bound>,
        vals: &[*const u64; 7],
    ) -> Result<Self> {
        let raw = raw_device(dev);
        // SAFETY: `raw` is the bound device `dev`; `vals` holds the shim's count of pointers,
        // valid for as long as the group exists (per the contract).
        let p = unsafe { ffi::neuron_udma_usage_add(raw, vals.as_ptr()) };
        let p = kernel::error::from_err_ptr(p)?;
        // INVARIANT: created now.
        core::ptr::NonNull::new(p).map(Self).ok_or(ENOMEM)
    }
}

impl Drop for UsageAttrs {
    fn drop(&mut self) {
        // SAFETY: by the type invariant created and not removed; removed once, here.
        unsafe { ffi::neuron_udma_usage_remove(self.0.as_ptr()) };
    }
}

pub(crate) struct DmaRegistration(core::ptr::NonNull<ffi::neuron_udma_dma>);

// SAFETY: the registration is an address; unregistering works from any task.
unsafe impl Send for DmaRegistration {}
// SAFETY: no method takes `&self`.
unsafe impl Sync for DmaRegistration {}

impl DmaRegistration {
    /// Registers a `DMA_MEMCPY` `dma_device` of `dev` with one channel per entry of `chans`;
    /// each is a counted reference (`Arc::into_raw`) that the `dma_device` owns from now on and
    /// gives back through `neuron_udma_dma_put_chan` when it is released.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, or the error of `dma_async_device_register()`; the references stay the
    /// caller's then.
    ///
    /// # Safety
    ///
    /// Each entry of `chans` is a reference the trampolines of `rust/dmaengine.rs` accept.
    pub(crate) unsafe fn register<T>(
        dev: &kernel::device::Device<kernel::device::Bound>,
        chans: &[*const T],
    ) -> Result<Self> {
        let nr = u32::try_from(chans.len()).map_err(|_| EINVAL)?;
        let raw = raw_device(dev);
        // SAFETY: `raw` is the bound device `dev`; `chans` holds `nr` valid entries (per the
        // contract), passed to C as its opaque channel type.
        let p = unsafe { ffi::neuron_udma_dma_register(raw, chans.as_ptr().cast(), nr) };
        let p = kernel::error::from_err_ptr(p)?;
        // INVARIANT: registered now.
        core::ptr::NonNull::new(p).map(Self).ok_or(ENOMEM)
    }

    /// Unregisters the `dma_device`: no client finds its channels any more; the release gives
    /// the channels back once the last client let go of its channel.
    pub(crate) fn unregister(self) {
        // SAFETY: by the type invariant registered, and `self` is consumed.
        unsafe { ffi::neuron_udma_dma_unregister(self.0.as_ptr()) }
    }
}

/// Frees the `dma_device`s released so far (module unload, once no client can hold a channel:
/// each holds a module reference).
pub(crate) fn dma_free_released() {
    // SAFETY: plain call; the shim frees only released `dma_device`s.
    unsafe { ffi::neuron_udma_dma_free_released() }
}

/// Waits until `work` is neither queued nor running (`flush_work()`).
pub(crate) fn flush_work<T: ?Sized, const ID: u64>(work: &kernel::workqueue::Work<T, ID>) {
    // SAFETY: `work` is a valid, initialised work item for the duration of the call.
    unsafe { ffi::neuron_udma_flush_work(kernel::workqueue::Work::raw_get(work)) }
}

/// An export's Rust side as C passes it back (`struct neuron_udma_export_hold`).
pub(crate) use ffi::neuron_udma_export_hold as RawExportHold;
/// What the KUnit importer of an export saw (`struct neuron_udma_kunit_report`).
#[cfg(neuron_udma_kunit)]
pub(crate) use ffi::neuron_udma_kunit_report as KunitReport;

/// A dma-buf of a range of device memory (BAR4), exported by the shim's `dma_buf_ops`, with one
/// reference owned by this value: given to a file descriptor by [`Self::install`], or dropped.
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
        let raw = raw_device(dev);
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
        let fd = core::mem::ManuallyDrop::new(fd);
        // SAFETY: by the type invariant the export is live and this value's reference goes to
        // the descriptor (neither value is dropped); `fd` is reserved and not installed.
        unsafe { ffi::neuron_udma_dmabuf_install(this.0.as_ptr(), fd.0) }
    }

    /// Revokes the export: no new mapping, every importer's mapping is gone when this returns.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn revoke(&self) {
        // SAFETY: by the type invariant the export is live.
        unsafe { ffi::neuron_udma_dmabuf_revoke(self.0.as_ptr()) }
    }

    /// Runs the KUnit importer (`rust/shim.c`) on the export from the bound device `dev`; it
    /// revokes the export on the way.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn kunit_import(
        &self,
        dev: &kernel::device::Device<kernel::device::Bound>,
    ) -> KunitReport {
        let mut r = KunitReport::default();
        let raw = raw_device(dev);
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
    let raw = core::ptr::from_ref(dev)
        .cast::<bindings::device>()
        .cast_mut();
    // SAFETY: `raw` is a valid device, only compared with the exports' devices.
    unsafe { ffi::neuron_udma_dmabuf_revoke_all(raw) }
}

/// A file descriptor number reserved in the calling process, not installed yet; given back on
/// drop.
pub(crate) struct ReservedFd(c_int);

impl ReservedFd {
    /// Reserves a descriptor (close-on-exec if `flags` has `O_CLOEXEC`).
    ///
    /// # Errors
    ///
    /// `EMFILE` when the process has no free descriptor.
    pub(crate) fn new(flags: u32) -> Result<Self> {
        // SAFETY: plain call on the current task's descriptor table.
        let fd = unsafe { ffi::neuron_udma_fd_reserve(flags) };
        kernel::error::to_result(fd.min(0))?;
        Ok(Self(fd))
    }

    /// The descriptor number.
    pub(crate) fn number(&self) -> i32 {
        self.0
    }
}

impl Drop for ReservedFd {
    fn drop(&mut self) {
        // SAFETY: reserved by `new` in this task and never installed (`install` forgets it).
        unsafe { ffi::neuron_udma_fd_unreserve(self.0) }
    }
}

/// Another exporter's dma-buf attached to the device (a dynamic attachment with
/// `invalidate_mappings`), pinned and mapped (see `rust/shim.c`). Dropping it unmaps, unpins and
/// detaches it: the owner makes sure no descriptor can reach it any more.
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
        let raw = raw_device(dev);
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
        let raw = raw_device(dev);
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
