// SPDX-License-Identifier: GPL-2.0

//! DMA buffers handed to user space: host buffers (coherent memory, mmap'able), device
//! buffers (ranges of the device memory, HBM), imported buffers (the caller's own pages,
//! pinned: `MEM_IMPORT`) and imported dma-bufs (another exporter's memory: `DMABUF_IMPORT`).
//! User space names them by handle; the driver translates (handle, offset, size) into
//! device-fabric addresses ([`Span`]) after a bounds check.
//!
//! A buffer is kept from being freed while the engine may reach it: by a [`BusyGuard`] while a
//! synchronous copy uses it, by the resident set of each queue whose copies named it
//! (`resident.rs`: a count under its pool shard's lock for a driver-allocated buffer, kept
//! while a submission uses it), and by a hold per submission for an import (an [`InFlight`]
//! reference, `holds.rs`), which `queue.rs` drops when the submission's fence retires or a
//! reset drops it.

use crate::{
    charge::Charge,
    kfac::{
        dmabuf::DmaBufImport,
        mm::{MappedFile, PinnedPages, VmFault},
    },
    span::{Segment, Span},
};
use kernel::{
    dma::Coherent,
    new_mutex,
    page::{PAGE_SHIFT, PAGE_SIZE},
    prelude::*,
    processor::cpu_relax,
    sync::{
        atomic::{self, Atomic, Full, Relaxed},
        Arc, Mutex,
    },
};

/// Granularity and alignment of every buffer, in bytes.
pub(crate) const BUF_ALIGN: u64 = 4096;
/// Largest host buffer in bytes: coherent memory is physically contiguous, and the page
/// allocator's largest block is 4 MiB (`MAX_PAGE_ORDER` 10 with 4 KiB pages).
pub(crate) const MAX_HOST_BUFFER: u64 = 4 << 20;
/// Bytes of mmap offset space per handle: a host buffer's mmap offset is its handle times
/// this (at least [`MAX_HOST_BUFFER`], so buffers' offset ranges never overlap).
pub(crate) const MMAP_STRIDE_SHIFT: u32 = 22;
const _: () = assert!(1u64 << MMAP_STRIDE_SHIFT >= MAX_HOST_BUFFER);
/// Largest range of one `MEM_IMPORT`, in bytes: bounds the kernel memory of its page and
/// segment tables (about 40 bytes per page: 10 MiB for 1 GiB).
pub(crate) const MAX_IMPORT_SIZE: u64 = 1 << 30;
/// Handles from this one on have no mmap offset that fits in a (signed) file offset.
const HANDLE_LIMIT: u64 = 1 << (63 - MMAP_STRIDE_SHIFT);
/// What backs a buffer.
pub(crate) enum Backing {
    /// Coherent host memory, with its charge to the allocating process (`None` for the
    /// driver's own buffers).
    Host(Coherent<[u8]>, Option<Charge>),
    /// Device memory at this device-fabric address, and the CPU physical address of that byte
    /// in BAR4 (for user mappings; device address = BAR4 offset, `arch.rs` `hbm0_len`).
    Device(u64, u64),
    /// The importing process's pages, pinned and mapped for the device, with their charge.
    Pinned(PinnedPages, Charge),
    /// Another exporter's dma-buf mapped for the device, what drains the buffer if the exporter
    /// revokes it, and whether its addresses are device addresses (this driver's own export of
    /// the same device's memory) rather than host DMA addresses.
    DmaBuf(DmaBufImport, Arc<dyn Drain>, bool),
}

/// What waits, for an imported dma-buf that its exporter revoked while it was in use, until no
/// descriptor or copy can reach it any more (`dmabuf.rs`: the device).
pub(crate) trait Drain: Send + Sync {
    /// Returns once nothing holds `buf` ([`Buffer::is_busy`] is false); `buf` is revoked, so no
    /// new hold can be taken. Bounded: it resets what does not finish on its own.
    fn drain(&self, buf: &Buffer);
}

