// SPDX-License-Identifier: GPL-2.0

//! The buffer commands of an open file: `MEM_ALLOC`, `MEM_IMPORT`, `MEM_FREE`,
//! `DMABUF_EXPORT` and `DMABUF_IMPORT`.
//!
//! A new buffer (made, imported, or a dma-buf imported) joins the file only once its handle
//! reached user space, and a dma-buf export's descriptor is installed only then: a call that
//! fails, also in its copy-out, leaves the file as it was.

use super::{
    ioctl::{Arg, Argument},
    reserved_zero, OpenFile,
};
use crate::{buffer::Buffer, channel::Owner, dmabuf, uapi};
use kernel::{
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc,
    },
};

/// Source of buffer handles: unique across files and never reused, so that a stale or foreign
/// handle can never name another buffer.
static NEXT_HANDLE: Atomic<u64> = Atomic::new(1);

/// A new buffer handle ([`NEXT_HANDLE`]).
pub(super) fn next_handle() -> u64 {
    NEXT_HANDLE.fetch_add(1, Relaxed)
}

impl OpenFile {
    /// `MEM_ALLOC` and `MEM_IMPORT`: `make` makes the buffer and fills in the result. The buffer
    /// joins the file's table only once its handle reached user space, so a failing copy-out
    /// frees a buffer nothing can have used (an import's pages are unpinned).
    pub(super) fn new_buffer<T: Argument>(
        &self,
        arg: Arg<T>,
        make: fn(&Self, &mut T) -> Result<Arc<Buffer>>,
    ) -> Result<isize> {
        let mut buf = None;
        let r = arg.run(|a| {
            buf = Some(make(self, a)?);
            Ok(0)
        });
        match buf {
            Some(b) => self.mem_alloc_publish(b, r.is_ok()).and(r),
            None => r,
        }
    }

    /// Allocates the buffer of a `MEM_ALLOC` and fills in its result; the buffer is not in the
    /// file's table yet (see [`Self::mem_alloc_publish`]), so no other call can use it.
    pub(super) fn mem_alloc(&self, a: &mut uapi::neuron_udma_mem_alloc) -> Result<Arc<Buffer>> {
        reserved_zero(&[a.reserved[0], a.reserved[1], u64::from(a.flags)])?;
        let host = match a.type_ {
            uapi::NEURON_UDMA_MEM_HOST => true,
            uapi::NEURON_UDMA_MEM_DEVICE => false,
            _ => return Err(EINVAL),
        };
        let handle = next_handle();
        // Outside the file lock: a device buffer is scrubbed by the engine first.
        let buf = self
            .dev
            .alloc_buffer(host, a.size, handle, self.id, self.file)?;
        a.handle = handle;
        a.mmap_offset = buf.mmap_offset;
        a.size = buf.size;
        Ok(buf)
    }

    /// Pins the memory of a `MEM_IMPORT` and fills in its result; like [`Self::mem_alloc`], the
    /// buffer joins the file only through [`Self::mem_alloc_publish`].
    pub(super) fn mem_import(&self, a: &mut uapi::neuron_udma_mem_import) -> Result<Arc<Buffer>> {
        let write = a.flags & uapi::NEURON_UDMA_IMPORT_WRITE != 0;
        reserved_zero(&[
            a.reserved[0],
            a.reserved[1],
            u64::from(a.flags & !uapi::NEURON_UDMA_IMPORT_WRITE),
        ])?;
        let handle = next_handle();
        let buf = self
            .dev
            .import_buffer(a.addr, a.size, write, handle, self.id, self.file)?;
        a.handle = handle;
        a.segments = u32::try_from(buf.run_count()).unwrap_or(u32::MAX);
        Ok(buf)
    }

    /// Adds a buffer whose `MEM_ALLOC` (or `MEM_IMPORT`) result reached user space to the
    /// device's pool and the file, or frees it if `publish` is false (the copy-out failed: a
    /// failing call changes nothing).
    fn mem_alloc_publish(&self, buf: Arc<Buffer>, publish: bool) -> Result {
        if !publish {
            // Nothing references it: it was never in the pool.
            self.dev.pool.free(&buf);
            return Ok(());
        }
        let mut st = self.st.lock();
        if st.handles.len() >= self.max_buffers as usize {
            drop(st);
            self.dev.pool.free(&buf);
            return Err(EMFILE);
        }
        if let Err(e) = st.handles.push(buf.handle, GFP_KERNEL_ACCOUNT) {
            drop(st);
            self.dev.pool.free(&buf);
            return Err(e.into());
        }
        if let Err(e) = self.dev.pool.insert(&buf) {
            // `insert` gave the memory back.
            st.handles.pop();
            return Err(e);
        }
        Ok(())
    }

    /// `MEM_FREE`: frees buffer `handle` of this file, refused (`EBUSY`) while a submission the
    /// engine has not consumed, or a running `MEMCPY`, holds it.
    pub(super) fn mem_free(&self, f: &uapi::neuron_udma_mem_free) -> Result {
        reserved_zero(&[f.reserved])?;
        // Buffers of an abandoned MEMCPY become free once the engine is done with them.
        self.dev.reap();
        let mut st = self.st.lock();
        let idx = st
            .handles
            .iter()
            .position(|&h| h == f.handle)
            .ok_or(ENOENT)?;
        // Retire what the engine has finished, and have the queues' resident sets let the
        // buffer go unless a submission still uses it; then refuse while a submission that the
        // engine has not consumed, or a running MEMCPY, holds the buffer.
        for &id in st.queues.iter() {
            let chan = self.dev.queue(Owner::File(self.id), id)?;
            chan.retire()?;
            chan.evict(f.handle);
        }
        self.dev.pool.free_handle(self.id, f.handle)?;
        st.handles.remove(idx).map_err(|_| ENOENT)?;
        Ok(())
    }

    /// `DMABUF_EXPORT`: the descriptor is installed only once its number reached user space (an
    /// installed descriptor cannot be taken back).
    pub(super) fn dmabuf_export(&self, arg: Arg<uapi::neuron_udma_dmabuf_export>) -> Result<isize> {
        let mut pending = None;
        let r = arg.run(|e| {
            pending = Some(dmabuf::export_ioctl(&self.dev, self.id, e)?);
            Ok(0)
        });
        if let (Some(p), Ok(_)) = (pending, &r) {
            p.install();
        }
        r
    }

    /// `DMABUF_IMPORT`: the device stays bound until the buffer is in the pool (unbind then
    /// frees it), and no longer: the result is copied out after the section ended, as a fault
    /// there may take as long as the user wants (FUSE, userfaultfd). A handle that cannot be
    /// copied out is taken back.
    pub(super) fn dmabuf_import(&self, arg: Arg<uapi::neuron_udma_dmabuf_import>) -> Result<isize> {
        let mut published = None;
        let r = arg.run(|a| {
            let handle = next_handle();
            let (b, bound) = dmabuf::import_ioctl(&self.dev, self.id, self.file, handle, a)?;
            self.mem_alloc_publish(b, true)?;
            drop(bound);
            published = Some(handle);
            Ok(0)
        });
        if let (Err(_), Some(handle)) = (&r, published) {
            // Nothing of this call used it yet; another thread of the file that guessed
            // the handle and holds it makes this EBUSY: the file keeps the buffer until
            // it is freed or closed.
            let _ = self.mem_free(&uapi::neuron_udma_mem_free {
                handle,
                reserved: 0,
            });
        }
        r
    }
}
