// SPDX-License-Identifier: GPL-2.0

//! The completion engine of a device: the one background poller that notices completed and
//! failed fences for everyone who does not wait in a call of their own. Its members are
//!
//! - the queues somebody listens to (a polled file, an eventfd, io_uring commands:
//!   `events.rs`), watched while they have fences in flight ([`Completer::watch`]); a round
//!   tells their listeners (`Channel::notify`). A call that submits or waits looks at its
//!   queue once itself first and has it watched only for fences still in flight
//!   ([`Completer::look_then_watch`]);
//! - the dmaengine channels (`dmaengine.rs`), members from registration to unbind, polled while
//!   they have descriptors in flight ([`Completer::kick`], which may be called in atomic
//!   context); a round completes descriptors and runs the clients' callbacks;
//! - the device's orphans (`device.rs`: what abandoned `MEMCPY`s hold), watched until the
//!   engine is done with them.
//!
//! It runs only while a member is busy, in one work item of the default unbound workqueue
//! (`system_dfl_wq`), and polls the way the block layer's hybrid polling does: each member has a
//! measured time to its next completion (a running mean of the time from "busy" or from the last
//! completion to the next, [`Entry::mean`]); the engine sleeps until half that time has passed for
//! the member due first, then looks without sleeping for [`POLL_SPIN`] and at [`POLL_INTERVAL`] for
//! the rest of a window as long as the mean (at least [`POLL_WINDOW_MIN`]), and only a member later
//! than that (a slowed or stalled engine) backs off, doubling up to [`LATE_SLEEP_MAX`]. After a
//! completion it looks again at once for [`SPIN`] (fences of a busy queue complete back to back).
//! It spins only while no other task wants the CPU (`kfac::sched::cpu_wanted`), and sleeps
//! [`POLL_INTERVAL`] instead: a listener it woke runs at once rather than after the spin.
//! Each member's engine state is read every [`Member::check_every`] while it is busy (an engine
//! error, or no progress for the default timeout, resets its queue and fails its fences).
//!
//! A look never waits for a member's long-held locks: a queue whose lock is held (a submission,
//! a doorbell that moves a device ring behind the H2T queue) is busy without progress and
//! looked at again, so no user's queue holds up the other members.
//!
//! A blocked waiter (`COPY_WAIT`, `FENCE_WAIT`, `MEMCPY`) polls its own fence and does not need
//! the engine. Data flows down: `device.rs`, `dmaengine.rs`, `file.rs` -> here -> `channel.rs`;
//! a member is a trait object, so nothing here knows the dmaengine or the device.

use crate::{channel::Channel, kfac::sched::cpu_wanted};
use kernel::{
    new_mutex, new_work,
    prelude::*,
    processor::cpu_relax,
    sync::{
        atomic::{Atomic, Full, Relaxed},
        Arc, Mutex,
    },
    time::{delay::fsleep, Delta, Instant, Monotonic},
    workqueue::{impl_has_work, Work, WorkItem},
};

/// How long the engine keeps looking without a sleep after a completion.
pub(crate) const SPIN: Delta = Delta::from_micros(20);
/// Sleep between two looks once a member is due, after [`POLL_SPIN`].
pub(crate) const POLL_INTERVAL: Delta = Delta::from_micros(20);
/// How long the engine looks without sleeping once a member is due.
pub(crate) const POLL_SPIN: Delta = Delta::from_micros(100);
/// Shortest window of looks at [`POLL_INTERVAL`] after a member is due.
pub(crate) const POLL_WINDOW_MIN: Delta = Delta::from_micros(200);
/// Longest sleep between two looks at a member later than its window.
pub(crate) const LATE_SLEEP_MAX: Delta = Delta::from_millis(1);
/// Longest sleep at all: the engine states of busy members are read at least this often.
const SLEEP_MAX: Delta = Delta::from_millis(5);
/// Weight of the newest sample in a member's running mean: 1 / 2^`MEAN_SHIFT`.
const MEAN_SHIFT: u32 = 3;

/// What one look at a member found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Look {
    /// Something completed since the previous look.
    pub(crate) progress: bool,
    /// Something is still in flight that the member needs the engine for.
    pub(crate) busy: bool,
}

impl Look {
    /// Nothing completed, nothing in flight.
    pub(crate) const IDLE: Self = Self {
        progress: false,
        busy: false,
    };
}