/// What memory a buffer is (the usage counters of `pool.rs` and the file's `fdinfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemKind {
    /// Coherent host memory (`MEM_ALLOC` host).
    Host = 0,
    /// Device memory (`MEM_ALLOC` device).
    Device = 1,
    /// The caller's own pages (`MEM_IMPORT`).
    Imported = 2,
}

/// [`Buffer`] `freeing`: no `MEM_FREE` of the buffer is deciding or has freed it.
const FREE_NONE: u32 = 0;
/// [`Buffer`] `freeing`: a `MEM_FREE` is deciding whether the buffer is busy.
const FREE_DECIDING: u32 = 1;
/// [`Buffer`] `freeing`: a `MEM_FREE` decided to free the buffer; no reference is taken any more.
const FREE_DONE: u32 = 2;

/// One buffer. The backing is `None` once freed (also by unbind).
///
/// Lifetime: the memory is freed by [`Buffer::free`] (`MEM_FREE`, closing the file, unbind)
/// only when no prepared descriptor pair references it ([`Buffer::is_busy`]), and user
/// mappings are filled page by page on fault, under the backing lock: once `free` has taken
/// the backing, no new page can be mapped, and the pages mapped before are removed before the
/// memory is released. A mapping made at any time (also one racing `MEM_FREE`) therefore never
/// reaches freed memory: it faults with `SIGBUS`.
#[pin_data]
pub(crate) struct Buffer {
    /// Handle, unique on the system, never 0, never reused.
    pub(crate) handle: u64,
    /// Size in bytes (a multiple of [`BUF_ALIGN`], except for imported buffers: any size).
    pub(crate) size: u64,
    /// The physically contiguous runs of an imported buffer (empty for the others, which are
    /// contiguous). Fixed at creation; the addresses are only used while the buffer is alive
    /// (see [`Self::base`]).
    segments: KVVec<Segment>,
    /// Whether the engine may write the buffer (false only for imports without
    /// `IMPORT_WRITE`, mapped to-device only).
    pub(crate) writable: bool,
    /// Offset for mmap() of a host or device buffer (`handle << 22`: unique, never reused); 0
    /// for imports.
    pub(crate) mmap_offset: u64,
    /// Id of the owning open file: only it may use the handle.
    pub(crate) owner: u64,
    /// What memory it is.
    pub(crate) kind: MemKind,
    /// Bytes charged to the owner's locked memory (`RLIMIT_MEMLOCK`) for it.
    pub(crate) charged: u64,
    /// Device-fabric address of byte 0 while the memory is there, fixed at creation (see
    /// [`Self::held_base`]): the DMA address of a host buffer, the device address of a device
    /// buffer, 0 for an import (whose runs carry their own addresses).
    fabric_base: u64,
    /// Whether the host route is OR-ed onto [`Self::fabric_base`] (host memory and host DMA
    /// addresses of imports; not device memory).
    routed: bool,
    /// Whether it is an imported dma-buf (`DMABUF_IMPORT`; the tracepoints' kind).
    pub(crate) dmabuf: bool,
    /// The owning open file, whose mapping holds the buffer's user mappings.
    owner_file: MappedFile,
    /// Synchronous copies (`MEMCPY`) using the buffer right now.
    users: Atomic<u32>,
    /// [`FREE_NONE`], [`FREE_DECIDING`] while a `MEM_FREE` of the buffer decides
    /// ([`Self::take_for_free`]), [`FREE_DONE`] for good once it decided to free it.
    freeing: Atomic<u32>,
    /// Submissions holding the buffer by a counted reference ([`InFlight`]: imports) whose
    /// pairs the engine may still process.
    inflight: Atomic<u32>,
    /// Queues' resident sets holding the buffer through its pool shard
    /// ([`Self::hold_pooled`]: driver-allocated buffers): changed only under the shard's lock,
    /// by a load and a store.
    held: Atomic<u32>,
    /// Non-zero once the exporter of an imported dma-buf revoked it: no new hold is taken
    /// (`ENXIO`), and the mapping goes once the existing ones are gone.
    revoked: Atomic<u32>,
    /// Position in the pool's table (`pool.rs`).
    pub(crate) table_index: Atomic<usize>,
    /// Non-zero once the owning file is released ([`Self::mark_released`]); a buffer that is
    /// busy then is freed when its last user is done (`orphan.rs`).
    released: Atomic<u32>,
    #[pin]
    backing: Mutex<Option<Backing>>,
}

