// SPDX-License-Identifier: GPL-2.0

//! Who hears of a queue's completions besides its waiters (`events.rs`): what `QUEUE_EVENTS`
//! reported last, the owning file's pollers, the queue's eventfd and the io_uring commands
//! waiting for its fences, and the completion engine's look at the queue (`completion.rs`). The
//! listeners have a lock of their own, taken before the queue lock when both are.

use super::Channel;
use crate::{
    events::{EventFd, FileEvents, UringCmd},
    fence,
    queue::FenceState,
    submit::{Door, STATE_CHECK_EVERY},
};
use kernel::{
    prelude::*,
    sync::Arc,
    time::{Instant, Monotonic},
};

/// What a queue's events reported last (`QUEUE_EVENTS`).
#[derive(Clone, Copy, Default)]
pub(super) struct Reported {
    done: u64,
    failed: u64,
}

/// What happened on a queue since its events were last reported ([`Channel::peek_events`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct QueueEvents {
    /// Fences completed: the newest done.
    pub(crate) completed: Option<u64>,
    /// A fence failed: the newest failed, and why.
    pub(crate) failed: Option<(u64, Error)>,
    /// The newest fence done (also when nothing new completed).
    pub(crate) done: u64,
}

impl QueueEvents {
    fn since(r: &Reported, done: u64, failed: Option<(u64, Error)>) -> Option<Self> {
        let completed = (done > r.done).then_some(done);
        let failed = failed.filter(|f| f.0 > r.failed);
        (completed.is_some() || failed.is_some()).then_some(Self {
            completed,
            failed,
            done,
        })
    }
}

/// Who hears of the queue's completions besides its waiters (`events.rs`).
#[derive(Default)]
pub(super) struct Listeners {
    /// What `QUEUE_EVENTS` reported last.
    pub(super) reported: Reported,
    /// The owning file's poll wait queue.
    pub(super) file: Option<Arc<FileEvents>>,
    /// The queue's eventfd, and the fences settled when it was last signalled.
    pub(super) eventfd: Option<EventFd>,
    pub(super) signalled: u64,
    /// io_uring commands waiting for fences.
    pub(super) uring: KVec<UringCmd>,
    /// The fences settled when the file's pollers were last woken.
    pub(super) woken: u64,
    /// How many times the completion engine was asked to watch the queue (for debugfs).
    pub(super) watches: u64,
}

impl Listeners {
    /// Whether anybody listens ([`Channel::has_listeners`]).
    fn any(&self) -> bool {
        self.file.as_ref().is_some_and(|f| f.is_polled())
            || self.eventfd.is_some()
            || !self.uring.is_empty()
    }
}

/// A queue's listeners as debugfs shows them ([`Channel::listeners`]).
pub(crate) struct ListenerState {
    /// io_uring commands waiting.
    pub(crate) uring: usize,
    /// Whether the owning file was polled.
    pub(crate) polled: bool,
    /// Whether an eventfd is set.
    pub(crate) eventfd: bool,
    /// The fences settled when the eventfd was last signalled, and the pollers last woken.
    pub(crate) signalled: u64,
    pub(crate) woken: u64,
    /// How many times the completion engine was asked to watch the queue: a submission or wait
    /// that found fences still in flight after its own look, or a poll of a busy queue.
    pub(crate) watches: u64,
}

impl Channel {
    /// The queue's completions and failures not reported yet (`QUEUE_EVENTS`), or `None` when
    /// there is nothing new. Nothing is marked reported: [`Self::mark_reported`] does that once
    /// the record reached user space, so a failed copy-out loses no event.
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    pub(crate) fn peek_events(&self) -> Result<Option<QueueEvents>> {
        let (done, failed) = self.locked(|q| {
            q.retire();
            Ok(q.outcomes())
        })?;
        Ok(QueueEvents::since(
            &self.listeners.lock().reported,
            done,
            failed,
        ))
    }

    /// Marks what `ev` ([`Self::peek_events`]) holds as reported; what happened since stays
    /// pending (a report never moves back).
    pub(crate) fn mark_reported(&self, ev: &QueueEvents) {
        let mut l = self.listeners.lock();
        l.reported.done = l.reported.done.max(ev.done);
        if let Some((f, _)) = ev.failed {
            l.reported.failed = l.reported.failed.max(f);
        }
    }

