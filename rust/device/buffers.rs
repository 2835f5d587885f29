// SPDX-License-Identifier: GPL-2.0

//! The buffers a bound device hands to user space: host memory (coherent, charged to
//! `RLIMIT_MEMLOCK`), device memory (scrubbed by the engine before it is handed out) and
//! imported user memory (pinned and mapped for the device).

use super::UdmaDevice;
use crate::{
    buffer::{Backing, Buffer, BUF_ALIGN, MAX_HOST_BUFFER, MAX_IMPORT_SIZE},
    charge::Charge,
    kfac::mm::{MappedFile, PinnedPages},
};
use kernel::{prelude::*, sync::Arc};

impl UdmaDevice {
    /// Allocates a buffer of `size` bytes (rounded up to 4 KiB) of host (`host == true`) or
    /// device memory for the open file `owner` / `owner_file`, with handle `handle`; it is not
    /// in the pool yet (see [`BufferPool::insert`](crate::pool::BufferPool::insert)). Host memory is charged to the caller's
    /// `RLIMIT_MEMLOCK`; device memory is scrubbed with the engine (zeros copied from host
    /// memory on the H2T queue) before it is handed out, so a new buffer never shows a previous
    /// owner's data.
    ///
    /// # Errors
    ///
    /// `EINVAL` for size 0 or a host buffer above [`MAX_HOST_BUFFER`], `ENOMEM` when no memory
    /// of that kind is left or the locked-memory limit would be exceeded, `EIO`/`ETIMEDOUT`
    /// if the scrub failed, `EINTR` on SIGKILL, `ENODEV` after unbind.
    pub(crate) fn alloc_buffer(
        &self,
        host: bool,
        size: u64,
        handle: u64,
        owner: u64,
        owner_file: MappedFile,
    ) -> Result<Arc<Buffer>> {
        if size == 0 {
            return Err(EINVAL);
        }
        let size = size.checked_next_multiple_of(BUF_ALIGN).ok_or(EINVAL)?;
        // Memory of released files' finished copies comes back first.
        self.reap();
        let backing = if host {
            if size > MAX_HOST_BUFFER {
                return Err(EINVAL);
            }
            // Charged before anything is allocated, for what the allocation really pins:
            // coherent memory comes in power-of-two blocks of pages.
            let charge =
                Charge::new_after_releases(size.checked_next_power_of_two().ok_or(EINVAL)?)?;
            // CAST: at most MAX_HOST_BUFFER.
            Backing::Host(self.alloc_coherent(size as usize)?, Some(charge))
        } else {
            let addr = self.pool.alloc_dram(size)?;
            // On error the scrub gave the range back, or keeps it until the engine is done.
            self.h2t()
                .inspect_err(|_| self.pool.free_dram(addr))?
                .scrub(&self.pool, addr, size)?;
            let phys = if self.bar4_phys == 0 {
                0
            } else {
                self.bar4_phys + addr
            };
            Backing::Device(addr, phys)
        };
        let dram = match backing {
            Backing::Device(a, _) => Some(a),
            _ => None,
        };
        Buffer::new(handle, size, owner, owner_file, backing).inspect_err(|_| {
            if let Some(a) = dram {
                self.pool.free_dram(a);
            }
        })
    }

    /// Imports the calling process's memory `[addr, addr + size)` (bytes, any alignment) as
    /// buffer `handle` of the open file `owner` / `owner_file` (`MEM_IMPORT`): charges its pages
    /// to the caller's `RLIMIT_MEMLOCK`, pins them long-term (writable by the engine if
    /// `write`) and maps them for the device; not in the pool yet (see [`BufferPool::insert`](crate::pool::BufferPool::insert)).
    ///
    /// # Errors
    ///
    /// `EINVAL` for size 0, above [`MAX_IMPORT_SIZE`] or a wrapping range, `ENOMEM` past the
    /// locked-memory limit (checked before anything is pinned) or without memory, `EFAULT` for
    /// unmapped pages (or read-only ones with `write`), `EOPNOTSUPP` for memory that cannot be
    /// pinned long-term or reached without bounce buffers, `EINTR` on SIGKILL, `ENODEV` after
    /// unbind. Nothing stays pinned or charged on error.
    pub(crate) fn import_buffer(
        &self,
        addr: u64,
        size: u64,
        write: bool,
        handle: u64,
        owner: u64,
        owner_file: MappedFile,
    ) -> Result<Arc<Buffer>> {
        if size == 0 || size > MAX_IMPORT_SIZE {
            return Err(EINVAL);
        }
        let end = addr.checked_add(size).ok_or(EINVAL)?;
        let page = kernel::page::PAGE_SIZE as u64;
        // What pinning really holds: every page the range touches.
        let pinned = end.div_ceil(page) - addr / page;
        let charge = Charge::new_after_releases(pinned * page)?;
        // Pinned outside the state lock (it may fault pages in); mapped while certainly bound.
        let mut pages = PinnedPages::new(addr, size, write)?;
        self.with_bound(|dev| pages.map(dev))?;
        Buffer::imported(handle, size, owner, owner_file, pages, charge, write)
    }
}