impl Buffer {
    /// Creates the record of buffer `handle` (`size` bytes) of the open file `owner` /
    /// `owner_file`; a host buffer gets its mmap offset.
    ///
    /// # Errors
    ///
    /// `ENOMEM` if the record cannot be allocated or the handle has no mmap offset (after
    /// 2^41 allocations).
    pub(crate) fn new(
        handle: u64,
        size: u64,
        owner: u64,
        owner_file: MappedFile,
        backing: Backing,
    ) -> Result<Arc<Self>> {
        Self::with_segments(handle, size, owner, owner_file, backing, KVVec::new(), true)
    }

    /// Creates the record of the imported buffer `handle`: `size` bytes of the pinned pages
    /// `pages` (charged with `charge`), whose DMA segments become its runs; the engine may
    /// write it if `writable`.
    ///
    /// # Errors
    ///
    /// `ENOMEM`; the pages are unpinned then.
    pub(crate) fn imported(
        handle: u64,
        size: u64,
        owner: u64,
        owner_file: MappedFile,
        pages: PinnedPages,
        charge: Charge,
        writable: bool,
    ) -> Result<Arc<Self>> {
        let segments = crate::span::runs(pages.dma_segments())?;
        if segments.iter().map(|s| s.len).sum::<u64>() != size {
            // The table covers exactly the range (`neuron_udma_pin_user`): never reached.
            return Err(EINVAL);
        }
        let backing = Backing::Pinned(pages, charge);
        Self::with_segments(handle, size, owner, owner_file, backing, segments, writable)
    }

    /// Creates the record of buffer `handle`, the imported dma-buf `imp` of `size` bytes
    /// (`drain` drains it if the exporter revokes it), and connects the import to it. The
    /// mapping's segments become its runs: host DMA addresses, or for this driver's own export
    /// of the same device's memory ([`DmaBufImport::local_base`]) the device addresses of that
    /// range, which the engine reaches directly. The engine may write it if `writable`.
    ///
    /// # Errors
    ///
    /// `EOPNOTSUPP` if the mapping is shorter than the dma-buf, `ENXIO` if the exporter revoked
    /// it meanwhile, `ENOMEM`; the import is released then.
    pub(crate) fn imported_dmabuf(
        handle: u64,
        size: u64,
        owner: u64,
        owner_file: MappedFile,
        imp: DmaBufImport,
        drain: Arc<dyn Drain>,
        writable: bool,
    ) -> Result<Arc<Self>> {
        let local = imp.local_base();
        let mut left = size;
        let clipped = imp.dma_segments().filter_map(|(addr, len)| {
            let n = len.min(left);
            left -= n;
            (n != 0).then(|| (local.map_or(addr, |base| addr.wrapping_sub(base)), n))
        });
        let segments = crate::span::runs(clipped)?;
        if segments.iter().map(|s| s.len).sum::<u64>() != size {
            return Err(EOPNOTSUPP);
        }
        let backing = Backing::DmaBuf(imp, drain, local.is_some());
        let buf =
            Self::with_segments(handle, size, owner, owner_file, backing, segments, writable)?;
        if let Some(Backing::DmaBuf(imp, ..)) = &*buf.backing.lock() {
            // SAFETY: `buf` is the record whose backing holds the import; the backing is freed
            // (`free`, which releases the import) before the record goes.
            unsafe { imp.connect(Arc::as_ptr(&buf)) }?;
        }
        Ok(buf)
    }

