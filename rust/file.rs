// SPDX-License-Identifier: GPL-2.0

//! The character device `/dev/neuron_udmaN` and its ioctl ABI (`include/uapi/linux/neuron_udma.h`).
//!
//! Every open file owns the buffers and queues it creates; nothing of another file is reachable
//! through it (unknown handles and other files' queues are `ENOENT`). Each ioctl validates all
//! of its input before it changes anything, so a bad argument leaves every ring, buffer and
//! queue as it was. Closing the file (also by a killed process) releases everything it owns.

use crate::{
    batch::Batch,
    buffer::{self, Buffer, MemKind},
    channel::{
        Channel, FenceState, Job, Owner, QueueEvents, QueueId, DEFAULT_TIMEOUT, MIN_TIMEOUT_MS,
    },
    device::UdmaDevice,
    events::{EventFd, FileEvents, UringCmd},
    kfac::{
        mm::{self, MappedFile},
        sched, sysfs,
        uring::{self, RawUringCmd},
    },
    orphan::Hold,
    span::Span,
    uapi, Registry,
};
use kernel::{
    fs::{file::flags, File},
    miscdevice::{MiscDevice, MiscDeviceRegistration},
    mm::virt::VmaNew,
    new_mutex,
    prelude::*,
    seq_file::{seq_print, SeqFile},
    sync::poll::PollTable,
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
/// Most queue event records one `QUEUE_EVENTS` returns (a file holds at most this many
/// queues of one device: 132 engines x 16 queues).
const MAX_EVENTS: u32 = 2112;
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
    /// For each queue id the file initialised, the fence number its next instance starts from
    /// (fence numbers are never reused on a queue id of a file: a fence of a released instance
    /// is `ECANCELED`, never a fence of the new one). An entry is made at the id's first
    /// `QUEUE_INIT` (so `QUEUE_RELEASE` allocates nothing); at most one per queue id of the
    /// device (2112), in a vmalloc-backed array.
    next_fence: KVVec<(QueueId, u64)>,
}

impl FileState {
    /// The first fence number of a new instance of queue `id` (1 if the file never released
    /// one).
    fn first_fence(&self, id: QueueId) -> u64 {
        self.next_fence
            .iter()
            .find(|(q, _)| *q == id)
            .map_or(1, |&(_, n)| n)
    }

    /// Makes the entry of queue `id` (fences from 1) if the file has none yet.
    ///
    /// # Errors
    ///
    /// `ENOMEM`; nothing changes then.
    fn add_next_fence(&mut self, id: QueueId) -> Result {
        if !self.next_fence.iter().any(|(q, _)| *q == id) {
            self.next_fence.push((id, 1), GFP_KERNEL_ACCOUNT)?;
        }
        Ok(())
    }

    /// Records that the released instance of queue `id` would have given fence `next` next
    /// (its entry exists since its `QUEUE_INIT`).
    fn set_next_fence(&mut self, id: QueueId, next: u64) {
        if let Some(e) = self.next_fence.iter_mut().find(|(q, _)| *q == id) {
            e.1 = next;
        }
    }
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
    /// Held by the file's running `QUEUE_EVENTS` from its look at the queues until the records
    /// are copied out and marked reported: two threads never both report one event.
    #[pin]
    events_slot: Mutex<()>,
    /// The file's poll wait queue, woken by its queues' completions (`events.rs`).
    events: Arc<FileEvents>,
    /// Bytes of the copies prepared, and of the `MEMCPY`s and `MEMSET`s done (fdinfo).
    copy_bytes: Atomic<u64>,
    /// Fences completed and failed on queues the file released (fdinfo; its current queues
    /// count their own).
    released_fences: [Atomic<u64>; 2],
    /// Most live buffers (allocated and imported) of this file, `EMFILE` past it: the
    /// `max_buffers` module parameter when the file was opened (65536 by default). Bounds the
    /// kernel memory one file makes the device hold in buffer records (each also charged to
    /// the caller's memory cgroup).
    max_buffers: u32,
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
        info.max_buffers = self.max_buffers;
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
        let device_rings = q.flags & uapi::NEURON_UDMA_QUEUE_DEVICE_RINGS != 0;
        reserved_zero(&[
            u64::from(q.flags & !uapi::NEURON_UDMA_QUEUE_DEVICE_RINGS),
            u64::from(q.reserved0),
            q.reserved[0],
            q.reserved[1],
        ])?;
        let id = QueueId::new(self.dev.arch, q.engine, q.queue).ok_or(EINVAL)?;
        // Rings in host memory: only an engine with host connectivity can fetch them
        // (hardware.rst §2.5). EOPNOTSUPP, not EINVAL: the engine exists, it just cannot serve
        // such a queue (with DEVICE_RINGS it can, when the device has device memory).
        if self.dev.is_alive() && !device_rings && !self.dev.arch.has_host_connectivity(q.engine) {
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
        st.add_next_fence(id)?;
        let first_fence = st.first_fence(id);
        self.dev.queue_init_placed(
            id,
            (q.tx_descs, q.rx_descs),
            Owner::File(self.id),
            Some(self.events.clone()),
            device_rings,
            first_fence,
        )?;
        // Cannot fail: capacity was reserved.
        let _ = st.queues.push_within_capacity(id);
        Ok(())
    }

