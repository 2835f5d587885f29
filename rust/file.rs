// SPDX-License-Identifier: GPL-2.0

//! The character device `/dev/neuron_udmaN` and its ioctl ABI (`include/uapi/linux/neuron_udma.h`).
//!
//! Every open file owns the buffers and queues it creates; nothing of another file is reachable
//! through it (unknown handles and other files' queues are `ENOENT`). Each ioctl validates all
//! of its input before it changes anything, so a bad argument leaves every ring, buffer and
//! queue as it was. Closing the file (also by a killed process) releases everything it owns.

use crate::{
    batch::Batch,
    buffer::{self, Buffer},
    channel::{Channel, Job, Owner, QueueId, DEFAULT_TIMEOUT, MIN_TIMEOUT_MS},
    device::UdmaDevice,
    shim::{self, MappedFile},
    uapi, Registry,
};
use kernel::{
    fs::{file::flags, File},
    miscdevice::{MiscDevice, MiscDeviceRegistration},
    mm::virt::VmaNew,
    new_mutex,
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, Mutex,
    },
    time::Delta,
    transmute::AsBytes,
    uaccess::{UserPtr, UserSlice, UserSliceReader},
};

/// Most entries of one `COPY_PREPARE` (twice the reference's 2032-pair submission).
pub(crate) const MAX_BATCH: u32 = 4096;
/// `COPY_PREPARE` batches up to this many entries are read without a heap allocation.
const INLINE_BATCH: usize = 16;

/// Source of unique open-file ids (queue ownership).
static NEXT_FILE_ID: Atomic<u64> = Atomic::new(1);
/// Source of buffer handles: unique across files and never reused, so that a stale or foreign
/// handle can never name another buffer.
static NEXT_HANDLE: Atomic<u64> = Atomic::new(1);

/// What the file owns, by id: the device's queue table and buffer pool hold the objects
/// (and know their owner).
struct FileState {
    /// Handles of the file's buffers (a vmalloc-backed array: no limit from the slab's largest
    /// block).
    handles: KVVec<u64>,
    /// The file's queues.
    queues: KVec<QueueId>,
}

/// Per-open-file state.
#[pin_data(PinnedDrop)]
pub(crate) struct OpenFile {
    dev: Arc<UdmaDevice>,
    id: u64,
    /// The `struct file`, for the buffers' user mappings (open while this value lives).
    file: MappedFile,
    /// The ids of what the file owns; held while they change. Copies are prepared without it:
    /// a buffer is kept from being freed between its lookup and its use by the handshake of
    /// `buffer::InFlight::new` and `MEM_FREE` (so threads on different queues do not serialise).
    #[pin]
    st: Mutex<FileState>,
    /// Held by the file's running `MEMCPY`: one at a time per file, so that threads cannot
    /// get around the one-unfinished-copy-per-file rule of the shared queue.
    #[pin]
    memcpy_slot: Mutex<()>,
}

#[pinned_drop]
impl PinnedDrop for OpenFile {
    fn drop(self: Pin<&mut Self>) {
        // Queues first: once paused, no engine touches the buffers. A buffer that a MEMCPY of
        // this file that returned early (SIGKILL, timeout) still uses is freed by the device
        // when the engine is done with it. No mapping of the buffers
        // exists any more: each one holds a reference to this file. The lists are taken out of
        // the file lock first: freeing a host buffer gives back its memory charge, which takes
        // the mmap lock, and mmap() takes the file lock under it.
        let (queues, handles) = {
            let mut st = self.st.lock();
            (
                core::mem::take(&mut st.queues),
                core::mem::replace(&mut st.handles, KVVec::new()),
            )
        };
        self.dev.release_file(self.id, &queues, &handles);
        // What an abandoned MEMCPY of this file still holds comes back when the engine is done.
        UdmaDevice::reap_later(&self.dev);
    }
}

fn reserved_zero(fields: &[u64]) -> Result {
    if fields.iter().any(|&f| f != 0) {
        return Err(EINVAL);
    }
    Ok(())
}

/// The wait bound of a `timeout_ms` field: 0 for the default, otherwise at least
/// [`MIN_TIMEOUT_MS`].
fn timeout(ms: u32) -> Delta {
    if ms == 0 {
        DEFAULT_TIMEOUT
    } else {
        Delta::from_millis(i64::from(ms.max(MIN_TIMEOUT_MS)))
    }
}