/// A member of the completion engine.
pub(crate) trait Member: Send + Sync {
    /// One look: completes what completed and tells whoever waits for it. With `check`, also
    /// reads the engine state of a busy queue (and resets it on an error or a stall). Runs
    /// from the engine's work item with no lock of the engine held.
    fn look(&self, check: bool) -> Look;

    /// How often the member's engine state is read while it is busy.
    fn check_every(&self) -> Delta;
}

/// Whether `a` and `b` are the same member (by address: two fat pointers to one object may
/// carry different vtable pointers).
fn same(a: &Arc<dyn Member>, b: &Arc<dyn Member>) -> bool {
    core::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// A member of [`Completer::add`]: leaves the engine on drop (the member should be idle by
/// then; the engine may be looking at it once more while it leaves).
pub(crate) struct Membership {
    completer: Arc<Completer>,
    member: Arc<dyn Member>,
}

impl Drop for Membership {
    fn drop(&mut self) {
        let mut l = self.completer.list.lock();
        l.entries.retain(|e| !same(&e.member, &self.member));
    }
}

/// A member in the list, with its timing.
struct Entry {
    member: Arc<dyn Member>,
    /// Stays in the list while idle (dmaengine channels, until [`Completer::remove`]).
    permanent: bool,
    /// The [`Completer::watch`] calls for it while listed: a member found idle leaves the list
    /// only if no call for it came meanwhile (that call may have made it busy after the look).
    requests: u64,
    /// When it became busy or last completed something while busy: the start of the wait for
    /// its next completion.
    since: Option<Instant<Monotonic>>,
    /// Running mean of the time from [`Self::since`] to the next completion, in nanoseconds
    /// (0: no sample yet).
    mean: i64,
    /// When its engine state was last read.
    checked_at: Instant<Monotonic>,
}

impl Entry {
    fn new(member: Arc<dyn Member>, permanent: bool) -> Self {
        let now = Instant::now();
        Self {
            member,
            permanent,
            requests: 0,
            since: Some(now),
            mean: 0,
            checked_at: now,
        }
    }

    /// When the member is expected to complete next (half its mean after [`Self::since`], as
    /// the block layer's hybrid polling sleeps), and how long it is looked at closely after.
    fn due(&self) -> Option<(Instant<Monotonic>, Delta)> {
        let since = self.since?;
        let half = Delta::from_nanos(self.mean / 2);
        let window = Delta::from_nanos(self.mean.max(POLL_WINDOW_MIN.as_nanos()));
        Some((since + half, window))
    }

    /// Takes what a look found at `now`: a completion is a sample of the time to it.
    fn record(&mut self, look: Look, now: Instant<Monotonic>) {
        if look.progress {
            if let Some(since) = self.since {
                // Not below 0: a `watch` may have set `since` after this round's `now`.
                let sample = (now - since).as_nanos().max(0);
                self.mean = if self.mean == 0 {
                    sample
                } else {
                    self.mean + ((sample - self.mean) >> MEAN_SHIFT)
                };
            }
            self.since = look.busy.then_some(now);
        } else if !look.busy {
            self.since = None;
        } else if self.since.is_none() {
            self.since = Some(now);
        }
    }
}

struct List {
    entries: KVec<Entry>,
    /// False after [`Completer::shutdown`]: nothing is watched any more.
    alive: bool,
}

/// The completion engine of one device.
#[pin_data]
pub(crate) struct Completer {
    #[pin]
    list: Mutex<List>,
    /// Non-zero while the work is queued or running.
    running: Atomic<u32>,
    /// Counts [`Self::kick`]s: a kick that comes while the work decides to stop is not lost.
    kicks: Atomic<u64>,
    /// The NUMA node the work runs on (the device's; -1: any).
    node: i32,
    #[pin]
    work: Work<Completer>,
}

impl_has_work! {
    impl HasWork<Self> for Completer { self.work }
}

impl WorkItem for Completer {
    type Pointer = Arc<Completer>;

    fn run(this: Arc<Completer>) {
        this.run_rounds();
    }
}

impl Completer {
    /// An idle engine with no member.
    ///
    /// # Errors
    ///
    /// `ENOMEM`.
    pub(crate) fn new(node: i32) -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                list <- new_mutex!(List {
                    entries: KVec::new(),
                    alive: true,
                }),
                running: Atomic::new(0),
                kicks: Atomic::new(0),
                node,
                work <- new_work!("neuron_udma::completion"),
            }),
            GFP_KERNEL,
        )
    }

    /// Adds `member` while the returned [`Membership`] lives (or until [`Self::shutdown`]); it
    /// is looked at after each [`Self::kick`] until it is idle.
    ///
    /// # Errors
    ///
    /// `ENOMEM`; `ENODEV` after [`Self::shutdown`].
    pub(crate) fn add(this: &Arc<Self>, member: Arc<dyn Member>) -> Result<Membership> {
        let mut l = this.list.lock();
        if !l.alive {
            return Err(ENODEV);
        }
        let mut e = Entry::new(member.clone(), true);
        e.since = None;
        l.entries.push(e, GFP_KERNEL)?;
        Ok(Membership {
            completer: this.clone(),
            member,
        })
    }

    /// Has the engine look at the members of [`Self::add`] again (one of them has work). Never
    /// sleeps: callable in atomic context.
    pub(crate) fn kick(this: &Arc<Self>) {
        this.kicks.fetch_add(1, Full);
        if this.running.cmpxchg(0, 1, Full).is_ok() {
            // Cannot be queued already: `running` was 0.
            let _ = crate::kfac::sched::enqueue_on_node(this.node, this.clone());
        }
    }

    /// Looks at `member` until it is idle (called when it may have become busy: fences
    /// submitted, a file polled, orphans adopted); starts the engine if it is idle.
    pub(crate) fn watch(this: &Arc<Self>, member: Arc<dyn Member>) {
        {
            let mut l = this.list.lock();
            if !l.alive {
                return;
            }
            if let Some(e) = l.entries.iter_mut().find(|e| same(&e.member, &member)) {
                e.requests = e.requests.wrapping_add(1);
                e.since.get_or_insert_with(Instant::now);
            } else if l
                .entries
                .push(Entry::new(member, false), GFP_KERNEL)
                .is_err()
            {
                // Without memory the member is not watched: a queue's listeners see its fences
                // at the next submission or poll, orphans are reaped at the next release.
                return;
            }
        }
        Self::kick(this);
    }

    /// Watches the queue `chan` while it has listeners and fences in flight.
    pub(crate) fn watch_queue(this: &Arc<Self>, chan: &Arc<Channel>) {
        if chan.has_listeners() {
            Self::watch_channel(this, chan);
        }
    }

    /// [`Self::watch`] of the queue `chan`, counted in its listeners' `watches` (debugfs).
    fn watch_channel(this: &Arc<Self>, chan: &Arc<Channel>) {
        chan.note_watch();
        Self::watch(this, chan.clone());
    }

    /// After a call that submitted or settled fences of `chan` (`COPY_SUBMIT`, `COPY_WAIT`, an
    /// io_uring command, a new eventfd): one look at the queue in the caller's own context
    /// ([`Channel::notify`]: what settled reaches the listeners now), then has the engine watch
    /// it only if fences are still in flight. Starting the engine costs a work item and two
    /// context switches, the caller preempted as it returns to user space
    /// (Documentation/benchmarks.rst, (ev)); a queue that this look finds idle does not need it.
    /// Not for `poll()`, whose look would wake the pollers from inside their own poll.
    pub(crate) fn look_then_watch(this: &Arc<Self>, chan: &Arc<Channel>) {
        if !chan.has_listeners() {
            return;
        }
        // `busy` is also true when the queue lock was held (nothing looked at): watched then.
        let (_, busy) = chan.notify(false);
        if busy {
            Self::watch_channel(this, chan);
        }
    }

    /// The work: rounds over the members until none is busy.
    fn run_rounds(&self) {
        let mut spin_until: Option<Instant<Monotonic>> = None;
        let mut late = POLL_INTERVAL;
        loop {
            // A full barrier: pairs with the one in `kick` (see the stop below).
            let kicks = self.kicks.fetch_add(0, Full);
            let (progress, next) = self.round();
            let now = Instant::<Monotonic>::now();
            if progress {
                spin_until = Some(now + SPIN);
                late = POLL_INTERVAL;
            }
            let Some((due, window)) = next else {
                // Nothing busy: stop, unless a kick came since the round began (its member may
                // have been looked at before it had work) and nobody restarted the work.
                self.running.xchg(0, Full);
                if self.kicks.fetch_add(0, Full) == kicks
                    || self.running.cmpxchg(0, 1, Full).is_err()
                {
                    return;
                }
                continue;
            };
            // Negative while the first busy member is not due yet.
            let late_by = now - due;
            // Spinning keeps the CPU only while nobody else wants it (`cpu_wanted`): a listener
            // this round woke is usually queued on this CPU, and under PREEMPT_LAZY it would
            // wait for the spin to end. Otherwise a sleep of POLL_INTERVAL gives the CPU up.
            if spin_until.is_some_and(|t| (t - now).as_nanos() > 0) {
                if cpu_wanted() {
                    fsleep(POLL_INTERVAL);
                } else {
                    cpu_relax();
                }
            } else if late_by.is_negative() {
                fsleep((Delta::ZERO - late_by).min(SLEEP_MAX));
            } else if late_by < window {
                // Due: look again without sleeping for the first POLL_SPIN of the window (a
                // sleep's wake-up alone costs tens of microseconds, which a listener would wait
                // for; the block layer's hybrid polling spins here too); then at POLL_INTERVAL.
                if late_by < POLL_SPIN && !cpu_wanted() {
                    cpu_relax();
                } else {
                    fsleep(POLL_INTERVAL);
                }
            } else {
                fsleep(late);
                late = Delta::from_nanos((late.as_nanos() * 2).min(LATE_SLEEP_MAX.as_nanos()));
            }
        }
    }

    /// One look at every member: whether any completed something, and when the first busy one
    /// is due (with its window), `None` if none is busy.
    fn round(&self) -> (bool, Option<(Instant<Monotonic>, Delta)>) {
        let mut progress = false;
        let mut next: Option<(Instant<Monotonic>, Delta)> = None;
        let mut i = 0;
        loop {
            let (member, requests, check) = {
                let mut l = self.list.lock();
                let Some(e) = l.entries.get_mut(i) else {
                    break;
                };
                let check = e.since.is_some() && e.checked_at.elapsed() >= e.member.check_every();
                if check {
                    e.checked_at = Instant::now();
                }
                (e.member.clone(), e.requests, check)
            };
            let look = member.look(check);
            progress |= look.progress;
            let now = Instant::now();
            let mut l = self.list.lock();
            let Some(pos) = l.entries.iter().position(|e| same(&e.member, &member)) else {
                // Removed meanwhile (a membership ended, or shutdown), maybe with others before
                // it: look at every member again rather than skip one (an extra look is free).
                i = 0;
                continue;
            };
            // PANIC: `pos` was found above, under the same lock.
            let e = &mut l.entries[pos];
            e.record(look, now);
            if !look.busy && !e.permanent && e.requests == requests {
                let _ = l.entries.remove(pos);
                continue;
            }
            if look.busy {
                if let Some(d) = e.due() {
                    next = Some(match next {
                        Some(n) if (d.0 - n.0).as_nanos() >= 0 => n,
                        _ => d,
                    });
                }
            } else if e.requests != requests {
                // Watched again since the look: look again soon.
                next = Some((now, POLL_WINDOW_MIN));
            }
            i = pos + 1;
        }
        (progress, next)
    }

    /// For debugfs: whether the engine is queued or running, and how many members it has.
    pub(crate) fn state(&self) -> (bool, usize) {
        let n = self.list.lock().entries.len();
        (self.running.load(Relaxed) != 0, n)
    }

    /// Unbind, after every queue was paused and the dmaengine channels are idle: drops every
    /// member and waits for the work.
    pub(crate) fn shutdown(&self) {
        let gone = {
            let mut l = self.list.lock();
            l.alive = false;
            core::mem::take(&mut l.entries)
        };
        // The members' last references may be these: dropped without the list lock.
        drop(gone);
        crate::kfac::sched::flush_work(&self.work);
    }
}