    fn with_segments(
        handle: u64,
        size: u64,
        owner: u64,
        owner_file: MappedFile,
        backing: Backing,
        segments: KVVec<Segment>,
        writable: bool,
    ) -> Result<Arc<Self>> {
        if handle >= HANDLE_LIMIT {
            return Err(ENOMEM);
        }
        let mmap_offset = match backing {
            Backing::Host(..) | Backing::Device(..) => handle << MMAP_STRIDE_SHIFT,
            Backing::Pinned(..) | Backing::DmaBuf(..) => 0,
        };
        let (kind, charged) = match &backing {
            Backing::Host(_, c) => (MemKind::Host, c.as_ref().map_or(0, |c| c.bytes())),
            Backing::Device(..) => (MemKind::Device, 0),
            Backing::Pinned(_, c) => (MemKind::Imported, c.bytes()),
            Backing::DmaBuf(..) => (MemKind::Imported, 0),
        };
        let dmabuf = matches!(backing, Backing::DmaBuf(..));
        let (fabric_base, routed) = match &backing {
            Backing::Host(c, _) => (c.dma_address(), true),
            Backing::Device(a, _) => (*a, false),
            Backing::Pinned(..) | Backing::DmaBuf(_, _, false) => (0, true),
            Backing::DmaBuf(_, _, true) => (0, false),
        };
        Arc::pin_init(
            try_pin_init!(Self {
                handle,
                size,
                segments,
                writable,
                mmap_offset,
                owner,
                kind,
                charged,
                fabric_base,
                routed,
                dmabuf,
                owner_file,
                users: Atomic::new(0),
                freeing: Atomic::new(0),
                inflight: Atomic::new(0),
                held: Atomic::new(0),
                revoked: Atomic::new(0),
                table_index: Atomic::new(usize::MAX),
                released: Atomic::new(0),
                backing <- new_mutex!(Some(backing)),
            }),
            GFP_KERNEL_ACCOUNT,
        )
    }

    /// Marks the buffer in use until the returned guard is dropped.
    ///
    /// # Errors
    ///
    /// `ENOENT` if a `MEM_FREE` freed the buffer ([`Self::take_for_free`]).
    pub(crate) fn busy(self: &Arc<Self>) -> Result<BusyGuard> {
        self.claim(&self.users)?;
        Ok(BusyGuard(self.clone()))
    }

    /// Counts one more user in `counter` unless the buffer was freed. With
    /// [`Self::take_for_free`] this is the classic store-then-load handshake: each side makes its
    /// own mark with a fully ordered read-modify-write, then reads the other's, so at least one
    /// of the two sees the other: busy guards and imports' holds take no lock shared with
    /// `MEM_FREE` (a driver-allocated buffer's resident hold is counted under the shard's lock
    /// `MEM_FREE` decides under, [`Self::hold_pooled`]). A claim that sees a `MEM_FREE`
    /// deciding ([`FREE_DECIDING`]) waits for the decision, a few instructions under the pool
    /// lock that never sleep: either that `MEM_FREE` saw this count and gives up (`EBUSY`, the
    /// claim succeeds), or it did not and frees the buffer (the claim is `ENOENT`). A `MEM_FREE` that fails therefore never makes a
    /// valid copy fail. A revoked dma-buf ([`Self::revoke`]) is claimed by the same handshake:
    /// the claim fails (`ENXIO`), or the revocation sees it and waits for it.
    fn claim(&self, counter: &Atomic<u32>) -> Result {
        counter.fetch_add(1, Full);
        if self.revoked.load(Relaxed) != 0 {
            counter.fetch_sub(1, Relaxed);
            return Err(ENXIO);
        }
        loop {
            match self.freeing.load(Relaxed) {
                FREE_NONE => return Ok(()),
                FREE_DONE => {
                    counter.fetch_sub(1, Relaxed);
                    return Err(ENOENT);
                }
                _ => cpu_relax(),
            }
        }
    }

    /// Starts a `MEM_FREE`: from now on no new [`BusyGuard`], [`InFlight`] reference or pooled
    /// hold ([`Self::hold_pooled`]) can be taken; then checks that none exists. On `EBUSY` the
    /// mark is taken back and nothing changed.
    ///
    /// # Errors
    ///
    /// `EBUSY` if the buffer is busy ([`Self::is_busy`]) or another `MEM_FREE` of it is under
    /// way.
    ///
    /// The caller holds the lock of the buffer's pool shard if submissions may hold it through
    /// the shard ([`Self::hold_pooled`]): their count is read under it.
    pub(crate) fn take_for_free(&self) -> Result {
        if self
            .freeing
            .cmpxchg(FREE_NONE, FREE_DECIDING, Full)
            .is_err()
        {
            return Err(EBUSY);
        }
        // Nothing between the mark and its outcome may sleep: claims wait for the outcome.
        if self.is_busy() {
            self.freeing.store(FREE_NONE, atomic::Release);
            return Err(EBUSY);
        }
        self.freeing.store(FREE_DONE, atomic::Release);
        Ok(())
    }

