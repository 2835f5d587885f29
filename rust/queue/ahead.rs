// SPDX-License-Identifier: GPL-2.0

//! Pairs written ahead: a submission's pairs go into the rings' free slots first ([`Ahead`]),
//! and the queue takes them all at once when nothing failed ([`Queue::publish`]). Until then
//! they are nothing: the rings' state does not count them, no doorbell rings them, and
//! dropping an [`Ahead`] leaves the queue as it was. So a prepare call can check each copy and
//! write its pair in one pass (`Batch::add_all_in_line`), and still write all or nothing.

use super::{Copy, Queue, SubmissionHolds};
use crate::{desc::Desc, holds::Holds, kfac::trace::QueueTrace, ring::RingState};
use kernel::prelude::*;

/// Pairs being written ahead into a queue's free slots ([`Queue::ahead`]).
pub(crate) struct Ahead<'q> {
    q: &'q mut Queue,
    /// The Tx ring's state moved on past the pairs written.
    tx: RingState,
    /// The Rx ring's state, likewise.
    rx: RingState,
    /// Pairs written.
    pairs: u32,
    /// Pairs the rings had room for when this began (the 16-slot reserve kept).
    room: u32,
}

/// What an [`Ahead`] wrote, for [`Queue::publish`].
pub(crate) struct Written {
    tx: RingState,
    rx: RingState,
    /// Pairs.
    pub(crate) pairs: u32,
}

impl Ahead<'_> {
    /// Pairs the rings had room for when this began: what [`Self::write_while`] takes at most.
    pub(crate) fn room(&self) -> u32 {
        self.room
    }

    /// Writes a pair for each of `items` from the first on, as long as `pair` makes one
    /// (`Ok(Some)`): the Rx slot, then the Tx slot of each, in the order the rings hand them out
    /// ([`RingState::take`]), in stretches of slots that wrap neither ring, whose ring ids are
    /// fixed (so the loop holds nothing but `pair` and the stores). Returns how many it wrote:
    /// all, or up to the first for which `pair` made none (`Ok(None)`).
    ///
    /// # Errors
    ///
    /// `pair`'s, `ENOSPC` if the rings have no room left for a pair; what was written before
    /// stays written ahead (all of it goes when the [`Ahead`] is dropped unpublished).
    #[inline(always)]
    pub(crate) fn write_while<T>(
        &mut self,
        items: &[T],
        mut pair: impl FnMut(&T) -> Result<Option<Copy>>,
    ) -> Result<usize> {
        let mut done = 0;
        while done < items.len() {
            // CAST: at most MAX_BATCH items.
            let want = ((items.len() - done) as u32).min(self.room - self.pairs);
            let (tx_id, rx_id) = (self.tx.ring_id(), self.rx.ring_id());
            // The next slots, up to the end of either ring's memory, with their ring ids (no
            // wrap within the stretch).
            let tx = self.q.tx.slots_ahead(&self.tx, want);
            let rx = self.q.rx.slots_ahead(&self.rx, want);
            let n = tx.len().min(rx.len());
            if n == 0 {
                return Err(ENOSPC);
            }
            let todo = &items[done..done + n];
            for (k, ((item, t), r)) in todo.iter().zip(tx).zip(rx).enumerate() {
                let Some(c) = pair(item)? else {
                    // CAST: below `want`.
                    stretch(&mut self.tx, &mut self.rx, &mut self.pairs, k as u32);
                    return Ok(done + k);
                };
                r.set(Desc::rx(c.len, rx_id, false, c.dst));
                t.set(Desc::tx(c.len, tx_id, c.barrier, c.src));
            }
            // CAST: below `want`.
            stretch(&mut self.tx, &mut self.rx, &mut self.pairs, n as u32);
            done += n;
        }
        Ok(done)
    }

    /// The pairs written, for [`Queue::publish`].
    pub(crate) fn done(self) -> Written {
        Written {
            tx: self.tx,
            rx: self.rx,
            pairs: self.pairs,
        }
    }
}

/// Counts `n` pairs written ahead from the next slots on, within a stretch that wraps neither
/// ring: [`RingState::advance`] on both rings' states, and `n` more `pairs`.
#[inline(always)]
fn stretch(tx: &mut RingState, rx: &mut RingState, pairs: &mut u32, n: u32) {
    tx.advance(n);
    rx.advance(n);
    *pairs += n;
}

impl Queue {
    /// Starts writing pairs ahead into the free slots ([`Ahead`]). Nothing may touch the rings'
    /// state before the [`Written`] is published or dropped except a retire, which only acks.
    pub(crate) fn ahead(&mut self) -> Ahead<'_> {
        Ahead {
            tx: *self.tx.state(),
            rx: *self.rx.state(),
            pairs: 0,
            room: self.available_pairs(),
            q: self,
        }
    }

    /// Makes the pairs written ahead (`w`, of `bytes` bytes) the queue's, as one submission
    /// whose buffers `holds` keeps busy until the engine has consumed them (the fence after them
    /// retired) or can no longer reach them. `bytes` is asked for only when the submit
    /// tracepoint is on.
    ///
    /// # Errors
    ///
    /// `ENOMEM` if the holds record cannot be stored; `EINVAL` (and a warning) for a `w` not
    /// written ahead of this queue's rings as they stand ([`crate::ring::Ring::is_ahead`]);
    /// nothing is published then.
    pub(crate) fn publish(
        &mut self,
        w: Written,
        holds: Holds,
        bytes: impl FnOnce() -> u64,
    ) -> Result {
        // Nothing between `ahead` and here moved the rings on (only a retire may run, which
        // acks): a `Written` of anything else would publish slots nobody wrote.
        if kernel::warn_on!(!(self.tx.is_ahead(&w.tx) && self.rx.is_ahead(&w.rx))) {
            return Err(EINVAL);
        }
        if !holds.is_empty() {
            self.holds.reserve(1, GFP_KERNEL_ACCOUNT)?;
        }
        // Cannot fail: checked above.
        let _ = self.tx.publish(&w.tx);
        let _ = self.rx.publish(&w.rx);
        if self.trace().is_some() && QueueTrace::submit_enabled() {
            self.trace_submit(w.pairs, bytes());
        }
        if !holds.is_empty() {
            // Cannot fail: capacity was reserved.
            let _ = self.holds.push_within_capacity(Some(SubmissionHolds {
                end: self.tx_written(),
                holds,
            }));
        }
        Ok(())
    }
}