    /// Whether the queue has completions or failures not reported yet, and whether it has
    /// fences in flight: `(completed, failed, busy)` (for `poll()`, which has the completion
    /// engine watch only a busy queue). Read under the queue lock, so a poller marked before
    /// the call either sees a fence submitted concurrently as busy or is seen as a listener by
    /// that submission (which then looks at the queue and has the engine watch it:
    /// `Completer::look_then_watch`).
    pub(crate) fn pending_events(&self) -> (bool, bool, bool) {
        let Ok((done, failed, busy)) = self.locked(|q| {
            q.retire();
            let (done, failed) = q.outcomes();
            Ok((done, failed, q.busy()))
        }) else {
            return (false, false, false);
        };
        let l = self.listeners.lock();
        (
            done > l.reported.done,
            failed.is_some_and(|f| f.0 > l.reported.failed),
            busy,
        )
    }

    /// Registers `eventfd` (or unregisters with `None`): signalled once per fence that settles
    /// from now on.
    ///
    /// # Errors
    ///
    /// `ECANCELED` if the queue was released, `ENODEV` if the device was unbound.
    pub(crate) fn set_eventfd(&self, eventfd: Option<EventFd>) -> Result {
        let settled = self.locked(|q| {
            q.retire();
            Ok(q.settled())
        })?;
        let old = {
            let mut l = self.listeners.lock();
            // `quiesce` marks the instance gone before it takes the eventfd under this lock,
            // so an eventfd set here is either refused or given back by that `quiesce`, never
            // kept by a released instance. The queue lock is not taken under this one: its
            // holder may wait long (a device-ring move), and the completion engine's look
            // blocks on this lock.
            if self.ended() {
                return Err(self.gone_error());
            }
            // Fences the engine already signalled (to the old eventfd) are not counted again.
            l.signalled = l.signalled.max(settled);
            core::mem::replace(&mut l.eventfd, eventfd)
        };
        drop(old);
        Ok(())
    }

    /// Queues `cmd`, which waits for one of this queue's fences, to be completed by the
    /// completion engine when the fence settles.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, `ECANCELED` (released), `ENODEV` (unbound); the command is handed back then (not queued).
    pub(crate) fn add_uring(&self, cmd: UringCmd) -> core::result::Result<(), (Error, UringCmd)> {
        let mut l = self.listeners.lock();
        // As in `set_eventfd`: `quiesce` completes the commands it finds under this lock after
        // marking the instance gone; the queue lock is not taken under this one.
        if self.ended() {
            return Err((self.gone_error(), cmd));
        }
        if l.uring.reserve(1, GFP_KERNEL_ACCOUNT).is_err() {
            return Err((ENOMEM, cmd));
        }
        // Cannot fail: capacity was reserved.
        l.uring.push_within_capacity(cmd).map_err(|e| (ENOMEM, e.0))
    }

    /// The state of fence `seq` after one look at the markers, or `None` if the queue lock is
    /// held: for a caller that must not wait for it (a non-blocking io_uring issue).
    ///
    /// # Errors
    ///
    /// `EINVAL` for a fence not submitted, `ECANCELED` (released), `ENODEV` (unbound).
    pub(crate) fn try_state(&self, seq: u64) -> Option<Result<FenceState>> {
        let mut inner = self.inner.try_lock()?;
        Some(match (*inner).as_mut() {
            Some(q) => q.state(seq),
            None => Err(self.gone_error()),
        })
    }

    /// The state of fence `seq` for a caller that polls it (an IOPOLL io_uring ring): the
    /// engine state is read at most every [`STATE_CHECK_EVERY`] while it is pending (an engine
    /// error or a stall resets the queue, failing the fence).
    ///
    /// # Errors
    ///
    /// `EINVAL` for a fence not submitted, `ENODEV`.
    pub(crate) fn poll_fence(&self, seq: u64) -> Result<FenceState> {
        let state = self.state(seq)?;
        if state != FenceState::Pending {
            return Ok(state);
        }
        let now = Instant::<Monotonic>::now();
        let due = {
            let mut last = self.checked_at.lock();
            if now - *last >= STATE_CHECK_EVERY {
                *last = now;
                true
            } else {
                false
            }
        };
        if due {
            self.recover()?;
            return self.state(seq);
        }
        Ok(state)
    }