    /// Whether a [`BusyGuard`], an [`InFlight`] reference or a pooled hold exists: a `MEMCPY`
    /// runs on the buffer, or a prepared pair that the engine has not consumed references it.
    /// Exact for the pooled holds under the buffer's shard lock only.
    pub(crate) fn is_busy(&self) -> bool {
        self.users.load(Relaxed) != 0
            || self.inflight.load(Relaxed) != 0
            || self.held.load(Relaxed) != 0
    }

    /// Holds the driver-allocated buffer for one more resident set. The caller holds the lock
    /// of the pool shard the buffer is in (`pool::Shard`), under which every change of the
    /// count, every `MEM_FREE` decision ([`Self::take_for_free`]) and every removal from the
    /// shard happen: a plain load and store count it, no atomic read-modify-write.
    ///
    /// # Errors
    ///
    /// `ENOENT` if a `MEM_FREE` freed the buffer.
    pub(crate) fn hold_pooled(&self) -> Result {
        // FREE_DECIDING is never seen here: `MEM_FREE` decides under the shard's lock.
        if self.freeing.load(Relaxed) != FREE_NONE {
            return Err(ENOENT);
        }
        self.held.store(self.held.load(Relaxed) + 1, Relaxed);
        Ok(())
    }

    /// Gives back one hold of [`Self::hold_pooled`], under the same lock.
    pub(crate) fn unhold_pooled(&self) {
        let held = self.held.load(Relaxed);
        // Never 0: each hold is given back once. Kept at 0 (busy by nothing) if it were.
        kernel::warn_on!(held == 0);
        self.held.store(held.saturating_sub(1), Relaxed);
    }

    /// Resident sets holding the buffer through its shard ([`Self::hold_pooled`]); exact under
    /// the shard's lock.
    pub(crate) fn pooled_holds(&self) -> u32 {
        self.held.load(Relaxed)
    }