impl Member for Channel {
    fn look(&self, check: bool) -> Look {
        let (progress, busy) = self.notify(check);
        Look { progress, busy }
    }

    fn check_every(&self) -> Delta {
        // The period of every wait's engine state reads (`submit.rs`).
        crate::submit::STATE_CHECK_EVERY
    }
}

#[cfg(neuron_udma_kunit)]
#[kunit_tests(neuron_udma_completion)]
mod tests {
    use super::*;
    use kernel::sync::atomic::Acquire;

    /// A member that is busy for its first `busy_for` looks and completes something at each.
    struct Counter {
        looks: Atomic<u32>,
        busy_for: u32,
    }

    impl Member for Counter {
        fn look(&self, _check: bool) -> Look {
            let n = self.looks.fetch_add(1, Full) + 1;
            Look {
                progress: true,
                busy: n < self.busy_for,
            }
        }

        fn check_every(&self) -> Delta {
            Delta::from_secs(1)
        }
    }

    fn counter(busy_for: u32) -> Result<Arc<Counter>> {
        Ok(Arc::new(
            Counter {
                looks: Atomic::new(0),
                busy_for,
            },
            GFP_KERNEL,
        )?)
    }

    /// Waits (at most 2 s) until the engine is idle with `members` members.
    fn settles(c: &Completer, members: usize) -> bool {
        let start = Instant::<Monotonic>::now();
        while start.elapsed() < Delta::from_secs(2) {
            if c.state() == (false, members) {
                return true;
            }
            fsleep(Delta::from_millis(1));
        }
        false
    }

