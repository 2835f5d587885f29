// SPDX-License-Identifier: GPL-2.0

//! dma-buf export and import (ABI 3: `DMABUF_EXPORT`, `DMABUF_IMPORT`); the `dma_buf_ops` and
//! the importer's attachment are C (`rust/kfac/dmabuf_*.c`, wrapped by `rust/kfac/dmabuf.rs`: 7.3
//! has no dma-buf abstraction).
//!
//! **Export.** A device buffer of a file becomes a dma-buf whose importers get the bus addresses
//! of its device-memory range (BAR4) through the PCI P2PDMA provider. The export keeps the
//! buffer busy ([`ExportHold`]): `MEM_FREE` is `EBUSY`, and a buffer whose file was closed is
//! freed (its device memory given back, to be scrubbed at its next `MEM_ALLOC`) only when the
//! last reference to the dma-buf is gone. Only revocable importers attach (and pinned ones with
//! `dmabuf_pinned_importers`: [`adopt_stranded`]); unbind revokes every export and waits until
//! no importer maps it
//! ([`dmabuf_revoke_all`](crate::kfac::dmabuf::dmabuf_revoke_all)). The dma-buf holds a module
//! reference and, after unbind, only the device's record (as an open file does).
//!
//! **Import.** Another exporter's dma-buf becomes a buffer of the file, pinned and mapped for
//! the device once (see `rust/kfac/dmabuf_import.c`), usable as copy source and, with
//! `IMPORT_WRITE`, destination; its runs are the mapping's segments. If the exporter revokes it, no new copy
//! may name it (`ENXIO`) and the mapping goes once nothing can reach it any more
//! ([`Revoker`]: a bounded drain).

use crate::{
    buffer::{Buffer, BusyGuard, Drain},
    channel::{Owner, DEFAULT_TIMEOUT},
    device::{Entered, UdmaDevice},
    kfac::{
        dmabuf::{DmaBufExport, DmaBufImport, RawExportHold, ReservedFd},
        mm::MappedFile,
        trace::BufferEvent,
    },
    uapi,
};
use kernel::{
    fs::file::flags::O_CLOEXEC,
    prelude::*,
    sync::Arc,
    time::{delay::fsleep, Delta, Instant, Monotonic},
};

/// How long the holders of a revoked import get to finish on their own before the owner's
/// queues that still hold work are reset (copies already started usually complete by then).
const REVOKE_GRACE: Delta = Delta::from_millis(100);
/// How long a copy on the shared H2T queue (`MEMCPY`, `MEMSET`) may keep holding a revoked
/// import before that queue is reset: the default timeout, after which the watchdog would call
/// a queue without progress stuck.
const REVOKE_DEADLINE: Delta = DEFAULT_TIMEOUT;
/// First and longest sleep between two looks at a revoked import's holders.
const DRAIN_SLEEP: (Delta, Delta) = (Delta::from_micros(10), Delta::from_millis(1));

/// What an export keeps while its dma-buf lives: the buffer busy (so it is neither freed nor
/// reused), and the device whose pool frees it afterwards. Owned by the dma-buf (C), given back
/// by [`neuron_udma_dmabuf_released`].
pub(crate) struct ExportHold {
    dev: Arc<UdmaDevice>,
    guard: BusyGuard,
}

