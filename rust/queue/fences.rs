// SPDX-License-Identifier: GPL-2.0

//! What became of a queue's fences: the fence numbers in flight and settled, the outcome of
//! each ([`FenceState`]: done, dropped by a reset and why, or too old to know), and the work no
//! fence covers yet. Read under the queue lock, after retiring what completed.

use super::Queue;
use kernel::prelude::*;

/// What became of a fence ([`Queue::state`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FenceState {
    /// Still in flight.
    Pending,
    /// The marker arrived: every descriptor before it completed.
    Done,
    /// Dropped by a queue reset before its marker arrived (the copies before it may not have
    /// run), for this reason: `EIO` (an engine error), `ETIMEDOUT` (the queue made no progress),
    /// `ECANCELED` (the queue was paused: released or unbound).
    Failed(Error),
    /// Older than the failures the queue remembers ([`LOST_RANGES`](super::LOST_RANGES)): it may have failed.
    Expired,
}

impl Queue {
    /// The newest fence of the queue (0 before its first).
    pub(crate) fn newest_fence(&self) -> u64 {
        if self.next_seq == self.first_seq {
            0
        } else {
            self.next_seq - 1
        }
    }

    /// The number the queue's next fence will take: where a later instance of the same queue
    /// id of the same file goes on ([`Self::new`]'s `first_seq`).
    pub(crate) fn next_fence(&self) -> u64 {
        self.next_seq
    }

    /// The Tx position after the newest fence in flight (where its covered work ends), or
    /// `None` when no fence is in flight.
    pub(crate) fn newest_fence_end(&self) -> Option<u32> {
        self.fences.last().map(|f| f.tx_end)
    }

    /// The newest fence known done (0 before the first), and the newest that failed with its
    /// reason, if any (for the queue's events).
    pub(crate) fn outcomes(&self) -> (u64, Option<(u64, Error)>) {
        (self.done, self.lost.last().map(|r| (r.last, r.why)))
    }

    /// Every fence up to this one is settled (done or failed).
    pub(crate) fn settled(&self) -> u64 {
        self.settled
    }

    /// Whether fences are in flight.
    pub(crate) fn busy(&self) -> bool {
        !self.fences.is_empty()
    }

    /// Tx descriptors prepared or started after the newest fence (or, without a fence in
    /// flight, not yet acked): work that no fence covers yet.
    pub(crate) fn unfenced(&self) -> u32 {
        let from = self
            .fences
            .last()
            .map_or(self.tx.state().ack_index(), |f| f.tx_end);
        self.tx
            .state()
            .size()
            .distance(from, self.tx.state().next_index())
    }

    /// The state of fence `seq` (after retiring what completed).
    ///
    /// # Errors
    ///
    /// `EINVAL` for fence 0 or one newer than [`Self::newest_fence`], `ECANCELED` for a fence
    /// of an earlier instance of the queue id (below [`Self::new`]'s `first_seq`).
    pub(crate) fn state(&mut self, seq: u64) -> Result<FenceState> {
        self.check_seq(seq)?;
        self.retire();
        Ok(self.state_now(seq))
    }

    /// The state of fence `seq` as of the last [`Self::retire`], without looking at the markers
    /// again: a caller that goes over several fences and then asks [`Self::busy`] sees them all
    /// at one moment (a marker that arrives meanwhile is seen at the next retire).
    ///
    /// # Errors
    ///
    /// As [`Self::state`].
    pub(crate) fn state_retired(&self, seq: u64) -> Result<FenceState> {
        self.check_seq(seq)?;
        Ok(self.state_now(seq))
    }

    /// Whether `seq` names a fence of this queue instance.
    ///
    /// # Errors
    ///
    /// `EINVAL` for fence 0 or one newer than [`Self::newest_fence`], `ECANCELED` for a fence
    /// of an earlier instance of the queue id.
    fn check_seq(&self, seq: u64) -> Result {
        if seq == 0 || seq >= self.next_seq {
            Err(EINVAL)
        } else if seq < self.first_seq {
            Err(ECANCELED)
        } else {
            Ok(())
        }
    }

    /// The state of fence `seq` (a fence of this queue) as the software state says now.
    fn state_now(&self, seq: u64) -> FenceState {
        if seq > self.settled {
            return FenceState::Pending;
        }
        if let Some(r) = self.lost.iter().find(|r| (r.first..=r.last).contains(&seq)) {
            return FenceState::Failed(r.why);
        }
        if seq < self.expired_below {
            FenceState::Expired
        } else {
            FenceState::Done
        }
    }

    /// Records fences `first..=last`, the newest so far, as dropped for `why` (each then reads
    /// [`FenceState::Failed`]); the oldest record is forgotten when [`LOST_RANGES`] are kept
    /// (its fences then read [`FenceState::Expired`]).
    ///
    /// [`LOST_RANGES`]: super::LOST_RANGES
    pub(super) fn record_lost(&mut self, first: u64, last: u64, why: Error) {
        if let Some(o) = &self.obs {
            o.fences_dropped(first, last, why);
        }
        self.settled = last;
        // The fence after the newest record, for the same reason (the work a reset dropped
        // after its fences): one record.
        if let Some(r) = self
            .lost
            .last_mut()
            .filter(|r| r.last + 1 == first && r.why == why)
        {
            r.last = last;
            return;
        }
        if self.lost.len() == super::LOST_RANGES {
            // PANIC: the list is full, so not empty.
            self.expired_below = self.lost[0].last + 1;
            let _ = self.lost.remove(0);
        }
        // Cannot fail: the capacity is LOST_RANGES, and one entry was removed if full.
        let _ = self
            .lost
            .push_within_capacity(super::LostRange { first, last, why });
    }

    /// Fails the work no fence covered when a device reset emptied the rings (prepared, or
    /// started without a fence) as one more fence, numbered next and failed with `why` (what
    /// `FENCE_STATUS` of the newest fence and the queue's events then say), and has the next
    /// submission call report it ([`Self::take_lost`]): otherwise a `COPY_WAIT`, with nothing
    /// left to fence, or a fence of later work would answer success for work that never ran.
    /// Called once the fences in flight are settled, so the fences stay
    /// `settled + 1 .. next_seq`.
    pub(super) fn fail_unfenced(&mut self, why: Error) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.fences_failed += 1;
        self.record_lost(seq, seq, why);
        self.lost_unfenced = Some(why);
    }

    /// The reset's reason (`EIO`), once, if a device reset dropped work no fence covered since
    /// the last call ([`Self::fail_unfenced`]): the user's submission calls (prepare, start,
    /// submit, wait) ask first, so the first of them after the reset fails with it and changes
    /// nothing.
    pub(crate) fn take_lost(&mut self) -> Result {
        match self.lost_unfenced.take() {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Whether fence `seq` is no longer in flight (its marker arrived or a reset dropped it).
    pub(crate) fn is_settled(&mut self, seq: u64) -> bool {
        self.retire();
        seq <= self.settled
    }
}