    fn queue_release(&self, q: &uapi::neuron_udma_queue_id) -> Result {
        reserved_zero(&[q.reserved])?;
        let id = QueueId::new(self.dev.arch, q.engine, q.queue).ok_or(ENOENT)?;
        let mut st = self.st.lock();
        let idx = st.queues.iter().position(|&x| x == id).ok_or(ENOENT)?;
        if let Ok(chan) = self.dev.queue(Owner::File(self.id), id) {
            let (done, failed) = chan.fence_counts();
            self.released_fences[0].fetch_add(done, Relaxed);
            self.released_fences[1].fetch_add(failed, Relaxed);
        }
        let next = self.dev.queue_release(Owner::File(self.id), id)?;
        st.queues.remove(idx).map_err(|_| ENOENT)?;
        st.set_next_fence(id, next);
        Ok(())
    }

    /// Validates and translates `copies` into one submission and writes it to queue
    /// `eng`/`qid`, all or nothing. Returns the pairs written when a copy has
    /// `NEURON_UDMA_COPY_SPLIT`, else 0 (ABI 1).
    fn prepare(&self, eng: u32, qid: u32, copies: &[uapi::neuron_udma_copy]) -> Result<isize> {
        let chan = self.queue(eng, qid)?;
        self.prepare_on(&chan, copies, false).map(|(r, _)| r)
    }