    /// Where bytes `[offset, offset + len)` are; `route` is OR-ed onto host DMA addresses (the
    /// generation's host route, hardware.rst §1.3).
    ///
    /// # Errors
    ///
    /// `ERANGE` if the range does not lie inside the buffer, `ENOENT` or `ENODEV` if it was
    /// freed ([`Self::base`]).
    pub(crate) fn span(&self, route: u64, offset: u64, len: u64) -> Result<Span<'_>> {
        self.check_range(offset, len)?;
        Ok(self.span_at(self.base(route)?, offset))
    }

    /// Where the bytes from `offset` on are, given the [`Self::base`] of the buffer (the caller
    /// checked the range).
    pub(crate) fn span_at(&self, base: u64, offset: u64) -> Span<'_> {
        if self.segments.is_empty() {
            Span::Linear(base + offset)
        } else {
            Span::Runs {
                segs: &self.segments,
                start: offset,
                route: base,
            }
        }
    }

    /// Physically contiguous runs of the buffer (1 unless imported).
    pub(crate) fn run_count(&self) -> usize {
        self.segments.len().max(1)
    }

    /// Checks that the engine may write the buffer.
    ///
    /// # Errors
    ///
    /// `EPERM` for an import without `IMPORT_WRITE`.
    pub(crate) fn check_writable(&self) -> Result {
        if self.writable {
            Ok(())
        } else {
            Err(EPERM)
        }
    }

    /// Checks that bytes `[offset, offset + len)` lie inside the buffer.
    ///
    /// # Errors
    ///
    /// `ERANGE` if they do not.
    pub(crate) fn check_range(&self, offset: u64, len: u64) -> Result {
        in_range(self.size, offset, len)
    }

    /// Device-fabric address of byte 0 (see [`Self::span`]); for an imported buffer, whose
    /// runs have their own addresses, the route alone.
    ///
    /// # Errors
    ///
    /// `ENOENT` if a `MEM_FREE` freed the buffer (a lookup that raced with it), `ENODEV` if
    /// the unbind did.
    pub(crate) fn base(&self, route: u64) -> Result<u64> {
        match &*self.backing.lock() {
            Some(_) => Ok(self.held_base(route)),
            // `MEM_FREE` marks the buffer before it takes the backing under this lock.
            None if self.freeing.load(Relaxed) == FREE_DONE => Err(ENOENT),
            None => Err(ENODEV),
        }
    }

    /// [`Self::base`] without its check that the memory is still there, for a buffer the
    /// caller holds (`holds.rs`): no `MEM_FREE` frees it while the hold exists, and an unbind
    /// frees it only after pausing every queue, which a submission under way then finds gone
    /// (`ENODEV`) before a descriptor with this address is written. No lock.
    pub(crate) fn held_base(&self, route: u64) -> u64 {
        if self.routed {
            self.fabric_base | route
        } else {
            self.fabric_base
        }
    }

    /// How the buffer can be mapped into a process while its memory is there: `Some(false)`
    /// for host memory, `Some(true)` for device memory (through BAR4, write-combined), `None`
    /// for imports (the process has its own mapping) and freed buffers.
    pub(crate) fn mappable(&self) -> Option<bool> {
        match &*self.backing.lock() {
            Some(Backing::Host(..)) => Some(false),
            Some(Backing::Device(_, phys)) if *phys != 0 => Some(true),
            _ => None,
        }
    }

    /// The device-fabric (device memory) address of a device buffer whose memory is still there.
    pub(crate) fn device_addr(&self) -> Option<u64> {
        match &*self.backing.lock() {
            Some(Backing::Device(a, _)) => Some(*a),
            _ => None,
        }
    }

    /// Whether this is an imported dma-buf its exporter revoked ([`Self::revoke`]).
    pub(crate) fn is_revoked(&self) -> bool {
        self.revoked.load(Relaxed) != 0
    }

    /// Marks an imported dma-buf revoked by its exporter: no new hold can be taken from now on
    /// ([`Self::claim`] fails with `ENXIO`). Returns whether a hold still exists (then
    /// [`Self::drain_revoked`] must run before the mapping goes).
    pub(crate) fn revoke(&self) -> bool {
        // A fully ordered mark, then a look at the holds: the other half of `claim`'s handshake.
        self.revoked.xchg(1, Full);
        self.is_busy()
    }

    /// Waits until no descriptor or copy can reach the revoked import any more, then unmaps
    /// it. Nothing to do once it was freed (the release unmapped it).
    pub(crate) fn drain_revoked(&self) {
        let drain = match &*self.backing.lock() {
            Some(Backing::DmaBuf(_, d, _)) => d.clone(),
            _ => return,
        };
        drain.drain(self);
        // The reservation lock is taken inside the backing lock (never the other way round).
        if let Some(Backing::DmaBuf(imp, ..)) = &*self.backing.lock() {
            imp.unmap();
        }
    }

    /// Maps page `pgoff` (in units of the file's page offsets) of this host or device buffer
    /// at the faulting address of `vmf`. Returns the `vm_fault_t` of the insertion, or `None`
    /// when the page does not exist: out of range, an import, or freed.
    fn fault(&self, pgoff: u64, vmf: &mut VmFault<'_>) -> Option<u32> {
        let idx = pgoff.checked_sub(self.mmap_offset >> PAGE_SHIFT)?;
        if idx >= self.size >> PAGE_SHIFT {
            return None;
        }
        // CAST: `idx` is below size / PAGE_SIZE.
        let off = (idx as usize).checked_mul(PAGE_SIZE)?;
        // Held across the insertion: `free` takes the backing under this lock, so a page is
        // either mapped before `free` (and then zapped by it) or not at all.
        let backing = self.backing.lock();
        match &*backing {
            Some(Backing::Host(mem, _)) => {
                if off >= mem.size() {
                    return None;
                }
                // SAFETY: `off` lies inside the allocation, which stays alive while `backing`
                // is held.
                Some(unsafe { vmf.insert_page(mem.as_mut_ptr().cast::<u8>().add(off).cast()) })
            }
            Some(Backing::Device(_, phys)) if *phys != 0 => {
                // CAST: `off` is below the buffer's size.
                let pfn = (phys + off as u64) >> PAGE_SHIFT;
                // SAFETY: the page is BAR4 memory of this buffer, which no one else is given
                // while `backing` is held (freeing takes it and zaps the mappings first).
                Some(unsafe { vmf.insert_pfn(pfn) })
            }
            _ => None,
        }
    }

    /// Whether the owning file was released ([`Self::mark_released`]).
    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Relaxed) != 0
    }

    /// Records that the owning file is released (no mapping can exist any more). Taken under
    /// the backing lock, so a concurrent [`Self::free`] either zaps before the file goes away or
    /// sees the mark and does not touch the file.
    pub(crate) fn mark_released(&self) {
        let _backing = self.backing.lock();
        self.released.store(1, Relaxed);
    }

    /// Frees the memory: takes the backing (no page can be mapped after this), removes every
    /// user mapping, then releases the memory and its charge. Returns the device-memory range
    /// to give back, if any. Callers make sure no descriptor references it ([`Self::is_busy`]
    /// or a paused queue).
    pub(crate) fn free(&self) -> Option<u64> {
        let old = {
            let mut backing = self.backing.lock();
            let old = backing.take();
            // Zapped under the backing lock, so that a concurrent `free` (release racing
            // unbind) returns only once the mappings are gone. Once the owning file is released
            // no mapping exists (each one holds the file) and the `struct file` may be gone:
            // nothing to zap then.
            if matches!(old, Some(Backing::Host(..) | Backing::Device(..)))
                && self.released.load(Relaxed) == 0
            {
                // SAFETY: `owner_file` is the open file that created the buffer, not released
                // yet (its release marks the buffer before freeing it, and waits for this lock
                // in its own `free`), so the `struct file` is alive.
                unsafe { self.owner_file.zap(self.mmap_offset, self.size) };
            }
            old
        };
        match old {
            // The memory is released outside the backing lock.
            Some(Backing::Host(mem, charge)) => {
                drop(mem);
                drop(charge);
                None
            }
            Some(Backing::Device(a, _)) => Some(a),
            // Unmapped and unpinned outside the backing lock.
            Some(Backing::Pinned(pages, charge)) => {
                drop(pages);
                drop(charge);
                None
            }
            // Unmapped and detached outside the backing lock (the dma-buf's reservation lock is
            // taken after it, never before).
            Some(Backing::DmaBuf(imp, drain, _)) => {
                drop(imp);
                drop(drain);
                None
            }
            None => None,
        }
    }
}

