// SPDX-License-Identifier: GPL-2.0

//! DMA buffers handed to user space: host buffers (coherent memory, mmap'able), device
//! buffers (ranges of the device memory, HBM) and imported buffers (the caller's own pages,
//! pinned: `MEM_IMPORT`). User space names them by handle; the driver translates (handle,
//! offset, size) into device-fabric addresses ([`Span`]) after a bounds check.
//!
//! [`BufferPool`] is the device's table of buffers (keyed by handle, each knowing its owner) and
//! its allocators: device-memory ranges, mmap offsets, and the memory that abandoned copies
//! still hold ([`Held`]).

use crate::{
    shim::{self, MappedFile, PinnedPages, UserCharge},
    span::{Segment, Span},
};
use kernel::{
    dma::Coherent,
    new_mutex, new_spinlock,
    page::{PAGE_SHIFT, PAGE_SIZE},
    prelude::*,
    processor::cpu_relax,
    rbtree::{RBTree, RBTreeNode},
    sync::{
        atomic::{Atomic, Full, Relaxed, Release},
        Arc, Mutex, SpinLock,
    },
    xarray::{AllocKind, XArray},
};
use pin_init::pin_init_array_from_fn;

/// Granularity and alignment of every buffer, in bytes.
pub(crate) const BUF_ALIGN: u64 = 4096;
/// Largest host buffer in bytes: coherent memory is physically contiguous, and the page
/// allocator's largest block is 4 MiB (`MAX_PAGE_ORDER` 10 with 4 KiB pages).
pub(crate) const MAX_HOST_BUFFER: u64 = 4 << 20;
/// Bytes of mmap offset space per handle: a host buffer's mmap offset is its handle times
/// this (at least [`MAX_HOST_BUFFER`], so buffers' offset ranges never overlap).
const MMAP_STRIDE_SHIFT: u32 = 22;
const _: () = assert!(1u64 << MMAP_STRIDE_SHIFT >= MAX_HOST_BUFFER);
/// Largest range of one `MEM_IMPORT`, in bytes: bounds the kernel memory of its page and
/// segment tables (about 40 bytes per page: 10 MiB for 1 GiB).
pub(crate) const MAX_IMPORT_SIZE: u64 = 1 << 30;
/// Handles from this one on have no mmap offset that fits in a (signed) file offset.
const HANDLE_LIMIT: u64 = 1 << (63 - MMAP_STRIDE_SHIFT);
/// Device memory kept by the driver at the start of HBM (as the reference keeps 16 MiB per HBM
/// for firmware, hardware.rst §1.3); the driver's own tests use it.
pub(crate) const DRAM_RESERVED: u64 = 16 << 20;

/// Pinned host memory (buffers, queue rings) charged to the locked-memory count of the user
/// who allocated it, limited by `RLIMIT_MEMLOCK` (as io_uring charges pinned pages); given back
/// on drop. The charge belongs to the user, so a process cannot escape the limit by allocating
/// through a shared file and exiting.
pub(crate) struct Charge {
    /// Given back when dropped.
    _user: UserCharge,
}

impl Charge {
    /// Charges `bytes` (rounded up to pages) to the calling user.
    ///
    /// # Errors
    ///
    /// `ENOMEM` if the user's pinned memory would exceed `RLIMIT_MEMLOCK` (callers with
    /// `CAP_IPC_LOCK` are not limited).
    pub(crate) fn new(bytes: u64) -> Result<Self> {
        let pages = usize::try_from(bytes.div_ceil(PAGE_SIZE as u64)).map_err(|_| ENOMEM)?;
        Ok(Self {
            _user: UserCharge::new(pages)?,
        })
    }
}