/// Exports the device buffer `buf` of `dev` as a dma-buf (one reference, the caller's).
///
/// # Errors
///
/// `EINVAL` if `buf` is not a device buffer, `ENOENT` if it is being freed, `EOPNOTSUPP`
/// without PCI peer-to-peer support, `ENOMEM`, `ENODEV` after unbind.
pub(crate) fn export(dev: &Arc<UdmaDevice>, buf: &Arc<Buffer>) -> Result<DmaBufExport> {
    // Busy first: the memory cannot be freed between the look at it and the export.
    let guard = buf.busy()?;
    let addr = buf.device_addr().ok_or(EINVAL)?;
    let hold = KBox::new(
        ExportHold {
            dev: dev.clone(),
            guard,
        },
        GFP_KERNEL_ACCOUNT,
    )?;
    let raw = KBox::into_raw(hold);
    // Under the state lock with the device alive: the unbind's revocation, which runs after it
    // marked the device dead under that lock, finds every export (a dma-buf takes no lock of the
    // driver's while it is created).
    let r = dev.with_bound(|d| {
        // SAFETY: `raw` is an `ExportHold` from `KBox::into_raw`, which the release callback
        // takes back; `d` is bound for the duration of the call (`with_bound`).
        unsafe { DmaBufExport::new(d, addr, buf.size, raw.cast()) }
    });
    match &r {
        Ok(_) => dev.pool.trace(BufferEvent::Export, buf),
        // SAFETY: on error the hold stays the caller's: taken back once, here.
        Err(_) => drop(unsafe { KBox::from_raw(raw) }),
    }
    r
}

/// The dma-buf of an export was released (its last reference is gone, so no importer maps it):
/// the buffer is no longer busy, and is freed now if its file was closed.
///
/// # Safety
///
/// `hold` is the `ExportHold` given to the export (`KBox::into_raw`), not used afterwards.
#[no_mangle]
unsafe extern "C" fn neuron_udma_dmabuf_released(hold: *mut RawExportHold) {
    // SAFETY: per the function's contract.
    let hold = unsafe { KBox::from_raw(hold.cast::<ExportHold>()) };
    let ExportHold { dev, guard } = KBox::into_inner(hold);
    let buf = guard.buffer().clone();
    drop(guard);
    dev.pool.free_if_released(&buf);
}

/// Reserves, in the new binding `dev` of a device, the range of every stranded export of the
/// device (revoked by an earlier unbind while a pinned importer still mapped it, see
/// `rust/kfac/dmabuf_export.c`), so that no buffer gets memory that importer may still reach.
/// Called by the probe before anything is allocated; [`sweep_stranded`] follows once the device
/// is in the registry.
///
/// # Errors
///
/// `EINVAL` if a range is not free, `ENOMEM`: the probe fails then.
pub(crate) fn adopt_stranded(dev: &UdmaDevice) -> Result {
    let mut after = 0;
    while let Some((instance, offset, len)) =
        crate::kfac::dmabuf::stranded_next(dev.pdev.as_ref(), after)
    {
        dev.pool.reserve_stranded(instance, offset, len)?;
        dev_warn!(
            dev.pdev,
            "device memory [{:#x}, +{:#x}) stays reserved: a pinned importer of a dma-buf of an earlier binding may still reach it\n",
            offset,
            len
        );
        after = instance;
    }
    Ok(())
}

/// Frees the reservations of [`adopt_stranded`] whose export was released before the device was
/// in the registry, where [`neuron_udma_dmabuf_stranded_released`] finds it. (Without memory
/// for the list, they stay reserved until the next binding: too much kept, nothing handed out.)
pub(crate) fn sweep_stranded(dev: &UdmaDevice) {
    for instance in dev.pool.stranded().unwrap_or_default() {
        if !crate::kfac::dmabuf::is_stranded(instance) {
            dev.pool.unreserve_stranded(instance);
        }
    }
}

/// The stranded export `instance` was released (its pinned importer detached): the binding
/// that reserved the export's range, if one did, frees it (instances are never reused, so only
/// that binding's pool knows it; the binding of the same PCI function may be a new `pci_dev`
/// after a remove and rescan, so every bound device is asked).
///
/// # Safety
///
/// None: C passes a number.
#[no_mangle]
unsafe extern "C" fn neuron_udma_dmabuf_stranded_released(instance: u64) {
    crate::Registry::for_each(|d| {
        d.pool.unreserve_stranded(instance);
    });
}