    /// [`Self::prepare`] on the queue instance `chan`, and with `fenced` a fence after the pairs
    /// under the same queue lock ([`Channel::prepare_fenced`]), returned second (0 without).
    fn prepare_on(
        &self,
        chan: &Channel,
        copies: &[uapi::neuron_udma_copy],
        fenced: bool,
    ) -> Result<(isize, u64)> {
        let mut batch = Batch::new(copies.len())?;
        let route = self.dev.arch.host_route;
        for c in copies {
            batch.add(&self.dev.pool, self.id, route, c)?;
        }
        let holds = batch.take_holds();
        let seq = if fenced {
            chan.prepare_fenced(batch.copies(), batch.largest, holds)?
        } else {
            chan.prepare(batch.copies(), batch.largest, holds)?;
            0
        };
        let bytes: u64 = copies.iter().map(|c| u64::from(c.size)).sum();
        self.copy_bytes.fetch_add(bytes, Relaxed);
        let (flags, pairs) = (batch.flags, batch.pairs());
        Ok((split_result(flags, pairs), seq))
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

    /// `COPY_SUBMIT`: the new fence (or the newest one); listeners watch it from now on.
    fn copy_submit(&self, c: &mut uapi::neuron_udma_copy_submit) -> Result {
        reserved_zero(&[u64::from(c.flags), u64::from(c.reserved)])?;
        let chan = self.queue(c.engine, c.queue)?;
        c.fence = chan.submit_fence()?;
        self.dev.watch(&chan);
        Ok(())
    }

    fn fence_status(&self, f: &mut uapi::neuron_udma_fence_status) -> Result {
        let chan = self.queue(f.engine, f.queue)?;
        let (state, done, newest) = chan.fence_state(f.fence)?;
        let (state, error) = match state {
            FenceState::Pending => (uapi::NEURON_UDMA_FENCE_PENDING, 0),
            FenceState::Done => (uapi::NEURON_UDMA_FENCE_DONE, 0),
            FenceState::Failed(e) => (uapi::NEURON_UDMA_FENCE_FAILED, -e.to_errno()),
            FenceState::Expired => (uapi::NEURON_UDMA_FENCE_EXPIRED, 0),
        };
        f.state = state;
        f.error = error;
        f.completed = done;
        f.submitted = newest;
        Ok(())
    }

    fn fence_wait(&self, w: &uapi::neuron_udma_fence_wait) -> Result {
        reserved_zero(&[u64::from(w.reserved)])?;
        let chan = self.queue(w.engine, w.queue)?;
        chan.wait_fence(w.fence, timeout(w.timeout_ms))
    }

    /// `QUEUE_EVENTS`: what the file's queues did since their events were last reported, into
    /// the user array of `e.max` records.
    fn queue_events(&self, e: &mut uapi::neuron_udma_events) -> Result {
        let max = e.max.min(MAX_EVENTS) as usize;
        let _one_at_a_time = self.events_slot.lock();
        let mut out: KVec<uapi::neuron_udma_queue_event> = KVec::new();
        let mut seen: KVec<(Arc<Channel>, QueueEvents)> = KVec::new();
        let ids = {
            let st = self.st.lock();
            let mut ids = KVec::with_capacity(st.queues.len(), GFP_KERNEL_ACCOUNT)?;
            for &id in st.queues.iter() {
                ids.push(id, GFP_KERNEL_ACCOUNT)?;
            }
            ids
        };
        for id in ids {
            if out.len() == max {
                break;
            }
            let Ok(chan) = self.dev.queue(Owner::File(self.id), id) else {
                continue;
            };
            // A queue another thread of the file released meanwhile has nothing to report.
            let Ok(Some(ev)) = chan.peek_events() else {
                continue;
            };
            out.push(event_record(&chan, &ev), GFP_KERNEL_ACCOUNT)?;
            seen.push((chan, ev), GFP_KERNEL_ACCOUNT)?;
        }
        let size = core::mem::size_of::<uapi::neuron_udma_queue_event>();
        let mut w =
            UserSlice::new(UserPtr::from_addr(e.events as usize), size * out.len()).writer();
        for r in out.iter() {
            w.write(r)?;
        }
        // Reported only once the records reached user space: an EFAULT loses nothing.
        for (chan, ev) in seen.iter() {
            chan.mark_reported(ev);
        }
        // CAST: at most MAX_EVENTS.
        e.count = out.len() as u32;
        Ok(())
    }

    fn queue_eventfd(&self, e: &uapi::neuron_udma_eventfd) -> Result {
        reserved_zero(&[u64::from(e.reserved)])?;
        let chan = self.queue(e.engine, e.queue)?;
        let fd = if e.fd == -1 {
            None
        } else {
            Some(EventFd::from_fd(e.fd)?)
        };
        chan.set_eventfd(fd)?;
        self.dev.watch(&chan);
        Ok(())
    }

    /// `poll()`: registers the file's wait queue, watches its queues with fences in flight, and
    /// says whether a queue has completions (`EPOLLIN`) or failures (`EPOLLPRI | EPOLLERR`)
    /// not reported yet.
    fn poll(&self, file: &File, table: &PollTable<'_>) -> u32 {
        table.register_wait(file, self.events.condvar());
        self.events.mark_polled();
        let ids = {
            let st = self.st.lock();
            let mut ids = KVec::new();
            if ids.reserve(st.queues.len(), GFP_KERNEL_ACCOUNT).is_err() {
                return kernel::bindings::POLLERR;
            }
            for &id in st.queues.iter() {
                let _ = ids.push_within_capacity(id);
            }
            ids
        };
        let mut mask = 0;
        for id in ids {
            let Ok(chan) = self.dev.queue(Owner::File(self.id), id) else {
                continue;
            };
            let (completed, failed) = chan.pending_events();
            if completed {
                mask |= kernel::bindings::POLLIN | kernel::bindings::POLLRDNORM;
            }
            if failed {
                mask |= kernel::bindings::POLLPRI | kernel::bindings::POLLERR;
            }
            self.dev.watch(&chan);
        }
        if !self.dev.is_alive() {
            mask |= kernel::bindings::POLLERR | kernel::bindings::POLLHUP;
        }
        mask
    }

    /// An io_uring `NEURON_UDMA_URING_COPY` of this file: prepares `count` copies at `copies`
    /// on queue `eng`/`qid`, submits them with a fence and queues `cmd` until the fence
    /// settles (on an `iopoll` ring, [`Self::uring_poll`] completes it). Returns
    /// `-EIOCBQUEUED`, or a negative errno with which io_uring completes the command: nothing
    /// was prepared then, except when only queueing the command failed (`ENOMEM`, `ENODEV`
    /// after its fence was submitted: its copies still run, their buffers held until done).
    fn uring_submit(
        &self,
        cmd: *mut RawUringCmd,
        eng: u32,
        qid: u32,
        count: u32,
        copies: u64,
        iopoll: bool,
    ) -> Result<i32> {
        if !self.dev.is_alive() {
            return Err(ENODEV);
        }
        if count == 0 || count > MAX_BATCH {
            return Err(EINVAL);
        }
        let chan = self.queue(eng, qid)?;
        // No fence slot: fail before the copies are read (checked again under the queue lock).
        if !chan.can_submit()? {
            return Err(EBUSY);
        }
        let staged = read_copies(copies, count)?;
        // The pairs and their fence under one queue lock: a fence slot taken meanwhile by
        // another thread of the file fails the command with nothing prepared.
        // On the instance looked up above: a release and re-init of the id meanwhile fails
        // the command (`ECANCELED`) rather than moving it to the new instance.
        let (_, seq) = self.prepare_on(&chan, &staged, true)?;
        // SAFETY: `cmd` is the command being issued; the driver's `uring_cmd` owns its bytes.
        unsafe { uring::uring_pdu_set(cmd, eng, qid, chan.instance, seq) };
        // The queue's listeners (an eventfd, a poller, queued commands) hear of the fence just
        // submitted, whatever happens to `cmd` below.
        self.dev.watch(&chan);
        if !iopoll {
            // SAFETY: `cmd` is queued from here on (`-EIOCBQUEUED` below) and completed only
            // through the `UringCmd`.
            let Some(c) = (unsafe { UringCmd::new(cmd, seq) }) else {
                return Err(EINVAL);
            };
            let added = chan.add_uring(c);
            // Queued: watched again now that it listens too.
            self.dev.watch(&chan);
            if let Err((e, c)) = added {
                // Not queued: io_uring completes it with `e`; its fence was submitted, so a
                // queue gone meanwhile (released, or unbound: `ENODEV`) cancelled it.
                c.into_raw();
                return Err(if e == ENODEV { ECANCELED } else { e });
            }
        }
        Ok(EIOCBQUEUED.to_errno())
    }

    /// Completes the IOPOLL command `cmd` if its fence settled, or with `-ECANCELED` if its
    /// queue instance is gone (released, re-initialised, unbound); returns whether it did.
    fn uring_poll(&self, cmd: *mut RawUringCmd) -> bool {
        // SAFETY: `cmd` is a queued command of `uring_submit`, which recorded its queue
        // instance and fence.
        let (eng, qid, instance, seq) = unsafe { uring::uring_pdu_get(cmd) };
        // The queue by id, then the instance: a queue of the same id initialised since is
        // another instance, whose fence numbers never name this command's.
        let state = match self.queue(eng, qid) {
            Ok(c) if c.instance == instance => c.poll_fence(seq),
            _ => Err(ECANCELED),
        };
        let res = match state {
            Ok(FenceState::Pending) => return false,
            Ok(FenceState::Done) => 0,
            Ok(FenceState::Failed(_)) => EIO.to_errno(),
            Ok(FenceState::Expired) => ESTALE.to_errno(),
            // Gone with its instance: released (`ECANCELED`) or unbound (`ENODEV`).
            Err(e) if e == ENODEV => ECANCELED.to_errno(),
            Err(e) => e.to_errno(),
        };
        // SAFETY: queued and not completed (it completes only here, once its fence settled).
        unsafe { uring::uring_cmd_done(cmd, res) };
        true
    }

    /// Waits for this file's slot on the shared H2T queue: one `MEMCPY` or `MEMSET` of a file
    /// at a time (the wait counts against `limit` from `start` and ends on SIGKILL).
    fn h2t_slot(
        &self,
        start: kernel::time::Instant<kernel::time::Monotonic>,
        limit: Delta,
    ) -> Result<kernel::sync::MutexGuard<'_, ()>> {
        loop {
            if let Some(g) = self.memcpy_slot.try_lock() {
                return Ok(g);
            }
            if start.elapsed() >= limit {
                return Err(ETIMEDOUT);
            }
            if sched::fatal_signal_pending() {
                return Err(EINTR);
            }
            kernel::time::delay::fsleep(Delta::from_micros(200));
        }
    }