impl OpenFile {
    /// Buffer `handle` of this file.
    fn buffer(&self, handle: u64) -> Result<Arc<Buffer>> {
        self.dev.pool.get(self.id, handle)
    }

    /// Queue `qid` of engine `eng` of this file.
    ///
    /// # Errors
    ///
    /// `ENOENT` for an engine or queue that does not exist or is not this file's, `ENODEV` after
    /// unbind.
    fn queue(&self, eng: u32, qid: u32) -> Result<Arc<Channel>> {
        let id = QueueId::new(self.dev.arch, eng, qid).ok_or(ENOENT)?;
        self.dev.queue(Owner::File(self.id), id)
    }

    fn info(&self) -> Result<uapi::neuron_udma_info> {
        if !self.dev.is_alive() {
            return Err(ENODEV);
        }
        let mut info = self.dev.info();
        info.max_batch = MAX_BATCH;
        Ok(info)
    }

    /// Allocates the buffer of a `MEM_ALLOC` and fills in its result; the buffer is not in the
    /// file's table yet (see [`Self::mem_alloc_publish`]), so no other call can use it.
    fn mem_alloc(&self, a: &mut uapi::neuron_udma_mem_alloc) -> Result<Arc<Buffer>> {
        reserved_zero(&[a.reserved[0], a.reserved[1], u64::from(a.flags)])?;
        let host = match a.type_ {
            uapi::NEURON_UDMA_MEM_HOST => true,
            uapi::NEURON_UDMA_MEM_DEVICE => false,
            _ => return Err(EINVAL),
        };
        let handle = NEXT_HANDLE.fetch_add(1, Relaxed);
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
    fn mem_import(&self, a: &mut uapi::neuron_udma_mem_import) -> Result<Arc<Buffer>> {
        let write = a.flags & uapi::NEURON_UDMA_IMPORT_WRITE != 0;
        reserved_zero(&[
            a.reserved[0],
            a.reserved[1],
            u64::from(a.flags & !uapi::NEURON_UDMA_IMPORT_WRITE),
        ])?;
        let handle = NEXT_HANDLE.fetch_add(1, Relaxed);
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

    fn mem_free(&self, f: &uapi::neuron_udma_mem_free) -> Result {
        reserved_zero(&[f.reserved])?;
        // Buffers of an abandoned MEMCPY become free once the engine is done with them.
        self.dev.reap();
        let mut st = self.st.lock();
        let idx = st
            .handles
            .iter()
            .position(|&h| h == f.handle)
            .ok_or(ENOENT)?;
        // Retire what the engine has finished, then refuse while a submission that the
        // engine has not consumed, or a running MEMCPY, holds the buffer.
        for &id in st.queues.iter() {
            self.dev.queue(Owner::File(self.id), id)?.retire()?;
        }
        self.dev.pool.free_handle(self.id, f.handle)?;
        st.handles.remove(idx).map_err(|_| ENOENT)?;
        Ok(())
    }

    fn queue_init(&self, q: &uapi::neuron_udma_queue_init) -> Result {
        reserved_zero(&[
            u64::from(q.flags),
            u64::from(q.reserved0),
            q.reserved[0],
            q.reserved[1],
        ])?;
        let id = QueueId::new(self.dev.arch, q.engine, q.queue).ok_or(EINVAL)?;
        // The rings live in host memory, and so do host buffers: only an engine with host
        // connectivity can fetch or copy them (hardware.rst §2.5). EOPNOTSUPP, not EINVAL: the
        // engine exists, it just cannot serve a user queue.
        if self.dev.is_alive() && !self.dev.arch.has_host_connectivity(q.engine) {
            pr_debug!(
                "queue {}/{}: engine {} cannot reach host memory\n",
                q.engine,
                q.queue,
                q.engine
            );
            return Err(EOPNOTSUPP);
        }
        let mut st = self.st.lock();
        st.queues.reserve(1, GFP_KERNEL_ACCOUNT)?;
        self.dev
            .queue_init(id, q.tx_descs, q.rx_descs, Owner::File(self.id))?;
        // Cannot fail: capacity was reserved.
        let _ = st.queues.push_within_capacity(id);
        Ok(())
    }

    fn queue_release(&self, q: &uapi::neuron_udma_queue_id) -> Result {
        reserved_zero(&[q.reserved])?;
        let id = QueueId::new(self.dev.arch, q.engine, q.queue).ok_or(ENOENT)?;
        let mut st = self.st.lock();
        let idx = st.queues.iter().position(|&x| x == id).ok_or(ENOENT)?;
        self.dev.queue_release(Owner::File(self.id), id)?;
        st.queues.remove(idx).map_err(|_| ENOENT)?;
        Ok(())
    }

    /// Validates and translates `copies` into one submission and writes it to queue
    /// `eng`/`qid`, all or nothing. Returns the pairs written when a copy has
    /// `NEURON_UDMA_COPY_SPLIT`, else 0 (ABI 1).
    fn prepare(&self, eng: u32, qid: u32, copies: &[uapi::neuron_udma_copy]) -> Result<isize> {
        let chan = self.queue(eng, qid)?;
        let mut batch = Batch::new(copies.len())?;
        let route = self.dev.arch.host_route;
        for c in copies {
            batch.add(&self.dev.pool, self.id, route, c)?;
        }
        let holds = batch.take_holds();
        chan.prepare(batch.copies(), batch.largest, holds)?;
        let (flags, pairs) = (batch.flags, batch.pairs());
        Ok(split_result(flags, pairs))
    }

    fn copy_prepare(&self, p: &uapi::neuron_udma_copy_prepare) -> Result<isize> {
        reserved_zero(&[u64::from(p.reserved)])?;
        if p.count == 0 || p.count > MAX_BATCH {
            return Err(EINVAL);
        }
        let entry = core::mem::size_of::<uapi::neuron_udma_copy>();
        // CAST: `copies` is a user address, `count` at most MAX_BATCH.
        let count = p.count as usize;
        let mut reader =
            UserSlice::new(UserPtr::from_addr(p.copies as usize), entry * count).reader();
        // Small batches are read onto the stack: a heap array per call costs more than the
        // descriptors themselves (Documentation/benchmarks.rst).
        let unused = uapi::neuron_udma_copy::default();
        let mut inline = [unused; INLINE_BATCH];
        let mut heap = KVVec::new();
        let staged = if count <= INLINE_BATCH {
            &mut inline[..count]
        } else {
            heap.reserve(count, GFP_KERNEL_ACCOUNT)?;
            for _ in 0..count {
                heap.push(unused, GFP_KERNEL_ACCOUNT)?;
            }
            &mut heap[..]
        };
        // The whole array in one user copy, before any lock: a page fault takes the mmap lock,
        // which a fault on a buffer mapping holds while it takes a buffer's lock.
        reader.read_slice(staged.as_bytes_mut())?;
        self.prepare(p.engine, p.queue, staged)
    }

    fn memcpy(&self, m: &uapi::neuron_udma_memcpy) -> Result {
        reserved_zero(&[u64::from(m.reserved)])?;
        if m.size == 0 {
            return Err(EINVAL);
        }
        let limit = timeout(m.timeout_ms);
        // One MEMCPY of this file at a time (the wait for the slot counts against the timeout
        // and ends on SIGKILL).
        let start = kernel::time::Instant::<kernel::time::Monotonic>::now();
        let _slot = loop {
            if let Some(g) = self.memcpy_slot.try_lock() {
                break g;
            }
            if start.elapsed() >= limit {
                return Err(ETIMEDOUT);
            }
            if shim::fatal_signal_pending() {
                return Err(EINTR);
            }
            kernel::time::delay::fsleep(Delta::from_micros(200));
        };
        let (s, d) = (self.buffer(m.src_handle)?, self.buffer(m.dst_handle)?);
        let route = self.dev.arch.host_route;
        let job = Job {
            src: s.span(route, m.src_offset, m.size)?,
            dst: d.span(route, m.dst_offset, m.size)?,
            size: m.size,
        };
        d.check_writable()?;
        // `MEM_FREE` refuses buffers in use until the engine is done with them.
        let guards = [s.busy()?, d.busy()?];
        let left = limit - start.elapsed();
        self.dev
            .h2t()?
            .memcpy_for_file(&self.dev.pool, self.id, job, left, guards)
    }
}

/// The result of a prepare ioctl whose copies had `flags` (OR-ed) and took `pairs` descriptor
/// pairs: the count with `NEURON_UDMA_COPY_SPLIT`, else 0 as in ABI 1.
fn split_result(flags: u32, pairs: u32) -> isize {
    if flags & uapi::NEURON_UDMA_COPY_SPLIT != 0 {
        // CAST: at most MAX_BATCH * 33.
        pairs as isize
    } else {
        0
    }
}

/// The `QUEUE_STATE` result of `chan`: its registers, software ring state and engine state.
fn queue_state(chan: &Channel) -> Result<uapi::neuron_udma_queue_state> {
    let snap = chan.snapshot()?;
    let ring = |i: usize, pending: u32| {
        let (regs, sw) = (&snap.regs[i], &snap.sw[i]);
        uapi::neuron_udma_ring_state {
            hw_cfg: regs.cfg,
            hw_status: regs.status,
            hw_len: regs.len,
            hw_head: regs.head,
            hw_tail: regs.tail,
            hw_comp_head: regs.comp_head,
            sw_next: sw.next_index(),
            sw_ack: sw.ack_index(),
            sw_ring_id: sw.ring_id().bits().get(),
            sw_available: sw.available(),
            sw_pending: pending,
            size: sw.size().descs(),
        }
    };
    let e = &snap.errors;
    Ok(uapi::neuron_udma_queue_state {
        engine: chan.id.eng.get(),
        queue: chan.id.q.number(),
        m2s_engine_state: e.m2s_state,
        s2m_engine_state: e.s2m_state,
        m2s_error_cause: e.m2s_cause,
        s2m_error_cause: e.s2m_cause,
        resets: snap.resets,
        reserved: 0,
        tx: ring(0, snap.pending.0),
        rx: ring(1, snap.pending.1),
    })
}

/// Reads `T` from user space, runs `f` on it, and writes it back when `write_back` (checking
/// first that the argument is writable, so that `EFAULT` comes before any change).
fn in_out<T: kernel::transmute::FromBytes + kernel::transmute::AsBytes>(
    arg: usize,
    write_back: bool,
    f: impl FnOnce(&mut T) -> Result<isize>,
) -> Result<isize> {
    let slice = || UserSlice::new(UserPtr::from_addr(arg), core::mem::size_of::<T>());
    let mut v: T = read(&mut slice().reader())?;
    if write_back {
        // The output must be writable before anything changes (EFAULT then changes nothing).
        slice().writer().write(&v)?;
    }
    let r = f(&mut v)?;
    if write_back {
        slice().writer().write(&v)?;
    }
    Ok(r)
}

fn read<T: kernel::transmute::FromBytes>(r: &mut UserSliceReader) -> Result<T> {
    r.read()
}

#[vtable]
impl MiscDevice for OpenFile {
    type Ptr = Pin<KBox<Self>>;

    fn open(file: &File, misc: &MiscDeviceRegistration<Self>) -> Result<Pin<KBox<Self>>> {
        let dev = Registry::by_name(misc.device().name()).ok_or(ENODEV)?;
        KBox::pin_init(
            try_pin_init!(OpenFile {
                dev,
                id: NEXT_FILE_ID.fetch_add(1, Relaxed),
                file: MappedFile::new(file),
                st <- new_mutex!(FileState {
                    handles: KVVec::new(),
                    queues: KVec::new(),
                }),
                memcpy_slot <- new_mutex!(()),
            }),
            GFP_KERNEL,
        )
    }

    fn mmap(me: Pin<&OpenFile>, _file: &File, vma: &VmaNew) -> Result {
        if !me.dev.is_alive() {
            return Err(ENODEV);
        }
        // SAFETY: `vma` is a valid VMA being set up by this mmap call.
        let pgoff = unsafe { (*vma.as_ptr()).vm_pgoff };
        let offset = u64::try_from(pgoff).map_err(|_| EINVAL)? << kernel::page::PAGE_SHIFT;
        let buf = me.dev.pool.by_mmap_offset(me.id, offset)?;
        // The device and the process must see the same memory: no private (copy-on-write)
        // mappings, no execution.
        if vma.flags() & kernel::mm::virt::flags::SHARED == 0 {
            return Err(EINVAL);
        }
        vma.try_clear_mayexec()?;
        vma.set_dontcopy();
        vma.set_dontexpand();
        if !buf.is_host() {
            return Err(EINVAL);
        }
        // The VMA holds a reference to the buffer record (given back by its close); pages are
        // mapped on fault, under the buffer's lock (`buffer::Buffer`), so a mapping never reaches
        // memory that was freed, whenever it was made.
        let priv_ = buffer::vma_private(&buf);
        // SAFETY: `vma` is being set up by this call; `priv_` is a counted `Arc<Buffer>`
        // reference from `vma_private`, which the VMA's close gives back.
        let r = unsafe { shim::mmap_buffer(vma, priv_, buf.size) };
        if r.is_err() {
            // SAFETY: the VMA did not take the reference: give it back here.
            unsafe { buffer::neuron_udma_vma_put(priv_) };
        }
        r
    }

    fn ioctl(me: Pin<&OpenFile>, file: &File, cmd: u32, arg: usize) -> Result<isize> {
        use uapi::*;
        // After unbind nothing is left to operate on (the file's resources were freed with it).
        if !me.dev.is_alive() {
            return Err(ENODEV);
        }
        // Commands that allocate, start DMA or change a queue need a file opened for writing:
        // a read-only descriptor may only look (INFO, QUEUE_STATE).
        if !matches!(cmd, IOC_INFO | IOC_QUEUE_STATE)
            && file.flags() & flags::O_ACCMODE == flags::O_RDONLY
        {
            return Err(EBADF);
        }
        if matches!(cmd, IOC_MEM_ALLOC | IOC_MEM_IMPORT | IOC_MEMCPY) {
            // What abandoned copies held comes back as soon as the engine is done with it
            // (checked at every call that needs memory or the shared queue; MEM_FREE reaps
            // itself).
            me.dev.reap();
        }
        match cmd {
            IOC_INFO => {
                let info = me.info()?;
                UserSlice::new(
                    UserPtr::from_addr(arg),
                    core::mem::size_of::<neuron_udma_info>(),
                )
                .writer()
                .write(&info)?;
                Ok(0)
            }
            IOC_MEM_ALLOC => {
                // The buffer joins the file's table only once its handle reached user space,
                // so a failing copy-out frees a buffer nothing can have used.
                let mut buf = None;
                let r = in_out(arg, true, |a: &mut neuron_udma_mem_alloc| {
                    buf = Some(me.mem_alloc(a)?);
                    Ok(0)
                });
                match buf {
                    Some(b) => me.mem_alloc_publish(b, r.is_ok()).and(r),
                    None => r,
                }
            }
            IOC_MEM_IMPORT => {
                // As MEM_ALLOC: the pages are unpinned if the handle cannot be returned.
                let mut buf = None;
                let r = in_out(arg, true, |a: &mut neuron_udma_mem_import| {
                    buf = Some(me.mem_import(a)?);
                    Ok(0)
                });
                match buf {
                    Some(b) => me.mem_alloc_publish(b, r.is_ok()).and(r),
                    None => r,
                }
            }
            IOC_MEM_FREE => in_out(arg, false, |f: &mut neuron_udma_mem_free| {
                me.mem_free(f).map(|()| 0)
            }),
            IOC_QUEUE_INIT => in_out(arg, false, |q: &mut neuron_udma_queue_init| {
                me.queue_init(q).map(|()| 0)
            }),
            IOC_QUEUE_RELEASE => in_out(arg, false, |q: &mut neuron_udma_queue_id| {
                me.queue_release(q).map(|()| 0)
            }),
            IOC_COPY_PREPARE_ONE => in_out(arg, false, |p: &mut neuron_udma_copy_prepare_one| {
                me.prepare(p.engine, p.queue, core::slice::from_ref(&p.copy))
            }),
            IOC_COPY_PREPARE => in_out(arg, false, |p: &mut neuron_udma_copy_prepare| {
                me.copy_prepare(p)
            }),
            IOC_COPY_START => in_out(arg, false, |s: &mut neuron_udma_copy_start| {
                reserved_zero(&[s.reserved])?;
                me.queue(s.engine, s.queue)?
                    .start(s.m2s_count, s.s2m_count)
                    .map(|()| 0)
            }),
            IOC_COPY_WAIT => in_out(arg, true, |w: &mut neuron_udma_copy_wait| {
                reserved_zero(&[u64::from(w.reserved)])?;
                w.completed = me
                    .queue(w.engine, w.queue)?
                    .wait_all(timeout(w.timeout_ms))?;
                Ok(0)
            }),
            IOC_QUEUE_STATE => in_out(arg, true, |s: &mut neuron_udma_queue_state| {
                reserved_zero(&[u64::from(s.reserved)])?;
                *s = queue_state(&*me.queue(s.engine, s.queue)?)?;
                Ok(0)
            }),
            IOC_MEMCPY => in_out(arg, false, |m: &mut neuron_udma_memcpy| {
                me.memcpy(m).map(|()| 0)
            }),
            _ => Err(ENOTTY),
        }
    }
}
