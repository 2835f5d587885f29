// SPDX-License-Identifier: GPL-2.0

//! A user's prepare call on a queue instance (`file/queues.rs`, `prepare_on`): its pairs
//! checked in one pass and written ahead ([`Channel::prepare_in_line`]), or translated first and
//! written after ([`Channel::prepare`], [`Channel::prepare_fenced`]), under the queue lock, with
//! the checks of the queue's state that come after those of the copies ([`Channel::usable`]).

use super::{Channel, Ringer, Wait, NONBLOCK_SPIN};
use crate::{
    holds::Holds,
    kfac::sched,
    queue::{self, Ahead, Queue},
    submit::{self, Door},
};
use kernel::{prelude::*, sync::MutexGuard};

impl Channel {
    /// Writes the pairs `copies` of one prepare call, all or none, with `holds` keeping their
    /// buffers busy until the engine is done with them; the largest copy among them took
    /// `largest` pairs.
    ///
    /// # Errors
    ///
    /// `E2BIG` if that copy takes more pairs than the queue's empty rings hold (it can never
    /// fit: not "wait first"), `ENOSPC` if the rings have no room for all of them now (after
    /// retiring what completed), `ENOMEM`, `ENODEV`, `EIO` while the device is reset (the
    /// reset's stop would drop them); nothing is written then.
    pub(crate) fn prepare(&self, copies: &[queue::Copy], largest: u32, holds: Holds) -> Result {
        self.locked(|q| {
            self.usable(q)?;
            submit::prepare(q, copies, largest, holds)
        })
    }

    /// Writes the pairs `copies` of one prepare call as [`Self::prepare`] does, then a fence
    /// after everything prepared, and rings the doorbells, all under one hold of the queue lock:
    /// the io_uring copy, which must not leave its pairs prepared when no fence can follow them
    /// (another thread of the file may have taken the last fence slot since it looked).
    /// Returns the fence.
    ///
    /// # Errors
    ///
    /// `EBUSY` ([`queue::FENCE_SLOTS`] fences in flight), those of [`Self::prepare`] (`EIO`
    /// while the device is reset), and of the doorbell (`ENODEV`, or an error moving a device
    /// ring's descriptors); nothing is written then ([`Queue::all_or_nothing`]).
    ///
    /// With [`Wait::Never`] (io_uring's non-blocking issue), `EAGAIN` instead of sleeping: the
    /// queue lock is held by another thread, or the doorbell would wait for the H2T queue to
    /// move the descriptors of rings in device memory; nothing is written then either.
    pub(crate) fn prepare_fenced(
        &self,
        copies: &[queue::Copy],
        largest: u32,
        holds: Holds,
        wait: Wait,
    ) -> Result<u64> {
        let mut inner = self.lock_for(wait)?;
        let q = (*inner).as_mut().ok_or_else(|| self.gone_error())?;
        self.usable(q)?;
        submit::prepare_fenced(q, Ringer(self), copies, largest, holds)
    }

    /// The queue lock for a fenced prepare that waits as `wait` says.
    ///
    /// # Errors
    ///
    /// `EAGAIN` with [`Wait::Never`] when it would sleep: the lock is held by another thread
    /// past [`NONBLOCK_SPIN`], or the rings are in device memory (the doorbell waits for the
    /// H2T queue to move them).
    fn lock_for(&self, wait: Wait) -> Result<MutexGuard<'_, Option<Queue>>> {
        match wait {
            Wait::Block => Ok(self.inner.lock()),
            Wait::Never if self.mover.is_some() => Err(EAGAIN),
            // A holder that runs lets go within microseconds (the completion engine's look,
            // another prepare); one that sleeps (a reset, a device-ring move) keeps it longer:
            // `EAGAIN` then.
            Wait::Never => sched::lock_within(&self.inner, NONBLOCK_SPIN),
        }
    }

    /// A prepare call of `pairs` pairs in one pass, under one hold of the queue lock: `fill`
    /// checks each copy and writes its pair ahead into the rings' free slots ([`Ahead`]), then
    /// returns the call's holds and bytes; the pairs are published only after the checks that
    /// [`Self::prepare`] (`fenced` `None`) or [`Self::prepare_fenced`] make once their copies
    /// are translated, in their order, and [`submit::publish`] or [`submit::publish_fenced`].
    /// So the call answers as the two-pass way would, without an array of its pairs.
    ///
    /// `fill` returns `None` when a copy needs what it cannot do under this lock (a lookup of a
    /// buffer not resident on the queue, an import) or there are more copies than free pairs
    /// (the two-pass way answers `ENOSPC` after its checks); `None` is returned too when the
    /// queue is gone or the device is being reset (the two-pass way answers those after its
    /// checks of the copies). Nothing is published then, and the caller goes the two-pass way.
    /// Else the fence (with `fenced`, else 0) and the pairs published.
    ///
    /// # Errors
    ///
    /// `fill`'s, `EAGAIN` as [`Self::lock_for`] says (before `fill`: io_uring then issues the
    /// command again, blocking), those of [`Self::usable`], of [`submit::publish`] and of
    /// [`submit::publish_fenced`]; nothing is published then.
    pub(crate) fn prepare_in_line(
        &self,
        fenced: Option<Wait>,
        pairs: usize,
        fill: impl FnOnce(&mut Ahead<'_>) -> Result<Option<(Holds, u64)>>,
    ) -> Result<Option<(u64, u32)>> {
        let mut inner = self.lock_for(fenced.unwrap_or(Wait::Block))?;
        let Some(q) = (*inner).as_mut() else {
            return Ok(None);
        };
        if self.bar.check().is_err() {
            return Ok(None);
        }
        // Too little room for `pairs`: what completed is retired first (it only acks, and
        // changes no answer the checks below give), so that a full-looking ring does not send
        // the call the two-pass way. Not otherwise: a call that fails changes nothing.
        if (q.available_pairs() as usize) < pairs {
            q.retire();
        }
        let mut ahead = q.ahead();
        let Some((holds, bytes)) = fill(&mut ahead)? else {
            return Ok(None);
        };
        let written = ahead.done();
        let n = written.pairs;
        self.usable(q)?;
        let seq = match fenced {
            None => submit::publish(q, written, holds, bytes).map(|()| 0),
            Some(_) => submit::publish_fenced(q, Ringer(self), written, holds, bytes),
        }?;
        Ok(Some((seq, n)))
    }

    /// Whether the user's submission calls may go on: `EIO` while the device is reset, and
    /// once after a reset dropped prepared or started work no fence covered
    /// ([`Queue::take_lost`]). Under the queue lock, before anything changes.
    fn usable(&self, q: &mut Queue) -> Result {
        self.bar.check()?;
        q.take_lost()
    }
}