/// A `DMABUF_EXPORT` whose dma-buf exists and whose descriptor is reserved: [`Self::install`]
/// publishes it once its number reached user space; dropped, it undoes both.
pub(crate) struct PendingExport {
    dmabuf: DmaBufExport,
    fd: ReservedFd,
}

impl PendingExport {
    /// Publishes the dma-buf as the reserved descriptor.
    pub(crate) fn install(self) {
        self.dmabuf.install(self.fd);
    }
}

/// `DMABUF_EXPORT` of the open file `owner` of `dev`: the dma-buf of its buffer `e.handle`, with
/// a descriptor reserved (`e.fd`).
///
/// # Errors
///
/// `EINVAL` (flags other than `O_CLOEXEC`, reserved set, not a device buffer), `ENOENT`,
/// `EMFILE`, `EOPNOTSUPP`, `ENOMEM`, `ENODEV`.
pub(crate) fn export_ioctl(
    dev: &Arc<UdmaDevice>,
    owner: u64,
    e: &mut uapi::neuron_udma_dmabuf_export,
) -> Result<PendingExport> {
    if e.reserved != 0 || e.flags & !O_CLOEXEC != 0 {
        return Err(EINVAL);
    }
    let buf = dev.pool.get(owner, e.handle)?;
    let dmabuf = export(dev, &buf)?;
    let fd = ReservedFd::new(e.flags)?;
    e.fd = fd.number();
    Ok(PendingExport { dmabuf, fd })
}

/// `DMABUF_IMPORT` of the open file `owner` / `owner_file` of `dev`: the dma-buf `a.fd` as
/// buffer `handle`, not in the pool yet. The returned section keeps the device bound until the
/// caller published the buffer (or freed it), so that the unbind frees it.
///
/// # Errors
///
/// `EINVAL` (unknown flags, reserved set), `EBADF` (not a dma-buf), `EACCES` (`IMPORT_WRITE` on
/// a dma-buf not open for writing), `EOPNOTSUPP` (the exporter cannot give this device its
/// memory), `ENXIO` (revoked meanwhile), `ENOMEM`, `EINTR`, `ENODEV`.
pub(crate) fn import_ioctl<'a>(
    dev: &'a Arc<UdmaDevice>,
    owner: u64,
    owner_file: MappedFile,
    handle: u64,
    a: &mut uapi::neuron_udma_dmabuf_import,
) -> Result<(Arc<Buffer>, Entered<'a>)> {
    let write = a.flags & uapi::NEURON_UDMA_IMPORT_WRITE != 0;
    if a.reserved != 0 || a.flags & !uapi::NEURON_UDMA_IMPORT_WRITE != 0 {
        return Err(EINVAL);
    }
    // Not under the state lock: the exporter's reservation lock is taken inside, and the
    // revocation callbacks take the state lock under it.
    let entered = dev.enter()?;
    // SAFETY: the section keeps the device bound during the call; the import belongs to the
    // buffer, which the pool frees at unbind at the latest (the section lasts until it is in
    // the pool or freed).
    let (imp, size) = unsafe { DmaBufImport::new(a.fd, entered.bound(), write) }?;
    let drain: Arc<dyn Drain> = Arc::new(Revoker(dev.clone()), GFP_KERNEL_ACCOUNT)?;
    let buf = Buffer::imported_dmabuf(handle, size, owner, owner_file, imp, drain, write)?;
    a.handle = handle;
    a.size = size;
    a.segments = u32::try_from(buf.run_count()).unwrap_or(u32::MAX);
    Ok((buf, entered))
}

/// Drains the revoked imports of a device ([`Drain`]).
struct Revoker(Arc<UdmaDevice>);

