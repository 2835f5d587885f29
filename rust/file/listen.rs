// SPDX-License-Identifier: GPL-2.0

//! How an open file hears of its queues' completions: `poll()` (with its trampoline),
//! `QUEUE_EVENTS` (what each queue did since it was last reported) and `QUEUE_EVENTFD`.
//! The listeners themselves are in `events.rs`; the completion engine in `completion.rs`.

use super::{reserved_zero, OpenFile};
use crate::{
    channel::{Channel, Owner, QueueEvents},
    completion::Completer,
    events::EventFd,
    uapi,
};
use kernel::{
    fs::File,
    prelude::*,
    sync::{poll::PollTable, Arc},
    uaccess::{UserPtr, UserSlice},
};

/// Most queue event records one `QUEUE_EVENTS` returns (a file holds at most this many
/// queues of one device: 132 engines x 16 queues).
const MAX_EVENTS: u32 = 2112;

impl OpenFile {
    /// `QUEUE_EVENTS`: what the file's queues did since their events were last reported, into
    /// the user array of `e.max` records.
    pub(super) fn queue_events(&self, e: &mut uapi::neuron_udma_events) -> Result {
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

    /// `QUEUE_EVENTFD`: sets (or with `fd` -1 clears) the eventfd the queue signals once per
    /// fence settled.
    pub(super) fn queue_eventfd(&self, e: &uapi::neuron_udma_eventfd) -> Result {
        reserved_zero(&[u64::from(e.reserved)])?;
        let chan = self.queue(e.engine, e.queue)?;
        let fd = if e.fd == -1 {
            None
        } else {
            Some(EventFd::from_fd(e.fd)?)
        };
        chan.set_eventfd(fd)?;
        Completer::look_then_watch(&self.dev.completer, &chan);
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
            let (completed, failed, busy) = chan.pending_events();
            if completed {
                mask |= kernel::bindings::POLLIN | kernel::bindings::POLLRDNORM;
            }
            if failed {
                mask |= kernel::bindings::POLLPRI | kernel::bindings::POLLERR;
            }
            // Only a queue with fences in flight needs watching: a poll that follows a wake-up
            // would otherwise start the engine (a work item and a context switch, the waker
            // preempted) just to find the queue idle (Documentation/benchmarks.rst, (ev)).
            if busy {
                Completer::watch_queue(&self.dev.completer, &chan);
            }
        }
        if !self.dev.is_alive() {
            mask |= kernel::bindings::POLLERR | kernel::bindings::POLLHUP;
        }
        mask
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