    /// Every fence up to this one is settled (0 for a released queue).
    pub(crate) fn settled_fences(&self) -> u64 {
        self.locked(|q| Ok(q.settled())).unwrap_or(0)
    }

    /// The queue's listeners for debugfs.
    pub(crate) fn listeners(&self) -> ListenerState {
        let l = self.listeners.lock();
        ListenerState {
            uring: l.uring.len(),
            polled: l.file.as_ref().is_some_and(|f| f.is_polled()),
            eventfd: l.eventfd.is_some(),
            signalled: l.signalled,
            woken: l.woken,
            watches: l.watches,
        }
    }

    /// Counts a request to the completion engine to watch this queue
    /// ([`ListenerState::watches`]).
    pub(crate) fn note_watch(&self) {
        let mut l = self.listeners.lock();
        l.watches = l.watches.wrapping_add(1);
    }

    /// Whether anybody but a blocked waiter listens for this queue's completions (a polled
    /// file, an eventfd, io_uring commands): then the completion engine watches it while fences
    /// are in flight.
    pub(crate) fn has_listeners(&self) -> bool {
        self.listeners.lock().any()
    }

    /// One look at this queue, by the completion engine or by a call that submitted or waited
    /// (`Completer::look_then_watch`): retires what completed, then wakes the file's pollers,
    /// signals the eventfd (once per fence settled since the last signal) and completes the
    /// io_uring commands whose fence settled (0, `-EIO` for a failed fence, `-ESTALE` for an
    /// expired one). With `check`, also reads the engine state of a busy queue (an engine error
    /// or a stall resets it, failing its fences: the next look reports them).
    ///
    /// Never waits for the queue lock: its holder (a submission, a doorbell that moves a
    /// device ring, a wait) may hold it for long, and the engine looks at every member of the
    /// device in turn; a held lock is reported as busy without progress (looked at again soon).
    /// The queue lock covers only the retire and the fences' states: the listeners are told
    /// after it is dropped, under the listeners' lock alone, so a submission waits for no
    /// eventfd, task work or poll wake-up. Returns whether fences settled since the previous
    /// look, and whether the queue still has fences in flight that somebody listens for.
    pub(crate) fn notify(&self, check: bool) -> (bool, bool) {
        let (progress, busy, listening) = {
            let mut l = self.listeners.lock();
            let (settled, busy) = {
                let Some(mut inner) = self.inner.try_lock() else {
                    return (false, true);
                };
                let Some(q) = (*inner).as_mut() else {
                    return (false, false);
                };
                q.retire();
                // Every command against the one retire above: the commands are queued in the
                // order io_uring issued them, not by fence, and a retire between two of them
                // could settle a fence of a command already passed over as pending while
                // `busy` below then says nothing is in flight, and the worker would stop
                // watching with commands queued.
                for c in l.uring.iter_mut().filter(|c| c.result.is_none()) {
                    c.result = fence::completion(q.state_retired(c.seq));
                }
                (q.settled(), q.busy())
            };
            // Settled since the engine's previous look (by it or by a waiter's own retire).
            let progress = settled > l.woken;
            if settled > l.signalled {
                if let Some(e) = l.eventfd.as_ref() {
                    e.signal(settled - l.signalled);
                }
                l.signalled = settled;
            }
            let mut i = 0;
            while i < l.uring.len() {
                let Some(res) = l.uring[i].result else {
                    i += 1;
                    continue;
                };
                if let Ok(cmd) = l.uring.remove(i) {
                    cmd.complete(res);
                }
            }
            if settled > l.woken {
                l.woken = settled;
                if let Some(f) = l.file.as_ref() {
                    f.wake();
                }
            }
            (progress, busy, l.any())
        };
        if busy && check {
            let _ = self.recover();
        }
        (progress, busy && listening)
    }
}