impl Drain for Revoker {
    /// Retires what the owner's queues completed until nothing holds `buf`. After
    /// [`REVOKE_GRACE`] it resets the owner's queues whose unretired submissions name `buf`
    /// (pairs prepared and never started would hold it forever), and only those: the file's
    /// other queues go on. A `MEMCPY` or `MEMSET` naming it, abandoned or not, runs on the
    /// device's H2T queues (the shared one, and the other H2T engines' for a striped one): it
    /// submits nothing more once `buf` is revoked (it fails with `ENXIO`), and what it has in
    /// flight normally completes (an aborted or stuck queue is reset by the orphans' rule); if
    /// `buf` is still held [`REVOKE_DEADLINE`] later (a queue full of other copies, or
    /// stalled), every H2T queue with work is reset (again each [`REVOKE_DEADLINE`] while `buf`
    /// is held; a `MEMCPY` records no holds on the queues, so whose work names `buf` is not
    /// known), so the drain is bounded whatever else those queues carry (other files' copies
    /// on them then fail with `EIO`: the exporter's revocation comes first).
    fn drain(&self, buf: &Buffer) {
        let dev = &self.0;
        let start = Instant::<Monotonic>::now();
        // When the H2T queues are reset next if a copy there still holds `buf`.
        let mut h2t_reset_at = REVOKE_DEADLINE;
        let mut sleep = DRAIN_SLEEP.0;
        while buf.is_busy() {
            let elapsed = start.elapsed();
            for chan in dev.queues().unwrap_or_default().iter() {
                if chan.owner != Owner::File(buf.owner) {
                    continue;
                }
                let _ = chan.retire();
                if elapsed >= REVOKE_GRACE && chan.holds(buf) {
                    dev_warn!(
                        dev.pdev,
                        "engine {} queue {}: reset, its copies name an imported dma-buf its exporter revoked\n",
                        chan.id.eng.get(),
                        chan.id.q.number()
                    );
                    let _ = chan.reset(EIO);
                }
            }
            if elapsed >= h2t_reset_at && buf.is_busy() {
                // A `MEMCPY`/`MEMSET` naming `buf` submits nothing more once it is revoked
                // (`H2t::copy_for_file`): a reset ends what it has in flight, on every queue
                // a striped one runs on.
                h2t_reset_at = elapsed + REVOKE_DEADLINE;
                if let Ok(h2t) = dev.h2t() {
                    for chan in h2t.queues().filter(|c| c.has_work().unwrap_or(false)) {
                        dev_warn!(
                            dev.pdev,
                            "engine {} queue {}: reset, a copy on it may still name an imported dma-buf {} s after its exporter revoked it\n",
                            chan.id.eng.get(),
                            chan.id.q.number(),
                            REVOKE_DEADLINE.as_millis() / 1000
                        );
                        let _ = chan.reset(EIO);
                    }
                }
            }
            UdmaDevice::reap_later(dev);
            if !buf.is_busy() {
                break;
            }
            fsleep(sleep);
            sleep = (sleep + sleep).min(DRAIN_SLEEP.1);
        }
    }
}

#[cfg(neuron_udma_kunit)]
#[kunit_tests(neuron_udma_dmabuf)]
mod tests {
    use super::*;
    use crate::Registry;

    /// BAR4, the device memory (`driver.rs`).
    const DRAM_BAR: u32 = 4;

    /// Waits up to a second for `buf` to be no longer busy (the release of a dma-buf put by a
    /// kernel thread runs from the delayed-fput worker).
    fn settles(buf: &Buffer) -> bool {
        for _ in 0..1000 {
            if !buf.is_busy() {
                return true;
            }
            fsleep(Delta::from_millis(1));
        }
        false
    }

    /// Takes `buf` (settled: [`settles`]) for freeing and frees it, returning its device
    /// memory to `dev`'s pool. (The tests assert `settles` themselves: a KUnit assertion
    /// belongs in the test's body.)
    fn free_settled(dev: &UdmaDevice, buf: &Buffer) -> Result {
        buf.take_for_free()?;
        if let Some(a) = buf.free() {
            dev.pool.free_dram(a);
        }
        Ok(())
    }

