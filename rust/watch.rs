// SPDX-License-Identifier: GPL-2.0

//! The completion worker of a device: notices completed and failed fences of the queues that
//! somebody listens to (a polled file, an eventfd, io_uring commands: `events.rs`) and tells the
//! listeners (`Channel::notify`). It runs only while such a queue has fences in flight: a queue
//! joins the watch list when fences are submitted or a file polls, and leaves it when it has no
//! fence in flight or nobody listens. It polls like every waiter of the driver (`Backoff`: a
//! short spin after progress, then sleeps doubling to 1 ms), and reads the engines' error state
//! every [`STATE_CHECK_EVERY`] (an engine error, or no progress for the default timeout, resets
//! the queue and fails its fences).
//!
//! A blocked waiter (`COPY_WAIT`, `FENCE_WAIT`, `MEMCPY`) polls its own fence and does not need
//! the worker.

use crate::channel::{Backoff, Channel};
use kernel::{
    new_mutex, new_work,
    prelude::*,
    sync::{
        atomic::{Atomic, Relaxed, Release},
        Arc, Mutex,
    },
    time::{Delta, Instant, Monotonic},
    workqueue::{self, impl_has_work, Work, WorkItem},
};

/// How often the worker reads the watched engines' error state.
const STATE_CHECK_EVERY: Delta = Delta::from_millis(20);

struct List {
    /// The watched queues, each with the count of [`Watcher::watch`] calls for it while listed:
    /// a queue the worker found with nothing to watch leaves the list only if no call for it
    /// came meanwhile (that call may have submitted a fence or added a listener after the
    /// worker looked, and found the queue still listed).
    chans: KVec<(Arc<Channel>, u64)>,
    /// False after [`Watcher::shutdown`]: nothing is watched any more.
    alive: bool,
}

/// The completion worker of one device.
#[pin_data]
pub(crate) struct Watcher {
    #[pin]
    list: Mutex<List>,
    /// Non-zero while the work is queued or running.
    running: Atomic<u32>,
    #[pin]
    work: Work<Watcher>,
}

impl_has_work! {
    impl HasWork<Self> for Watcher { self.work }
}

impl WorkItem for Watcher {
    type Pointer = Arc<Watcher>;

    fn run(this: Arc<Watcher>) {
        this.poll();
    }
}

impl Watcher {
    /// An idle worker.
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    pub(crate) fn new() -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                list <- new_mutex!(List {
                    chans: KVec::new(),
                    alive: true,
                }),
                running: Atomic::new(0),
                work <- new_work!("neuron_udma::watch"),
            }),
            GFP_KERNEL,
        )
    }

    /// Watches `chan` while it has listeners and fences in flight (called after fences were
    /// submitted, or when a file polls); starts the worker if it is idle.
    pub(crate) fn watch(this: &Arc<Self>, chan: &Arc<Channel>) {
        if !chan.has_listeners() {
            return;
        }
        {
            let mut l = this.list.lock();
            if !l.alive {
                return;
            }
            if let Some(e) = l.chans.iter_mut().find(|(c, _)| Arc::ptr_eq(c, chan)) {
                e.1 = e.1.wrapping_add(1);
            } else if l.chans.push((chan.clone(), 0), GFP_KERNEL).is_err() {
                // Without memory the queue is not watched: its waiters still see every fence,
                // its listeners see them at the next submission or poll.
                return;
            }
        }
        if this.running.cmpxchg(0, 1, Relaxed).is_ok() {
            // Cannot be queued already: `running` was 0.
            let _ = workqueue::system_unbound().enqueue(this.clone());
        }
    }

    /// The worker: rounds over the watched queues until none needs watching.
    fn poll(&self) {
        let mut backoff = Backoff::new();
        let mut checked_at = Instant::<Monotonic>::now();
        loop {
            let check = checked_at.elapsed() >= STATE_CHECK_EVERY;
            if check {
                checked_at = Instant::now();
            }
            let mut progress = false;
            let mut i = 0;
            loop {
                let (chan, requests) = {
                    let l = self.list.lock();
                    match l.chans.get(i) {
                        Some((c, n)) => (c.clone(), *n),
                        None => break,
                    }
                };
                let before = chan.settled_fences();
                let keep = chan.notify(check);
                progress |= chan.settled_fences() != before;
                let mut l = self.list.lock();
                let pos = l.chans.iter().position(|(c, _)| Arc::ptr_eq(c, &chan));
                match pos {
                    // A `watch` of it since the look above: look again in the next round.
                    Some(p) if !keep && l.chans.get(p).is_some_and(|e| e.1 == requests) => {
                        let _ = l.chans.remove(p);
                    }
                    _ => i += 1,
                }
            }
            {
                let l = self.list.lock();
                if l.chans.is_empty() {
                    self.running.store(0, Release);
                    return;
                }
            }
            if progress {
                backoff.progress();
            }
            backoff.pause();
        }
    }

    /// For debugfs: whether the worker is queued or running, and how many queues it watches.
    pub(crate) fn state(&self) -> (bool, usize) {
        let n = self.list.lock().chans.len();
        (self.running.load(Relaxed) != 0, n)
    }

    /// Unbind, after every queue was paused: stops watching and waits for the worker.
    pub(crate) fn shutdown(&self) {
        {
            let mut l = self.list.lock();
            l.alive = false;
            l.chans.clear();
        }
        crate::kfac::sched::flush_work(&self.work);
    }
}