/// What backs a buffer.
pub(crate) enum Backing {
    /// Coherent host memory, with its charge to the allocating process (`None` for the
    /// driver's own buffers).
    Host(Coherent<[u8]>, Option<Charge>),
    /// Device memory at this device-fabric address.
    Device(u64),
    /// The importing process's pages, pinned and mapped for the device, with their charge.
    Pinned(PinnedPages, Charge),
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
    /// Offset for mmap() of a host buffer (`handle << 22`: unique, never reused); 0 for
    /// device memory.
    pub(crate) mmap_offset: u64,
    /// Id of the owning open file: only it may use the handle.
    pub(crate) owner: u64,
    /// The owning open file, whose mapping holds the buffer's user mappings.
    owner_file: MappedFile,
    /// Synchronous copies (`MEMCPY`) using the buffer right now.
    users: Atomic<u32>,
    /// [`FREE_NONE`], [`FREE_DECIDING`] while a `MEM_FREE` of the buffer decides
    /// ([`Self::take_for_free`]), [`FREE_DONE`] for good once it decided to free it.
    freeing: Atomic<u32>,
    /// Prepared descriptor pairs referencing the buffer that the engine may still process.
    inflight: Atomic<u32>,
    /// Position in the pool's table ([`BufferPool`]).
    table_index: Atomic<usize>,
    /// Non-zero once the owning file is released ([`Self::mark_released`]); a buffer that is
    /// busy then is freed by the pool when its last user is done ([`BufferPool::reap`]).
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
            Backing::Host(..) => handle << MMAP_STRIDE_SHIFT,
            Backing::Device(_) | Backing::Pinned(..) => 0,
        };
        Arc::pin_init(
            try_pin_init!(Self {
                handle,
                size,
                segments,
                writable,
                mmap_offset,
                owner,
                owner_file,
                users: Atomic::new(0),
                freeing: Atomic::new(0),
                inflight: Atomic::new(0),
                table_index: Atomic::new(usize::MAX),
                released: Atomic::new(0),
                backing <- new_mutex!(Some(backing)),
            }),
            GFP_KERNEL,
        )
    }

    /// Marks the buffer in use until the returned guard is dropped.
    ///
    /// # Errors
    ///
    /// `ENOENT` if a `MEM_FREE` freed the buffer ([`Self::take_for_free`]).
    pub(crate) fn busy(self: &Arc<Self>) -> Result<BusyGuard> {
        Self::claim(&self.users, &self.freeing)?;
        Ok(BusyGuard(self.clone()))
    }

    /// Counts one more user in `counter` unless the buffer was freed. With
    /// [`Self::take_for_free`] this is the classic store-then-load handshake: each side makes its
    /// own mark with a fully ordered read-modify-write, then reads the other's, so at least one
    /// of the two sees the other. This lets copies be prepared without a lock shared with
    /// `MEM_FREE`. A claim that sees a `MEM_FREE` deciding ([`FREE_DECIDING`]) waits for the
    /// decision, a few instructions under the pool lock that never sleep: either that
    /// `MEM_FREE` saw this count and gives up (`EBUSY`, the claim succeeds), or it did not and
    /// frees the buffer (the claim is `ENOENT`). A `MEM_FREE` that fails therefore never makes a
    /// valid copy fail.
    fn claim(counter: &Atomic<u32>, freeing: &Atomic<u32>) -> Result {
        counter.fetch_add(1, Full);
        loop {
            match freeing.load(Relaxed) {
                FREE_NONE => return Ok(()),
                FREE_DONE => {
                    counter.fetch_sub(1, Relaxed);
                    return Err(ENOENT);
                }
                _ => cpu_relax(),
            }
        }
    }

    /// Starts a `MEM_FREE`: from now on no new [`BusyGuard`] or [`InFlight`] reference can be
    /// taken; then checks that none exists. On `EBUSY` the mark is taken back and nothing
    /// changed.
    ///
    /// # Errors
    ///
    /// `EBUSY` if the buffer is busy ([`Self::is_busy`]) or another `MEM_FREE` of it is under
    /// way.
    fn take_for_free(&self) -> Result {
        if self
            .freeing
            .cmpxchg(FREE_NONE, FREE_DECIDING, Full)
            .is_err()
        {
            return Err(EBUSY);
        }
        // Nothing between the mark and its outcome may sleep: claims wait for the outcome.
        if self.is_busy() {
            self.freeing.store(FREE_NONE, Release);
            return Err(EBUSY);
        }
        self.freeing.store(FREE_DONE, Release);
        Ok(())
    }

    /// Whether a [`BusyGuard`] or an [`InFlight`] reference exists: a `MEMCPY` runs on the
    /// buffer, or a prepared pair that the engine has not consumed references it.
    pub(crate) fn is_busy(&self) -> bool {
        self.users.load(Relaxed) != 0 || self.inflight.load(Relaxed) != 0
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
        let end = offset.checked_add(len).ok_or(ERANGE)?;
        if end > self.size {
            return Err(ERANGE);
        }
        Ok(())
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
            Some(Backing::Host(c, _)) => Ok(c.dma_address() | route),
            Some(Backing::Device(a)) => Ok(*a),
            Some(Backing::Pinned(..)) => Ok(route),
            // `MEM_FREE` marks the buffer before it takes the backing under this lock.
            None if self.freeing.load(Relaxed) == FREE_DONE => Err(ENOENT),
            None => Err(ENODEV),
        }
    }

    /// Whether this is a host buffer whose memory is still there.
    pub(crate) fn is_host(&self) -> bool {
        matches!(&*self.backing.lock(), Some(Backing::Host(..)))
    }

    /// Maps page `pgoff` (in units of the file's page offsets) of this host buffer at the
    /// faulting address of `vmf`. Returns the `vm_fault_t` of the insertion, or `None` when
    /// the page does not exist: out of range, a device buffer, or freed.
    fn fault(&self, pgoff: u64, vmf: *mut kernel::bindings::vm_fault) -> Option<u32> {
        let idx = pgoff.checked_sub(self.mmap_offset >> PAGE_SHIFT)?;
        if idx >= self.size >> PAGE_SHIFT {
            return None;
        }
        // Held across the insertion: `free` takes the backing under this lock, so a page is
        // either mapped before `free` (and then zapped by it) or not at all.
        let backing = self.backing.lock();
        let Some(Backing::Host(mem, _)) = &*backing else {
            return None;
        };
        // CAST: `idx` is below size / PAGE_SIZE, and `size` fits the allocation.
        let off = (idx as usize).checked_mul(PAGE_SIZE)?;
        if off >= mem.size() {
            return None;
        }
        // SAFETY: `off` lies inside the allocation, which stays alive while `backing` is held;
        // `vmf` is the fault being handled (see `neuron_udma_vma_fault`).
        Some(unsafe { shim::insert_page(vmf, mem.as_mut_ptr().cast::<u8>().add(off).cast()) })
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
            if matches!(old, Some(Backing::Host(..))) && self.released.load(Relaxed) == 0 {
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
            Some(Backing::Device(a)) => Some(a),
            // Unmapped and unpinned outside the backing lock.
            Some(Backing::Pinned(pages, charge)) => {
                drop(pages);
                drop(charge);
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

/// A reference from one prepared descriptor pair to a buffer it reads or writes: while it
/// exists the buffer is busy ([`Buffer::is_busy`]). The queue drops it when the engine has
/// consumed the pair (its fence's marker arrived) or can no longer reach it (queue reset or
/// pause): what the engine really did, not a counter kept beside it.
pub(crate) struct InFlight(Arc<Buffer>);

impl InFlight {
    /// Marks `buf` referenced by one more prepared pair.
    ///
    /// # Errors
    ///
    /// `ENOENT` if a `MEM_FREE` freed the buffer.
    pub(crate) fn new(buf: &Arc<Buffer>) -> Result<Self> {
        Buffer::claim(&buf.inflight, &buf.freeing)?;
        Ok(Self(buf.clone()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Relaxed);
    }
}

/// The `vm_private_data` of a buffer mapping: a counted reference to the buffer (the record,
/// not its memory: a freed buffer's mapping faults with `SIGBUS`).
pub(crate) fn vma_private(buf: &Arc<Buffer>) -> *const c_void {
    Arc::into_raw(buf.clone()).cast()
}

/// Takes one more reference for a copied VMA (`vm_operations_struct::open`).
///
/// # Safety
///
/// `priv_` comes from [`vma_private`] and is still referenced by the VMA being copied.
#[no_mangle]
pub(crate) unsafe extern "C" fn neuron_udma_vma_get(priv_: *const c_void) {
    // SAFETY: per the function's contract, `priv_` is an `Arc<Buffer>` from `into_raw` that is
    // alive; the clone is leaked into the new VMA.
    let buf = unsafe { Arc::<Buffer>::from_raw(priv_.cast()) };
    core::mem::forget(buf.clone());
    core::mem::forget(buf);
}

/// Drops the reference of a closed VMA (`vm_operations_struct::close`).
///
/// # Safety
///
/// `priv_` comes from [`vma_private`] or [`neuron_udma_vma_get`] and is not used afterwards.
#[no_mangle]
pub(crate) unsafe extern "C" fn neuron_udma_vma_put(priv_: *const c_void) {
    // SAFETY: per the function's contract, this gives back one reference.
    drop(unsafe { Arc::<Buffer>::from_raw(priv_.cast()) });
}

/// Fault handler of a buffer mapping: maps page `pgoff`, or returns `u32::MAX` for `SIGBUS`.
///
/// # Safety
///
/// `priv_` is the VMA's private data (an `Arc<Buffer>` reference) and `vmf` the fault.
#[no_mangle]
pub(crate) unsafe extern "C" fn neuron_udma_vma_fault(
    priv_: *const c_void,
    pgoff: u64,
    vmf: *mut kernel::bindings::vm_fault,
) -> u32 {
    // SAFETY: the VMA holds a reference to the buffer for as long as it exists.
    let buf = unsafe { &*priv_.cast::<Buffer>() };
    buf.fault(pgoff, vmf).unwrap_or(u32::MAX)
}

/// A `MEMCPY` or a device-memory scrub that returned (timeout, SIGKILL) while its last
/// submission was still in flight on the driver's shared H2T queue: what it used stays
/// reserved until fence `seq` of that queue is settled ([`BufferPool::reap`]).
pub(crate) struct Held {
    /// Fence of the H2T queue that covers the submission.
    pub(crate) seq: u64,
    /// Open file whose `MEMCPY` it was (0 for a scrub).
    pub(crate) file: u64,
    /// What stays reserved.
    pub(crate) hold: Hold,
}

/// What a [`Held`] keeps from being reused.
pub(crate) enum Hold {
    /// The two buffers of a `MEMCPY` (busy).
    Buffers([BusyGuard; 2]),
    /// A device-memory range whose scrub was interrupted (given back to the allocator then).
    Dram(u64),
}

struct PoolState {
    /// False after [`BufferPool::shutdown`]: nothing is allocated any more.
    alive: bool,
    /// Every buffer in the pool, for the walks of unbind and file release; each knows its
    /// index ([`Buffer::table_index`]), so removal is O(1).
    table: KVVec<Arc<Buffer>>,
    /// Device memory available to user space.
    dram: DramAllocator,
    /// Memory of abandoned copies, until their fences settle.
    held: KVec<Held>,
}

/// Handle indexes of a [`BufferPool`], each for the files whose id has that remainder: files
/// look their buffers up under different locks (one XArray lock for all files made two threads
/// of two files spin on it, Documentation/benchmarks.rst).
const SHARDS: usize = 16;

/// The buffers of one device and their memory: the one place that knows which buffer exists
/// and who owns it (an open file keeps only its id). Lookups by handle are O(1) (an XArray).
#[pin_data]
pub(crate) struct BufferPool {
    /// Handle -> buffer, in [`SHARDS`] indexes by owner.
    #[pin]
    handles: [XArray<Arc<Buffer>>; SHARDS],
    #[pin]
    state: Mutex<PoolState>,
    /// Entries of `PoolState::held` (updated under the lock): lets [`Self::has_held`] answer
    /// without the lock.
    held_count: Atomic<u32>,
    /// Held while a `MEM_FREE` decides ([`Buffer::take_for_free`]): keeps the decider on its
    /// CPU while claims spin for the outcome.
    #[pin]
    deciding: SpinLock<()>,
}

impl BufferPool {
    /// An empty pool over the device memory `dram`.
    pub(crate) fn new(dram: DramAllocator) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            handles <- pin_init_array_from_fn(|_| XArray::new(AllocKind::Alloc)),
            state <- new_mutex!(PoolState {
                alive: true,
                table: KVVec::new(),
                dram,
                held: KVec::new(),
            }),
            held_count: Atomic::new(0),
            deciding <- new_spinlock!(()),
        })
    }

    /// The handle index of the buffers of open file `owner`.
    fn shard(&self, owner: u64) -> &XArray<Arc<Buffer>> {
        // CAST: the remainder is below SHARDS.
        &self.handles[(owner % SHARDS as u64) as usize]
    }

    /// Bytes of device memory available to user buffers.
    pub(crate) fn dram_capacity(&self) -> u64 {
        self.state.lock().dram.capacity()
    }

    /// Allocates `size` bytes of device memory ([`DramAllocator::alloc`]).
    ///
    /// # Errors
    ///
    /// `ENOMEM` if no range is large enough, `ENODEV` after [`Self::shutdown`].
    pub(crate) fn alloc_dram(&self, size: u64) -> Result<u64> {
        let mut st = self.state.lock();
        if !st.alive {
            return Err(ENODEV);
        }
        st.dram.alloc(size)
    }

    /// Gives back the device-memory range at `addr`.
    pub(crate) fn free_dram(&self, addr: u64) {
        self.state.lock().dram.free(addr);
    }

    /// Adds `buf` to the pool (its handle becomes usable); on failure its memory is given back.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, `ENODEV` after [`Self::shutdown`].
    pub(crate) fn insert(&self, buf: &Arc<Buffer>) -> Result {
        let r = {
            let mut st = self.state.lock();
            Self::link(&mut st, self.shard(buf.owner), buf)
        };
        if r.is_err() {
            // Freed outside the pool lock: giving back a host buffer's charge takes the mmap
            // lock.
            if let Some(addr) = buf.free() {
                self.free_dram(addr);
            }
        }
        r
    }

    fn link(st: &mut PoolState, handles: &XArray<Arc<Buffer>>, buf: &Arc<Buffer>) -> Result {
        if !st.alive {
            return Err(ENODEV);
        }
        st.table.reserve(1, GFP_KERNEL)?;
        // CAST: handles are below HANDLE_LIMIT, which fits in `usize` on 64-bit kernels.
        handles
            .lock()
            .store(buf.handle as usize, buf.clone(), GFP_KERNEL)?;
        buf.table_index.store(st.table.len(), Relaxed);
        // Cannot fail: capacity was reserved.
        let _ = st.table.push_within_capacity(buf.clone());
        Ok(())
    }

    /// The buffer `handle` of the open file `owner`.
    ///
    /// # Errors
    ///
    /// `ENOENT` if no such buffer exists or another file owns it.
    pub(crate) fn get(&self, owner: u64, handle: u64) -> Result<Arc<Buffer>> {
        let handle = usize::try_from(handle).map_err(|_| ENOENT)?;
        let xa = self.shard(owner).lock();
        let buf = xa.get(handle).ok_or(ENOENT)?;
        if buf.owner != owner {
            return Err(ENOENT);
        }
        Ok(buf.into())
    }

    /// The host buffer of the open file `owner` whose mmap offset is `offset` (bytes).
    ///
    /// # Errors
    ///
    /// `EINVAL` if there is none (also for an offset inside a buffer rather than at its start).
    pub(crate) fn by_mmap_offset(&self, owner: u64, offset: u64) -> Result<Arc<Buffer>> {
        let buf = self
            .get(owner, offset >> MMAP_STRIDE_SHIFT)
            .map_err(|_| EINVAL)?;
        if offset == 0 || buf.mmap_offset != offset {
            return Err(EINVAL);
        }
        Ok(buf)
    }

    /// Removes buffer `handle` of the open file `owner` from the pool and frees it, unless a
    /// descriptor or a running copy may still reach it. Copies being prepared concurrently
    /// either take their reference first (then this is `EBUSY`) or fail with `ENOENT`
    /// ([`InFlight::new`]).
    ///
    /// # Errors
    ///
    /// `ENOENT` (see [`Self::get`]), `EBUSY` if the buffer is busy ([`Buffer::is_busy`]);
    /// nothing changes then.
    pub(crate) fn free_handle(&self, owner: u64, handle: u64) -> Result {
        let buf = self.get(owner, handle)?;
        {
            // Under the pool lock, like every other busy check (see `release_owner`), and with
            // preemption off (a spinlock) for the few instructions of the decision, which
            // concurrent claims wait for by spinning.
            let _st = self.state.lock();
            let _deciding = self.deciding.lock();
            buf.take_for_free()?;
        }
        self.free(&buf);
        Ok(())
    }

    /// Removes `buf` from the pool and frees it ([`Buffer::free`]), giving device memory back.
    /// The caller made sure no descriptor references it ([`Buffer::is_busy`] is false, or its
    /// queues are paused).
    pub(crate) fn free(&self, buf: &Buffer) {
        let mut st = self.state.lock();
        Self::unlink(&mut st, self.shard(buf.owner), buf);
        drop(st);
        if let Some(addr) = buf.free() {
            self.free_dram(addr);
        }
    }

    /// Removes `buf` from the table and the handle index (if it is there).
    fn unlink(st: &mut PoolState, handles: &XArray<Arc<Buffer>>, buf: &Buffer) {
        let idx = buf.table_index.load(Relaxed);
        if !st.table.get(idx).is_some_and(|b| core::ptr::eq(&**b, buf)) {
            return;
        }
        // CAST: as in `insert`.
        drop(handles.lock().remove(buf.handle as usize));
        // O(1) removal: the last entry takes the freed place.
        if let Some(last) = st.table.pop() {
            if idx < st.table.len() {
                last.table_index.store(idx, Relaxed);
                st.table[idx] = last;
            }
        }
    }

    /// Releases the buffers `handles` of the closed file `owner` (after its queues were
    /// released): a buffer that an abandoned `MEMCPY` of the file still uses stays in the pool,
    /// marked, and is freed by [`Self::reap`] when the engine is done with it; the others are
    /// freed now. Never waits for the engine.
    pub(crate) fn release_owner(&self, owner: u64, handles: &[u64]) {
        for &h in handles {
            let Ok(b) = self.get(owner, h) else {
                continue;
            };
            b.mark_released();
            // Decided under the pool lock, which `reap` holds while it drops the guards and
            // looks at the mark: exactly one of the two frees the buffer.
            let free_now = {
                let _st = self.state.lock();
                !b.is_busy()
            };
            if free_now {
                self.free(&b);
            }
        }
    }

    /// Records `held`, whose submission is still in flight; gives it back when there is no
    /// memory to record it (the caller then waits for the fence itself).
    pub(crate) fn hold(&self, held: Held) -> core::result::Result<(), Held> {
        let mut st = self.state.lock();
        if st.held.reserve(1, GFP_KERNEL).is_err() {
            return Err(held);
        }
        self.held_count.fetch_add(1, Relaxed);
        st.held.push_within_capacity(held).map_err(|e| e.0)
    }

    /// Whether any memory is held by abandoned copies (no lock taken).
    pub(crate) fn has_held(&self) -> bool {
        self.held_count.load(Relaxed) != 0
    }

    /// Whether an abandoned `MEMCPY` of the open file `file` is still held.
    pub(crate) fn held_by(&self, file: u64) -> bool {
        self.state.lock().held.iter().any(|h| h.file == file)
    }

    /// The fences that held memory waits for.
    pub(crate) fn held_fences(&self) -> KVec<u64> {
        let mut seqs = KVec::new();
        for h in self.state.lock().held.iter() {
            if seqs.push(h.seq, GFP_KERNEL).is_err() {
                break;
            }
        }
        seqs
    }

    /// Gives back what the abandoned copies of the settled fences `done` held: device ranges
    /// to the allocator, buffers out of use; a buffer whose file is gone is freed then.
    pub(crate) fn reap(&self, done: &[u64]) {
        let mut to_free: KVec<Arc<Buffer>> = KVec::new();
        {
            let mut st = self.state.lock();
            let mut i = 0;
            while i < st.held.len() {
                if !done.contains(&st.held[i].seq) {
                    i += 1;
                    continue;
                }
                let Ok(h) = st.held.remove(i) else {
                    break;
                };
                self.held_count.fetch_sub(1, Relaxed);
                let bufs = match h.hold {
                    Hold::Buffers(g) => {
                        let bufs = [g[0].buffer().clone(), g[1].buffer().clone()];
                        // Not the last references: the pool's table holds the buffers.
                        drop(g);
                        bufs
                    }
                    Hold::Dram(addr) => {
                        st.dram.free(addr);
                        continue;
                    }
                };
                for b in bufs {
                    if b.released.load(Relaxed) != 0
                        && !b.is_busy()
                        && !to_free.iter().any(|x| Arc::ptr_eq(x, &b))
                    {
                        let _ = to_free.push(b, GFP_KERNEL);
                    }
                }
            }
        }
        for b in to_free.iter() {
            self.free(b);
        }
    }

    /// Called at unbind, after every queue was paused: frees every buffer's memory (the records
    /// stay with open files and mappings) and forgets held memory; nothing is allocated after.
    pub(crate) fn shutdown(&self) {
        let (table, held) = {
            let mut st = self.state.lock();
            st.alive = false;
            self.held_count.store(0, Relaxed);
            (
                core::mem::replace(&mut st.table, KVVec::new()),
                core::mem::take(&mut st.held),
            )
        };
        for b in table.iter() {
            // CAST: as in `insert`.
            drop(self.shard(b.owner).lock().remove(b.handle as usize));
            b.free();
        }
        drop(held);
    }
}

/// First-fit allocator of device-memory ranges: the free ranges (coalesced) and the
/// allocated ones in two red-black trees keyed by start address, so that freeing is
/// O(log n) and allocating walks only the free ranges (few, while allocations are not
/// fragmented): a file with tens of thousands of buffers allocates and closes in linear time.
pub(crate) struct DramAllocator {
    /// Free `start -> len` ranges, never adjacent (coalesced).
    free: RBTree<u64, u64>,
    /// Allocated `start -> len` ranges.
    used: RBTree<u64, u64>,
    start: u64,
    end: u64,
}

impl DramAllocator {
    /// Manages device addresses `start..end` (bytes).
    ///
    /// # Errors
    ///
    /// `ENOMEM` if the first free-range record cannot be allocated.
    pub(crate) fn new(start: u64, end: u64) -> Result<Self> {
        let mut free = RBTree::new();
        if end > start {
            free.try_create_and_insert(start, end - start, GFP_KERNEL)?;
        }
        Ok(Self {
            free,
            used: RBTree::new(),
            start,
            end,
        })
    }

    /// Bytes available to users.
    pub(crate) fn capacity(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// Allocates `len` bytes ([`BUF_ALIGN`]-aligned) at the lowest address where they fit.
    ///
    /// # Errors
    ///
    /// `ENOMEM` if no free range is large enough (or a record cannot be allocated); nothing
    /// changes then.
    pub(crate) fn alloc(&mut self, len: u64) -> Result<u64> {
        let (at, have) = self
            .free
            .iter()
            .find(|(_, &l)| l >= len)
            .map(|(&s, &l)| (s, l))
            .ok_or(ENOMEM)?;
        let used = RBTreeNode::new(at, len, GFP_KERNEL)?;
        let node = self.free.remove_node(&at).ok_or(ENOMEM)?;
        if have > len {
            // The rest of the range stays free (the record is reused).
            self.free
                .insert(node.into_reservation().into_node(at + len, have - len));
        }
        self.used.insert(used);
        Ok(at)
    }

    /// Frees the range starting at `start` (a no-op for an unknown start), merging it with
    /// free neighbours.
    pub(crate) fn free(&mut self, start: u64) {
        let Some(&len) = self.used.get(&start) else {
            return;
        };
        let Some(node) = self.used.remove_node(&start) else {
            return;
        };
        let mut s = start;
        let mut e = s + len;
        // The free neighbour before this range (the last one starting below it) and the one
        // that starts where it ends.
        let prev = match self.free.cursor_lower_bound(&s) {
            Some(c) => c.peek_prev().map(|(&fs, &fl)| (fs, fl)),
            None => self.free.cursor_back().map(|c| {
                let (&fs, &fl) = c.current();
                (fs, fl)
            }),
        };
        if let Some((ps, pl)) = prev {
            if ps + pl == s {
                self.free.remove(&ps);
                s = ps;
            }
        }
        if let Some(nl) = self.free.remove(&e) {
            e += nl;
        }
        // The removed `used` record becomes the free record: nothing to allocate.
        self.free
            .insert(node.into_reservation().into_node(s, e - s));
    }
}

#[cfg(neuron_udma_kunit)]
#[kunit_tests(neuron_udma_mem)]
mod tests {
    use super::*;

    #[test]
    fn dram_first_fit_and_coalescing() -> Result {
        let mut d = DramAllocator::new(0x1000, 0x11000)?;
        assert_eq!(d.capacity(), 0x10000);
        let a = d.alloc(0x4000)?;
        let b = d.alloc(0x4000)?;
        let c = d.alloc(0x4000)?;
        assert_eq!((a, b, c), (0x1000, 0x5000, 0x9000));
        assert_eq!(d.alloc(0x8000), Err(ENOMEM));
        // A hole in the middle is reused first-fit; freeing both neighbours merges everything.
        d.free(b);
        assert_eq!(d.alloc(0x2000)?, 0x5000);
        d.free(0x5000);
        d.free(a);
        d.free(c);
        assert_eq!(d.alloc(0x10000)?, 0x1000);
        assert_eq!(d.alloc(0x1000), Err(ENOMEM));
        d.free(0x1000);
        // Unknown starts are ignored.
        d.free(0x2000);
        // Many small ranges freed in any order come back as one.
        let mut v = KVec::new();
        for _ in 0..16 {
            v.push(d.alloc(0x1000)?, GFP_KERNEL)?;
        }
        for i in Iterator::chain((0..16).step_by(2), (1..16).step_by(2)) {
            d.free(v[i]);
        }
        assert_eq!(d.alloc(0x10000)?, 0x1000);
        Ok(())
    }
}