/// Keeps a buffer marked in use (see [`Buffer::busy`]).
pub(crate) struct BusyGuard(Arc<Buffer>);

impl BusyGuard {
    /// The buffer kept busy.
    pub(crate) fn buffer(&self) -> &Arc<Buffer> {
        &self.0
    }
}

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, Relaxed);
    }
}

/// A reference from a submission (the descriptor pairs of one prepare call) to a buffer its
/// pairs read or write: while it exists the buffer is busy ([`Buffer::is_busy`]). The queue
/// drops it when the engine has consumed the submission (the fence after it retired) or can no
/// longer reach it (queue reset or pause): what the engine really did, not a counter kept
/// beside it. A submission holds each of its buffers once, however many pairs name it.
pub(crate) struct InFlight(Arc<Buffer>);

impl InFlight {
    /// Marks `buf` referenced by one more submission.
    ///
    /// # Errors
    ///
    /// `ENOENT` if a `MEM_FREE` freed the buffer.
    #[cfg(neuron_udma_kunit)]
    pub(crate) fn new(buf: &Arc<Buffer>) -> Result<Self> {
        Self::take(buf.clone())
    }

    /// As [`Self::new`], keeping the caller's reference `buf` (one reference count operation
    /// fewer).
    ///
    /// # Errors
    ///
    /// `ENOENT` if a `MEM_FREE` freed the buffer (`buf` is dropped then).
    pub(crate) fn take(buf: Arc<Buffer>) -> Result<Self> {
        buf.claim(&buf.inflight)?;
        Ok(Self(buf))
    }