    fn memcpy(&self, m: &uapi::neuron_udma_memcpy) -> Result {
        reserved_zero(&[u64::from(m.reserved)])?;
        if m.size == 0 {
            return Err(EINVAL);
        }
        let limit = timeout(m.timeout_ms);
        let start = kernel::time::Instant::<kernel::time::Monotonic>::now();
        let _slot = self.h2t_slot(start, limit)?;
        let (s, d) = (self.buffer(m.src_handle)?, self.buffer(m.dst_handle)?);
        let route = self.dev.arch.host_route;
        let job = Job {
            src: s.span(route, m.src_offset, m.size)?,
            dst: d.span(route, m.dst_offset, m.size)?,
            size: m.size,
        };
        d.check_writable()?;
        // `MEM_FREE` refuses buffers in use until the engine is done with them.
        let hold = Hold::Buffers([s.busy()?, d.busy()?]);
        let left = limit - start.elapsed();
        self.dev
            .h2t()?
            .copy_for_file(&self.dev.pool, self.id, job, left, hold)?;
        self.copy_bytes.fetch_add(m.size, Relaxed);
        Ok(())
    }

    /// `MEMSET`: fills a range of a buffer of this file with one byte value through the
    /// engine, as `MEMCPY` copies (the same queue, slot, timeout and orphan rules), reading the
    /// device's block of that value ([`Patterns`](crate::pattern::Patterns)).
    fn memset(&self, m: &uapi::neuron_udma_memset) -> Result {
        let value = u8::try_from(m.value).map_err(|_| EINVAL)?;
        if m.size == 0 {
            return Err(EINVAL);
        }
        let limit = timeout(m.timeout_ms);
        let start = kernel::time::Instant::<kernel::time::Monotonic>::now();
        let _slot = self.h2t_slot(start, limit)?;
        let d = self.buffer(m.handle)?;
        let pattern = self.dev.patterns.get(value)?;
        let job = Job {
            src: Span::Repeat(pattern.addr()),
            dst: d.span(self.dev.arch.host_route, m.offset, m.size)?,
            size: m.size,
        };
        d.check_writable()?;
        let hold = Hold::Fill(d.busy()?, pattern);
        let left = limit - start.elapsed();
        self.dev
            .h2t()?
            .copy_for_file(&self.dev.pool, self.id, job, left, hold)?;
        self.copy_bytes.fetch_add(m.size, Relaxed);
        Ok(())
    }

