// SPDX-License-Identifier: GPL-2.0

//! DMA buffers handed to user space: host buffers (coherent memory, mmap'able) and device
//! buffers (ranges of the device memory, HBM). User space names them by handle; the driver
//! translates (handle, offset, size) into device-fabric addresses after a bounds check.

use crate::device::UdmaDevice;
use kernel::{
    bindings,
    dma::Coherent,
    new_mutex,
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, Mutex,
    },
};

/// Granularity and alignment of every buffer, in bytes.
pub(crate) const BUF_ALIGN: u64 = 4096;
/// Largest host buffer in bytes: coherent memory is physically contiguous, and the page
/// allocator's largest block is 4 MiB (`MAX_PAGE_ORDER` 10 with 4 KiB pages).
pub(crate) const MAX_HOST_BUFFER: u64 = 4 << 20;
/// Device memory kept by the driver at the start of HBM (as the reference keeps 16 MiB per HBM
/// for firmware, spec 1.3); the driver's own tests use it.
pub(crate) const DRAM_RESERVED: u64 = 16 << 20;

extern "C" {
    fn neuron_udma_zap(file: *mut c_void, offset: u64, len: u64);
}

/// What backs a buffer.
pub(crate) enum Backing {
    /// Coherent host memory.
    Host(Coherent<[u8]>),
    /// Device memory at this device-fabric address.
    Device(u64),
}

/// One buffer. The backing is `None` once freed (also by unbind).
#[pin_data]
pub(crate) struct Buffer {
    /// Handle, unique within the owning file, never 0.
    pub(crate) handle: u64,
    /// Size in bytes (a multiple of [`BUF_ALIGN`]).
    pub(crate) size: u64,
    /// Offset for mmap() of a host buffer (unique per device, never reused); 0 for device.
    pub(crate) mmap_offset: u64,
    /// The owning open file (`struct file`), whose mapping holds the buffer's user mappings.
    owner_file: usize,
    /// Synchronous copies (`MEMCPY`) using the buffer right now.
    users: Atomic<u32>,
    #[pin]
    backing: Mutex<Option<Backing>>,
}

// SAFETY: `owner_file` is only an address passed to `neuron_udma_zap` while the file is open
// (a buffer is freed at the latest when its file is released); everything else is `Send`.
unsafe impl Send for Buffer {}
// SAFETY: As above; shared access goes through the mutex.
unsafe impl Sync for Buffer {}

impl Buffer {
    /// Creates a buffer record.
    pub(crate) fn new(
        handle: u64,
        size: u64,
        mmap_offset: u64,
        owner_file: *mut bindings::file,
        backing: Backing,
    ) -> Result<Arc<Self>> {
        Arc::pin_init(
            try_pin_init!(Self {
                handle,
                size,
                mmap_offset,
                owner_file: owner_file as usize,
                users: Atomic::new(0),
                backing <- new_mutex!(Some(backing)),
            }),
            GFP_KERNEL,
        )
    }

    /// Marks the buffer in use until the returned guard is dropped.
    pub(crate) fn busy(self: &Arc<Self>) -> BusyGuard {
        self.users.fetch_add(1, Relaxed);
        BusyGuard(self.clone())
    }

    /// Whether a [`BusyGuard`] exists.
    pub(crate) fn is_busy(&self) -> bool {
        self.users.load(Relaxed) != 0
    }

    /// Device-fabric address of bytes `[offset, offset + len)`.
    ///
    /// # Errors
    ///
    /// `ERANGE` if the range does not lie inside the buffer, `ENODEV` if it was freed.
    pub(crate) fn addr(&self, dev: &UdmaDevice, offset: u64, len: u64) -> Result<u64> {
        let end = offset.checked_add(len).ok_or(ERANGE)?;
        if end > self.size {
            return Err(ERANGE);
        }
        match &*self.backing.lock() {
            Some(Backing::Host(c)) => Ok(dev.host_addr(c.dma_address()) + offset),
            Some(Backing::Device(a)) => Ok(a + offset),
            None => Err(ENODEV),
        }
    }

    /// Runs `f` on the coherent memory of a host buffer.
    ///
    /// # Errors
    ///
    /// `EINVAL` for a device buffer, `ENODEV` if freed.
    pub(crate) fn with_host<R>(&self, f: impl FnOnce(&Coherent<[u8]>) -> Result<R>) -> Result<R> {
        match &*self.backing.lock() {
            Some(Backing::Host(c)) => f(c),
            Some(Backing::Device(_)) => Err(EINVAL),
            None => Err(ENODEV),
        }
    }

    /// Frees the memory: removes every user mapping first, then drops the backing. Returns the
    /// device-memory range to give back, if any.
    pub(crate) fn free(&self) -> Option<u64> {
        let mut b = self.backing.lock();
        let old = b.take();
        if let Some(Backing::Host(_)) = &old {
            // SAFETY: `owner_file` is the open file that created the buffer: buffers are freed
            // at the latest in that file's release, so the file is still alive here.
            unsafe { neuron_udma_zap(self.owner_file as *mut c_void, self.mmap_offset, self.size) };
        }
        match old {
            Some(Backing::Device(a)) => Some(a),
            _ => None,
        }
    }
}

/// Keeps a buffer marked in use (see [`Buffer::busy`]).
pub(crate) struct BusyGuard(Arc<Buffer>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, Relaxed);
    }
}

/// First-fit allocator of device-memory ranges.
pub(crate) struct DramAllocator {
    /// Allocated `(start, len)` ranges, sorted by start.
    used: KVec<(u64, u64)>,
    start: u64,
    end: u64,
}

impl DramAllocator {
    /// Manages device addresses `start..end`.
    pub(crate) fn new(start: u64, end: u64) -> Self {
        Self {
            used: KVec::new(),
            start,
            end,
        }
    }

    /// Bytes available to users.
    pub(crate) fn capacity(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    /// Allocates `len` bytes ([`BUF_ALIGN`]-aligned).
    ///
    /// # Errors
    ///
    /// `ENOMEM` if no free range is large enough.
    pub(crate) fn alloc(&mut self, len: u64) -> Result<u64> {
        let mut at = self.start;
        let mut idx = self.used.len();
        for (i, &(s, l)) in self.used.iter().enumerate() {
            if s - at >= len {
                idx = i;
                break;
            }
            at = s + l;
        }
        if idx == self.used.len() && self.end.saturating_sub(at) < len {
            return Err(ENOMEM);
        }
        self.used
            .insert_within_capacity(idx, (at, len))
            .or_else(|_| {
                self.used.reserve(1, GFP_KERNEL)?;
                self.used
                    .insert_within_capacity(idx, (at, len))
                    .map_err(|_| ENOMEM)
            })?;
        Ok(at)
    }

    /// Frees the range starting at `start`.
    pub(crate) fn free(&mut self, start: u64) {
        self.used.retain(|&mut (s, _)| s != start);
    }
}
