// SPDX-License-Identifier: GPL-2.0

//! A queue across a device reset (`device/reset.rs`): stopped under its queue lock once the
//! device's register gate is closed ([`Bar0::begin_reset`]), programmed again once the device
//! is back. The instance, its rings, its buffers' holds and its listeners stay; only the work
//! in flight at the reset is lost (its fences fail with `EIO`).
//!
//! [`Bar0::begin_reset`]: crate::bar0::Bar0::begin_reset

use super::Channel;
use crate::counters::ResetCause;
use kernel::prelude::*;

impl Channel {
    /// Whether a device reset is under way (the register gate is closed): an `EIO` of a call
    /// then says so, not that the queue failed.
    pub(crate) fn resetting(&self) -> bool {
        self.bar.check().is_err()
    }

    /// Stops the queue for a device reset: pauses it while the registers still answer,
    /// retires the fences whose markers landed and fails the rest with `EIO` (a queue reset
    /// counted as [`ResetCause::Device`]); then the listeners hear of the failures (the
    /// eventfd, io_uring commands, pollers). A released queue has nothing to stop.
    pub(crate) fn stop_for_reset(&self) {
        {
            let mut inner = self.inner.lock();
            let Some(q) = (*inner).as_mut() else {
                return;
            };
            // The reset closed the gate before it came here: a submission holding the lock
            // before this one rang its doorbell first, one after it gets `EIO` untouched.
            let regs = self.bar.access_always().ok();
            let io = regs.as_ref().and_then(|r| r.engine(self.id.eng).ok());
            q.halt(io, EIO, ResetCause::Device);
        }
        // Nobody else looks soon at a queue with nothing in flight.
        let _ = self.notify(false);
    }

    /// Programs the queue again after a device reset, its engine's init sequence first if no
    /// other queue's restart ran it (hardware.rst §3.6, §3.7): the rings as the stop left them
    /// (empty, ring id 1), so the next submission starts at slot 0. A released queue has
    /// nothing to program.
    ///
    /// # Errors
    ///
    /// `ENODEV` once the device is unbound, `ERANGE` if BAR0 does not hold the engine (probe
    /// checked that it does).
    pub(crate) fn restart(&self) -> Result {
        let mut inner = self.inner.lock();
        let Some(q) = (*inner).as_mut() else {
            return Ok(());
        };
        self.bar.ensure_engine(self.id.eng)?;
        let regs = self.bar.access_always()?;
        q.hw_init(regs.engine(self.id.eng)?);
        Ok(())
    }
}