    /// `fdinfo`: what the file holds and did (`Documentation/userspace-api.rst`, "Counters").
    fn show_fdinfo(&self, m: &SeqFile) {
        let (queues, handles) = {
            let st = self.st.lock();
            let mut q: KVec<QueueId> = KVec::new();
            if q.reserve(st.queues.len(), GFP_KERNEL_ACCOUNT).is_err() {
                return;
            }
            for &id in st.queues.iter() {
                let _ = q.push_within_capacity(id);
            }
            (q, st.handles.len())
        };
        let mut held = [0u64; 3];
        let mut memlock = 0u64;
        {
            let st = self.st.lock();
            for &h in st.handles.iter() {
                if let Ok(b) = self.dev.pool.get(self.id, h) {
                    held[b.kind as usize] += b.size;
                    memlock += b.charged;
                }
            }
        }
        let [mut done, mut failed] = [
            self.released_fences[0].load(Relaxed),
            self.released_fences[1].load(Relaxed),
        ];
        for &id in queues.iter() {
            if let Ok(chan) = self.dev.queue(Owner::File(self.id), id) {
                let (d, f) = chan.fence_counts();
                done += d;
                failed += f;
                memlock += chan.charged();
            }
        }
        seq_print!(
            m,
            "neuron_udma-device:\t{}\n",
            self.dev.pdev.as_ref().name()
        );
        seq_print!(m, "neuron_udma-buffers:\t{}\n", handles);
        seq_print!(
            m,
            "neuron_udma-host-bytes:\t{}\n",
            held[MemKind::Host as usize]
        );
        seq_print!(
            m,
            "neuron_udma-device-bytes:\t{}\n",
            held[MemKind::Device as usize]
        );
        seq_print!(
            m,
            "neuron_udma-imported-bytes:\t{}\n",
            held[MemKind::Imported as usize]
        );
        seq_print!(m, "neuron_udma-memlock-bytes:\t{}\n", memlock);
        seq_print!(m, "neuron_udma-queues:\t{}\n", queues.len());
        seq_print!(
            m,
            "neuron_udma-copy-bytes:\t{}\n",
            self.copy_bytes.load(Relaxed)
        );
        seq_print!(m, "neuron_udma-fences-completed:\t{}\n", done);
        seq_print!(m, "neuron_udma-fences-failed:\t{}\n", failed);
    }
}