    /// An importer in the kernel (`rust/kfac/dmabuf_kunit.c`) attaches to an export of a device buffer, maps
    /// it and gets exactly the bus range of the buffer in BAR4; the revocation (unbind's) tells
    /// it to unmap, and afterwards it can neither map nor attach. The buffer stays busy (no
    /// `MEM_FREE`) until the dma-buf is released.
    #[test]
    fn importer_maps_bar4_and_is_revoked() -> Result {
        let dev = Registry::first().ok_or(ENODEV)?;
        let size = 3 * 65536;
        let buf = dev.alloc_buffer(false, size, 1, 0, MappedFile::none())?;
        let addr = buf.device_addr().ok_or(EINVAL)?;
        let exp = export(&dev, &buf)?;
        assert!(buf.is_busy());
        assert_eq!(buf.take_for_free(), Err(EBUSY));
        let report = {
            let entered = dev.enter()?;
            exp.kunit_import(entered.bound())
        };
        let bar4 = dev.pdev.resource_start(DRAM_BAR)?;
        assert_eq!(report.static_attach, EOPNOTSUPP.to_errno());
        assert_eq!(report.attach, 0);
        assert_eq!(report.map, 0);
        assert_eq!(report.nents, 1);
        // The device's own BAR is reached at its bus address, which on x86 is its CPU physical
        // address: device address = BAR4 offset (HBM0).
        assert_eq!(report.first_addr, bar4 + addr);
        assert_eq!(report.bytes, size);
        assert_eq!(report.invalidations, 1);
        assert_eq!(report.unmapped, 1);
        assert_eq!(report.map_after, ENODEV.to_errno());
        assert_eq!(report.attach_after, ENODEV.to_errno());
        drop(exp);
        assert!(settles(&buf));
        free_settled(&dev, &buf)
    }

    /// The driver's own import of an export of the same device reaches the buffer by its device
    /// addresses; when the export is revoked while a submission holds the import, no new copy
    /// may name it (`ENXIO`) and the revocation waits until the hold is gone, then unmaps.
    #[test]
    fn revoked_import_waits_for_its_holders() -> Result {
        let dev = Registry::first().ok_or(ENODEV)?;
        let size = 65536;
        let buf = dev.alloc_buffer(false, size, 3, 0, MappedFile::none())?;
        let addr = buf.device_addr().ok_or(EINVAL)?;
        let exp = export(&dev, &buf)?;
        let (imp, isize) = {
            let entered = dev.enter()?;
            // SAFETY: the section keeps the device bound during the call; the import is
            // released below, before this test ends.
            unsafe { DmaBufImport::of_export(&exp, entered.bound()) }?
        };
        assert_eq!(isize, size);
        let drain: Arc<dyn Drain> = Arc::new(Revoker(dev.clone()), GFP_KERNEL)?;
        // An owner without queues: only the hold below keeps the import busy.
        let ib = Buffer::imported_dmabuf(4, size, u64::MAX, MappedFile::none(), imp, drain, true)?;
        assert_eq!(ib.run_count(), 1);
        let route = dev.arch.host_route;
        assert_eq!(ib.span(route, 0, size)?.at(0), Some((addr, size)));
        let hold = crate::buffer::InFlight::new(&ib)?;

        let done = Arc::pin_init(kernel::sync::Completion::new(), GFP_KERNEL)?;
        let revoked = Arc::new(kernel::sync::atomic::Atomic::new(0u32), GFP_KERNEL)?;
        {
            let (done, revoked) = (done.clone(), revoked.clone());
            crate::kfac::sched::system_dfl().try_spawn(GFP_KERNEL, move || {
                exp.revoke();
                revoked.store(1, kernel::sync::atomic::Release);
                drop(exp);
                done.complete_all();
            })?;
        }
        fsleep(Delta::from_millis(50));
        assert!(ib.busy().is_err());
        assert!(crate::buffer::InFlight::new(&ib).is_err());
        assert_eq!(revoked.load(kernel::sync::atomic::Acquire), 0);
        drop(hold);
        done.wait_for_completion();
        ib.take_for_free()?;
        ib.free();
        assert!(settles(&buf));
        free_settled(&dev, &buf)
    }