    #[test]
    fn mean_follows_the_time_to_each_completion() -> Result {
        let m: Arc<dyn Member> = counter(1)?;
        let mut e = Entry::new(m, false);
        let t0 = Instant::<Monotonic>::now();
        e.since = Some(t0);
        // No sample yet: due at once, the shortest window.
        assert_eq!(e.due().map(|d| d.1), Some(POLL_WINDOW_MIN));
        let busy = Look {
            progress: true,
            busy: true,
        };
        let t1 = t0 + Delta::from_micros(100);
        e.record(busy, t1);
        assert_eq!(e.mean, 100_000);
        // Due half the mean after the completion; looked at closely for the window.
        let (due, window) = e.due().ok_or(EINVAL)?;
        assert_eq!((due - t1).as_nanos(), 50_000);
        assert_eq!(window, POLL_WINDOW_MIN);
        // The next sample (300 us) moves the mean by an eighth of the difference.
        let t2 = t1 + Delta::from_micros(300);
        e.record(busy, t2);
        assert_eq!(e.mean, 125_000);
        // A slow member is looked at closely for as long as its mean.
        let t3 = t2 + Delta::from_millis(10);
        e.record(busy, t3);
        assert!(e.mean > POLL_WINDOW_MIN.as_nanos());
        assert_eq!(e.due().map(|d| d.1.as_nanos()), Some(e.mean));
        // Idle: nothing is due; busy again: due from then on.
        e.record(
            Look {
                progress: false,
                busy: false,
            },
            t3,
        );
        assert!(e.due().is_none());
        let t4 = t3 + Delta::from_millis(1);
        e.record(
            Look {
                progress: false,
                busy: true,
            },
            t4,
        );
        assert_eq!(e.since.map(|s| (s - t4).as_nanos()), Some(0));
        Ok(())
    }

    #[test]
    fn a_watched_member_is_looked_at_until_idle_then_left() -> Result {
        let c = Completer::new(-1)?;
        let m = counter(5)?;
        Completer::watch(&c, m.clone());
        assert!(settles(&c, 0));
        assert_eq!(m.looks.load(Acquire), 5);
        c.shutdown();
        // After shutdown nothing is watched.
        Completer::watch(&c, counter(3)?);
        assert_eq!(c.state(), (false, 0));
        Ok(())
    }

    #[test]
    fn a_member_stays_until_its_membership_ends() -> Result {
        let c = Completer::new(-1)?;
        let m = counter(3)?;
        let membership = Completer::add(&c, m.clone())?;
        assert_eq!(c.state(), (false, 1));
        Completer::kick(&c);
        assert!(settles(&c, 1));
        assert_eq!(m.looks.load(Acquire), 3);
        // Idle members are looked at again after a kick, and stay.
        Completer::kick(&c);
        assert!(settles(&c, 1));
        assert_eq!(m.looks.load(Acquire), 4);
        drop(membership);
        assert_eq!(c.state(), (false, 0));
        c.shutdown();
        assert_eq!(Completer::add(&c, m).err(), Some(ENODEV));
        Ok(())
    }
}