/// `poll()` of an open file (the trampoline of `rust/kfac/uring.c`; 7.3's `MiscDevice` has none).
///
/// # Safety
///
/// `file` is the private data of the open file `raw` (an `OpenFile`), `wait` its poll table.
#[no_mangle]
unsafe extern "C" fn neuron_udma_file_poll(
    file: *const OpenFile,
    raw: *mut kernel::bindings::file,
    wait: *mut kernel::bindings::poll_table_struct,
) -> kernel::bindings::__poll_t {
    // SAFETY: per the function's contract the file is open: its private data lives.
    let me = unsafe { &*file };
    // SAFETY: `raw` is the file being polled, valid for the call.
    let raw = unsafe { File::from_raw_file(raw) };
    // SAFETY: `wait` is the call's poll table (or null).
    let table = unsafe { PollTable::from_raw(wait) };
    me.poll(raw, &table)
}

/// An io_uring `NEURON_UDMA_URING_COPY` of an open file (the trampoline of `rust/kfac/uring.c`):
/// `-EIOCBQUEUED` once queued, or a negative errno (io_uring completes the command with it).
///
/// # Safety
///
/// `file` is the private data of the command's open file, `cmd` the command being issued.
#[no_mangle]
unsafe extern "C" fn neuron_udma_uring_submit(
    file: *const OpenFile,
    cmd: *mut RawUringCmd,
    engine: u32,
    queue: u32,
    count: u32,
    copies: u64,
    iopoll: bool,
    writable: bool,
) -> c_int {
    // SAFETY: per the function's contract the file is open (io_uring holds it).
    let me = unsafe { &*file };
    if !writable {
        return EBADF.to_errno();
    }
    me.uring_submit(cmd, engine, queue, count, copies, iopoll)
        .unwrap_or_else(|e| e.to_errno())
}

/// `uring_cmd_iopoll` of an open file: 1 if the IOPOLL command `cmd` completed now.
///
/// # Safety
///
/// `file` is the private data of the command's open file, `cmd` a command queued by
/// [`neuron_udma_uring_submit`] on an IOPOLL ring and not completed yet.
#[no_mangle]
unsafe extern "C" fn neuron_udma_uring_poll(file: *const OpenFile, cmd: *mut RawUringCmd) -> c_int {
    // SAFETY: per the function's contract the file is open.
    let me = unsafe { &*file };
    c_int::from(me.uring_poll(cmd))
}

