// SPDX-License-Identifier: GPL-2.0

//! The device across a reset: a function-level reset (`reset_prepare`, `reset_done`: sysfs
//! `reset`, VFIO, a bus reset), PCI error recovery (`error_detected`, `resume`) and `shutdown`
//! (`kfac/pci.rs` adds the callbacks to the driver).
//!
//! The stop closes the register gate ([`Bar0::begin_reset`]) under the state lock, so no queue
//! is created past it, then stops every queue in use under its queue lock
//! ([`Channel::stop_for_reset`]): the work in flight fails with `EIO`, and every call that
//! would touch the engines gets `EIO` until the restart. The restart programs the engines and
//! the queues again ([`Channel::restart`]) and opens the gate. Files keep their queues, buffers
//! and mappings across it; device memory keeps what it held only if the reset kept it (the
//! model's does; nothing here relies on it).
//!
//! [`Bar0::begin_reset`]: crate::bar0::Bar0::begin_reset
//! [`Channel::stop_for_reset`]: crate::channel::Channel::stop_for_reset
//! [`Channel::restart`]: crate::channel::Channel::restart

use super::UdmaDevice;
use crate::{
    channel::Owner,
    kfac::{
        pci::{RawStop, Stop},
        trace,
    },
    Registry,
};
use kernel::{prelude::*, sync::Arc};

impl UdmaDevice {
    /// Stops the device for `why`: every queue in use is stopped and its fences in flight fail
    /// with `EIO`; from now until [`Self::restart`] every call that would touch the engines
    /// (submissions, doorbells, `QUEUE_INIT`) fails with `EIO`, and waiters wait for the stop
    /// to settle their fences instead of reading the engine state. After [`Stop::Shutdown`]
    /// nothing restarts the device. Nothing happens after unbind.
    pub(crate) fn stop(&self, why: Stop) {
        {
            let st = self.state.lock();
            if !st.alive {
                return;
            }
            // A `QUEUE_INIT` checks the gate under this lock: its queue exists now and is
            // stopped below, or it fails.
            self.bar.begin_reset(why);
        }
        if why != Stop::Shutdown {
            self.counters.add_device_reset();
        }
        // The driver's queues first: a file's doorbell that waits, under its queue lock, for
        // the H2T queue to move descriptors into device memory then sees that move fail and
        // lets its lock go, which the file's queue's stop takes next.
        let mut stopped = 0u32;
        for driver in [true, false] {
            for key in 0..self.queue_keys() {
                let chan = self.queues.lock().get(key).map(Arc::from);
                if let Some(c) = chan.filter(|c| (c.owner == Owner::Driver) == driver) {
                    c.stop_for_reset();
                    stopped += 1;
                }
            }
        }
        trace::device_reset(&self.pdev, why.name(), stopped, &Ok(()));
        dev_warn!(
            self.pdev.as_ref(),
            "{}: {} queues stopped, their work in flight failed (EIO)\n",
            why.name().to_str().unwrap_or("stop"),
            stopped
        );
    }

    /// Ends the stop of kind `why` ([`Stop::Reset`]: `reset_done`; [`Stop::Error`]: `resume`)
    /// and, if no other stop is left (a function-level reset may come inside PCI error
    /// recovery), starts the device again: runs the init sequence of the engines in use and
    /// programs every queue in use (empty rings, ring id 1), then accepts work again. Nothing
    /// happens after unbind, nor for a stop that was not begun (logged).
    ///
    /// # Errors
    ///
    /// `ENODEV` if the registers are gone; the device then stays stopped (every call that
    /// would touch the engines fails with `EIO`; a later reset may start it again).
    pub(crate) fn restart(&self, why: Stop) -> Result {
        // Under the state lock: no queue is created or released meanwhile.
        let st = self.state.lock();
        if !st.alive {
            return Ok(());
        }
        let mut n = 0u32;
        let programme = || {
            for key in 0..self.queue_keys() {
                let chan = self.queues.lock().get(key).map(Arc::from);
                if let Some(c) = chan {
                    c.restart()?;
                    n += 1;
                }
            }
            Ok(())
        };
        let ended = self.bar.end_reset(why, programme);
        drop(st);
        let Some(r) = ended else {
            dev_warn!(
                self.pdev.as_ref(),
                "{}: no such stop under way; nothing restarted\n",
                why.name().to_str().unwrap_or("stop")
            );
            return Ok(());
        };
        let r = match r {
            Ok(true) => Ok(()),
            Ok(false) => {
                dev_info!(self.pdev.as_ref(), "still stopped for another reset\n");
                return Ok(());
            }
            Err(e) => Err(e),
        };
        trace::device_reset(&self.pdev, c"restart", n, &r);
        match &r {
            Ok(()) => dev_info!(self.pdev.as_ref(), "restarted, {} queues programmed\n", n),
            Err(e) => dev_err!(self.pdev.as_ref(), "restart failed: {:?}\n", e),
        }
        r
    }
}

/// The PCI core's `reset_prepare`, `error_detected` or `shutdown` of `dev` (C in
/// `rust/kfac/pci.c`): stops its device ([`UdmaDevice::stop`]).
///
/// # Safety
///
/// `dev` is the `struct device` of a PCI device this driver is bound to, valid for the call.
#[no_mangle]
pub(crate) unsafe extern "C" fn neuron_udma_pci_stop(
    dev: *mut kernel::bindings::device,
    why: RawStop,
) {
    if let Some(d) = Registry::by_device(dev) {
        d.stop(Stop::from_raw(why));
    }
}

/// The PCI core's `reset_done` (`why`: reset) or `resume` (error) of `dev` (C in
/// `rust/kfac/pci.c`): ends that stop and starts its device again ([`UdmaDevice::restart`]); 0 or
/// a negative errno.
///
/// # Safety
///
/// `dev` is the `struct device` of a PCI device this driver is bound to, valid for the call.
#[no_mangle]
pub(crate) unsafe extern "C" fn neuron_udma_pci_restart(
    dev: *mut kernel::bindings::device,
    why: RawStop,
) -> kernel::ffi::c_int {
    match Registry::by_device(dev) {
        Some(d) => d
            .restart(Stop::from_raw(why))
            .map_or_else(|e| e.to_errno(), |()| 0),
        None => 0,
    }
}
