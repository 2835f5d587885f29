// SPDX-License-Identifier: GPL-2.0

//! The character device `/dev/neuron_udmaN` and its ioctl ABI (`include/uapi/linux/neuron_udma.h`).
//!
//! Every open file owns the buffers and queues it creates; nothing of another file is reachable
//! through it (unknown handles and other files' queues are `ENOENT`). Each ioctl validates all
//! of its input before it changes anything, so a bad argument leaves every ring, buffer and
//! queue as it was. Closing the file (also by a killed process) releases everything it owns.
//!
//! This file holds the open file itself (what it owns, open, close, `mmap`, `fdinfo`); its
//! children hold the rest, one subject each: `ioctl` (the table of commands that dispatches
//! every ioctl), `buffers` (`MEM_*`, `DMABUF_*`), `queues` (`QUEUE_*`, `COPY_*`, `FENCE_*`),
//! `memcpy` (`MEMCPY`, `MEMSET`), `listen` (`poll()`, `QUEUE_EVENTS`, `QUEUE_EVENTFD`) and
//! `uring` (io_uring commands).

mod buffers;
mod ioctl;
mod listen;
mod memcpy;
mod queues;
mod uring;

use crate::{
    buffer::{self, Buffer, MemKind},
    channel::{Channel, Owner, QueueId, DEFAULT_TIMEOUT, MIN_TIMEOUT_MS},
    device::UdmaDevice,
    events::FileEvents,
    kfac::{
        mm::{self, MappedFile},
        sysfs,
    },
    uapi, Registry,
};
use kernel::{
    fs::File,
    miscdevice::{MiscDevice, MiscDeviceRegistration},
    mm::virt::VmaNew,
    new_mutex,
    prelude::*,
    seq_file::{seq_print, SeqFile},
    sync::{
        atomic::{Atomic, Relaxed},
        Arc, Mutex,
    },
    time::Delta,
};

/// Most entries of one `COPY_PREPARE` (twice the reference's 2032-pair submission).
pub(crate) const MAX_BATCH: u32 = 4096;

/// Source of unique open-file ids (queue ownership).
static NEXT_FILE_ID: Atomic<u64> = Atomic::new(1);

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
    /// a buffer is kept from being freed between its lookup and its use by its hold, through
    /// the resident set of the queue the copy is prepared on (`resident.rs`, under a lock of
    /// that queue's alone, so threads on different queues do not serialise).
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
        // The `owner` of the file's buffers and queues in the tracepoints.
        seq_print!(m, "neuron_udma-id:\t{}\n", self.id);
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
        ioctl::dispatch(&me, file, cmd, arg)
    }
}