    /// After the grace period a revoked import resets only the owner's queues whose
    /// submissions name it: a queue of the same owner whose prepared pair names another buffer
    /// keeps it (and its hold), the queue naming the import is reset and holds nothing.
    #[test]
    fn revocation_resets_only_queues_naming_the_import() -> Result {
        use crate::{
            desc::{Barrier, DescLen},
            holds::Holds,
            queue::Copy,
        };
        let dev = Registry::first().ok_or(ENODEV)?;
        let size = 4096;
        let owner = u64::MAX - 1;
        let buf = dev.alloc_buffer(false, size, 5, 0, MappedFile::none())?;
        let host = dev.alloc_buffer(true, size, 6, owner, MappedFile::none())?;
        let exp = export(&dev, &buf)?;
        let (imp, _) = {
            let entered = dev.enter()?;
            // SAFETY: the section keeps the device bound during the call; the import is
            // released below, before this test ends.
            unsafe { DmaBufImport::of_export(&exp, entered.bound()) }?
        };
        let drain: Arc<dyn Drain> = Arc::new(Revoker(dev.clone()), GFP_KERNEL)?;
        let ib = Buffer::imported_dmabuf(7, size, owner, MappedFile::none(), imp, drain, true)?;
        let route = dev.arch.host_route;
        let (imported, _) = ib.span(route, 0, size)?.at(0).ok_or(EINVAL)?;
        let (hosted, _) = host.span(route, 0, size)?.at(0).ok_or(EINVAL)?;
        let eng = dev.arch.h2t[0].0;
        let naming = dev.queue_init_at(eng, 6, 32, 32, Owner::File(owner))?;
        let other = dev.queue_init_at(eng, 7, 32, 32, Owner::File(owner))?;
        let r = (|| -> Result {
            let pair = |src, dst| -> Result<[Copy; 1]> {
                Ok([Copy {
                    src,
                    dst,
                    len: DescLen::new(64)?,
                    barrier: Barrier::None,
                }])
            };
            let mut h = Holds::default();
            h.add(&ib)?;
            naming.prepare(&pair(imported, hosted)?, 1, h)?;
            let mut h = Holds::default();
            h.add(&host)?;
            other.prepare(&pair(hosted, hosted + 2048)?, 1, h)?;
            assert!(naming.holds(&ib) && !other.holds(&ib) && other.holds(&host));
            // Prepared and never started: only the reset lets the revocation end.
            exp.revoke();
            assert!(!ib.is_busy());
            assert!(!naming.holds(&ib) && !naming.has_work()?);
            assert!(other.holds(&host) && other.has_work()?);
            Ok(())
        })();
        dev.queue_release(naming.owner, naming.id)?;
        dev.queue_release(other.owner, other.id)?;
        drop(exp);
        r?;
        ib.take_for_free()?;
        ib.free();
        assert!(settles(&host));
        free_settled(&dev, &host)?;
        assert!(settles(&buf));
        free_settled(&dev, &buf)
    }

    /// Only device buffers are exported.
    #[test]
    fn host_buffers_are_not_exported() -> Result {
        let dev = Registry::first().ok_or(ENODEV)?;
        let buf = dev.alloc_buffer(true, 4096, 2, 0, MappedFile::none())?;
        assert!(matches!(export(&dev, &buf), Err(e) if e == EINVAL));
        assert!(!buf.is_busy());
        // No file: nothing to unmap from.
        buf.mark_released();
        buf.free();
        Ok(())
    }
}