/// The `QUEUE_EVENTS` record of queue `chan`'s events `ev`.
fn event_record(chan: &Channel, ev: &QueueEvents) -> uapi::neuron_udma_queue_event {
    let mut flags = 0;
    if ev.completed.is_some() {
        flags |= uapi::NEURON_UDMA_EVENT_COMPLETED;
    }
    if ev.failed.is_some() {
        flags |= uapi::NEURON_UDMA_EVENT_FAILED;
    }
    uapi::neuron_udma_queue_event {
        engine: chan.id.eng.get(),
        queue: chan.id.q.number(),
        flags,
        error: ev.failed.map_or(0, |f| -f.1.to_errno()),
        completed: ev.done,
        failed: ev.failed.map_or(0, |f| f.0),
    }
}

/// Reads the `count` copies (at most [`MAX_BATCH`]) at user address `copies` in one user copy,
/// before any lock: a page fault takes the mmap lock, which a fault on a buffer mapping holds
/// while it takes a buffer's lock.
fn read_copies(copies: u64, count: u32) -> Result<KVVec<uapi::neuron_udma_copy>> {
    let entry = core::mem::size_of::<uapi::neuron_udma_copy>();
    // CAST: `count` is at most MAX_BATCH.
    let n = count as usize;
    let mut v = KVVec::with_capacity(n, GFP_KERNEL_ACCOUNT)?;
    for _ in 0..n {
        v.push(uapi::neuron_udma_copy::default(), GFP_KERNEL_ACCOUNT)?;
    }
    // CAST: a user address.
    UserSlice::new(UserPtr::from_addr(copies as usize), entry * n)
        .reader()
        .read_slice(v.as_bytes_mut())?;
    Ok(v)
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
                    next_fence: KVVec::new(),
                }),
                memcpy_slot <- new_mutex!(()),
                events_slot <- new_mutex!(()),
                events: Arc::pin_init(FileEvents::new(), GFP_KERNEL_ACCOUNT)?,
                copy_bytes: Atomic::new(0),
                released_fences: [const { Atomic::new(0) }; 2],
                max_buffers: sysfs::max_buffers(),
            }),
            GFP_KERNEL_ACCOUNT,
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
        // Host buffers, and device buffers through BAR4 (write-combined); not imports.
        let device = buf.mappable().ok_or(EINVAL)?;
        // The VMA holds a reference to the buffer record (given back by its close); pages are
        // mapped on fault, under the buffer's lock (`buffer::Buffer`), so a mapping never reaches
        // memory that was freed, whenever it was made.
        let priv_ = buffer::vma_private(&buf);
        // SAFETY: `vma` is being set up by this call; `priv_` is a counted `Arc<Buffer>`
        // reference from `vma_private`, which the VMA's close gives back.
        let r = unsafe { mm::mmap_buffer(vma, priv_, buf.size, device) };
        if r.is_err() {
            // SAFETY: the VMA did not take the reference: give it back here.
            unsafe { buffer::neuron_udma_vma_put(priv_) };
        }
        r
    }

    fn show_fdinfo(me: Pin<&OpenFile>, m: &SeqFile, _file: &File) {
        me.show_fdinfo(m);
    }

    fn ioctl(me: Pin<&OpenFile>, file: &File, cmd: u32, arg: usize) -> Result<isize> {
        use uapi::*;
        // After unbind nothing is left to operate on (the file's resources were freed with it).
        if !me.dev.is_alive() {
            return Err(ENODEV);
        }
        // Commands that allocate, start DMA or change a queue need a file opened for writing:
        // a read-only descriptor may only look (INFO, QUEUE_STATE, FENCE_STATUS).
        if !matches!(cmd, IOC_INFO | IOC_QUEUE_STATE | IOC_FENCE_STATUS)
            && info_size(cmd).is_none()
            && file.flags() & flags::O_ACCMODE == flags::O_RDONLY
        {
            return Err(EBADF);
        }
        if matches!(
            cmd,
            IOC_MEM_ALLOC | IOC_MEM_IMPORT | IOC_MEMCPY | IOC_MEMSET
        ) {
            // What abandoned copies held comes back as soon as the engine is done with it
            // (checked at every call that needs memory or the shared queue; MEM_FREE reaps
            // itself).
            me.dev.reap();
        }
        if let Some(size) = info_size(cmd) {
            // Any ABI's INFO: the fields its struct has.
            let info = me.info()?;
            let bytes = info.as_bytes();
            UserSlice::new(UserPtr::from_addr(arg), size)
                .writer()
                .write_slice(bytes.get(..size).ok_or(EINVAL)?)?;
            return Ok(0);
        }
        let r = match cmd {
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
                let chan = me.queue(w.engine, w.queue)?;
                let r = chan.wait_all(timeout(w.timeout_ms));
                // The wait's own fence settles without the completion worker: let it tell the
                // queue's listeners (pollers, the eventfd), as for fences of COPY_SUBMIT.
                me.dev.watch(&chan);
                w.completed = r?;
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
            IOC_MEMSET => in_out(arg, false, |m: &mut neuron_udma_memset| {
                me.memset(m).map(|()| 0)
            }),
            IOC_COPY_SUBMIT => in_out(arg, true, |c: &mut neuron_udma_copy_submit| {
                me.copy_submit(c).map(|()| 0)
            }),
            IOC_FENCE_STATUS => in_out(arg, true, |f: &mut neuron_udma_fence_status| {
                me.fence_status(f).map(|()| 0)
            }),
            IOC_FENCE_WAIT => in_out(arg, false, |w: &mut neuron_udma_fence_wait| {
                me.fence_wait(w).map(|()| 0)
            }),
            IOC_QUEUE_EVENTS => in_out(arg, true, |e: &mut neuron_udma_events| {
                me.queue_events(e).map(|()| 0)
            }),
            IOC_QUEUE_EVENTFD => in_out(arg, false, |e: &mut neuron_udma_eventfd| {
                me.queue_eventfd(e).map(|()| 0)
            }),
            IOC_DMABUF_EXPORT => {
                // The descriptor is installed only once its number reached user space (an
                // installed descriptor cannot be taken back).
                let mut pending = None;
                let r = in_out(arg, true, |e: &mut neuron_udma_dmabuf_export| {
                    pending = Some(crate::dmabuf::export_ioctl(&me.dev, me.id, e)?);
                    Ok(0)
                });
                if let (Some(p), Ok(_)) = (pending, &r) {
                    p.install();
                }
                r
            }
            IOC_DMABUF_IMPORT => {
                // The device stays bound until the buffer is in the pool (unbind then frees it),
                // and no longer: the result is copied out after the section ended, as a fault
                // there may take as long as the user wants (FUSE, userfaultfd). A handle that
                // cannot be copied out is taken back.
                let mut published = None;
                let r = in_out(arg, true, |a: &mut neuron_udma_dmabuf_import| {
                    let handle = NEXT_HANDLE.fetch_add(1, Relaxed);
                    let (b, bound) =
                        crate::dmabuf::import_ioctl(&me.dev, me.id, me.file, handle, a)?;
                    me.mem_alloc_publish(b, true)?;
                    drop(bound);
                    published = Some(handle);
                    Ok(0)
                });
                if let (Err(_), Some(handle)) = (&r, published) {
                    // Nothing of this call used it yet; another thread of the file that guessed
                    // the handle and holds it makes this EBUSY: the file keeps the buffer until
                    // it is freed or closed.
                    let _ = me.mem_free(&uapi::neuron_udma_mem_free {
                        handle,
                        reserved: 0,
                    });
                }
                r
            }
            _ => Err(ENOTTY),
        };
        // A queue that another thread of the file released while this call used it answers
        // ECANCELED (the instance is gone); ENODEV from a live device is a queue that is not
        // this file's any more (ENOENT); ENODEV from a dead one means the device was unbound.
        match r {
            Err(e) if e == ENODEV && me.dev.is_alive() => Err(ENOENT),
            r => r,
        }
    }
}