    /// The buffer held.
    pub(crate) fn buffer(&self) -> &Arc<Buffer> {
        &self.0
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Relaxed);
    }
}

/// Checks that bytes `[offset, offset + len)` lie inside `size` bytes (a buffer's,
/// [`Buffer::check_range`]; `batch.rs` checks a cached buffer's the same way).
///
/// # Errors
///
/// `ERANGE` if they do not.
#[inline(always)]
pub(crate) fn in_range(size: u64, offset: u64, len: u64) -> Result {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(ERANGE),
    }
}

/// The `vm_private_data` of a buffer mapping: a counted reference to the buffer (the record,
/// not its memory: a freed buffer's mapping faults with `SIGBUS`), as `rust/kfac/mm.h`'s
/// `struct neuron_udma_buffer`.
pub(crate) fn vma_private(buf: &Arc<Buffer>) -> *const Buffer {
    Arc::into_raw(buf.clone())
}

/// Takes one more reference for a copied VMA (`vm_operations_struct::open`).
///
/// # Safety
///
/// `buf` comes from [`vma_private`] and is still referenced by the VMA being copied.
#[no_mangle]
pub(crate) unsafe extern "C" fn neuron_udma_vma_get(buf: *const Buffer) {
    // SAFETY: per the function's contract `buf` is a live counted reference (from `into_raw`);
    // it is borrowed here and stays the old VMA's, and the clone is leaked into the new VMA.
    let old = unsafe { Arc::from_raw(buf) };
    core::mem::forget(old.clone());
    core::mem::forget(old);
}

/// Drops the reference of a closed VMA (`vm_operations_struct::close`).
///
/// # Safety
///
/// `buf` comes from [`vma_private`] or [`neuron_udma_vma_get`] and is not used afterwards.
#[no_mangle]
pub(crate) unsafe extern "C" fn neuron_udma_vma_put(buf: *const Buffer) {
    // SAFETY: per the function's contract, this gives back one reference.
    drop(unsafe { Arc::from_raw(buf) });
}

/// Fault handler of a buffer mapping: maps page `pgoff`, or returns `u32::MAX` for `SIGBUS`.
///
/// # Safety
///
/// `buf` is the VMA's private data (an `Arc<Buffer>` reference) and `vmf` the fault.
#[no_mangle]
pub(crate) unsafe extern "C" fn neuron_udma_vma_fault(
    buf: *const Buffer,
    pgoff: u64,
    vmf: *mut kernel::bindings::vm_fault,
) -> u32 {
    // SAFETY: the VMA holds a reference to the buffer for as long as it exists.
    let buf = unsafe { &*buf };
    // SAFETY: per the function's contract `vmf` is the fault being handled, only used during
    // this call.
    let Some(mut vmf) = (unsafe { VmFault::from_raw(vmf) }) else {
        return u32::MAX;
    };
    buf.fault(pgoff, &mut vmf).unwrap_or(u32::MAX)
}

/// The exporter revoked the imported dma-buf of `buf` (`invalidate_mappings`, under the
/// dma-buf's reservation lock): no new copy may name it. Returns whether a descriptor or copy
/// may still reach it ([`Buffer::revoke`]).
///
/// # Safety
///
/// `buf` is the record connected to the import ([`DmaBufImport::connect`]), alive while the
/// import is.
#[no_mangle]
pub(crate) unsafe extern "C" fn neuron_udma_import_revoke(buf: *const Buffer) -> bool {
    // SAFETY: per the function's contract.
    unsafe { &*buf }.revoke()
}

/// The work item of a revoked import still in use: drains it, then unmaps it
/// ([`Buffer::drain_revoked`]).
///
/// # Safety
///
/// As [`neuron_udma_import_revoke`]; the import's release waits for this call.
#[no_mangle]
pub(crate) unsafe extern "C" fn neuron_udma_import_drain(buf: *const Buffer) {
    // SAFETY: per the function's contract.
    unsafe { &*buf }.drain_revoked();
}
