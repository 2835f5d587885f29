// SPDX-License-Identifier: GPL-2.0

//! KUnit suite of the device across a reset (`device/reset.rs`) on the bound device (the device
//! model in QEMU): the stop fails the work in flight with `EIO` and keeps every engine call
//! out until the restart; the PCI error recovery of a frozen link, as the AER core drives it
//! (the model resets the device), leaves every queue usable with its fences numbered on.

use super::{copied, device, test_queue, Fixture};
use crate::{
    channel::{FenceState, DEFAULT_TIMEOUT},
    desc::{Barrier, DescLen},
    holds::Holds,
    kfac::pci::{self, Stop},
    queue::Copy,
};
use kernel::prelude::*;

#[kunit_tests(neuron_udma_reset)]
mod tests {
    use super::*;

    /// Between the stop and the restart every call that touches the engine gets `EIO` and
    /// changes nothing; a fence done before the stop stays done, and a pair prepared but not
    /// fenced fails as the next fence, which the first submission call after the restart
    /// reports (`EIO`, once: not the older fence's success); then the same queue copies again,
    /// its fences numbered on.
    #[test]
    fn stop_gates_the_engines_until_restart() -> Result {
        let f = Fixture::new(2, 64, 8192, 0x71)?;
        let (dev, q) = (&f.dev, &f.q);
        let first = f.fenced_copy(0)?;
        assert_eq!(q.wait_fence(first, DEFAULT_TIMEOUT), Ok(()));
        let unfenced = Copy {
            src: f.s,
            dst: f.d,
            len: DescLen::new(4096)?,
            barrier: Barrier::Write,
        };
        q.with(|queue, _| queue.prepare_one(&unfenced))?;
        dev.stop(Stop::Reset);
        // Looked at with plain comparisons, asserted after the restart: a failed assertion ends
        // the test at once and would leave the device stopped for every later suite.
        let gated = [
            f.fenced_copy(4096).err() == Some(EIO),
            q.submit_fence().err() == Some(EIO),
            q.prepare(&[unfenced], 1, Holds::default()).err() == Some(EIO),
            test_queue(dev, 3, 64).err() == Some(EIO),
            q.state(first) == Ok(FenceState::Done),
            q.state(first + 1) == Ok(FenceState::Failed(EIO)),
            q.wait_all(DEFAULT_TIMEOUT).err() == Some(EIO),
        ];
        dev.restart(Stop::Reset)?;
        assert_eq!(gated, [true; 7]);
        // A restart of a stop that was not begun changes nothing.
        dev.restart(Stop::Reset)?;
        // The first submission call after the restart reports the dropped pair, once.
        assert_eq!(q.submit_fence().err(), Some(EIO));
        assert_eq!(q.submit_fence(), Ok(first + 1));
        let second = f.fenced_copy(4096)?;
        assert_eq!(second, first + 2);
        assert_eq!(q.wait_fence(second, DEFAULT_TIMEOUT), Ok(()));
        assert!(copied(&f.dst, 0, 0, 8192, 0x71));
        Ok(())
    }

    /// PCI error recovery with a fence in flight on a stalled queue: the fence fails with
    /// `EIO` (counted as a device reset), the device is reset, and afterwards the same queue
    /// copies byte-exact and the driver's own H2T queue works.
    #[test]
    fn error_recovery_fails_in_flight_and_restarts() -> Result {
        let f = Fixture::new(2, 64, 8192, 0x72)?;
        let (dev, q) = (&f.dev, &f.q);
        let model = dev.model.as_ref().ok_or(ENODEV)?;
        let resets = dev.counters.device_resets();
        // The reset ends the stall (the model returns to power-on state).
        model.inject_stall(q.id.eng.get(), q.id.q.number(), 60_000)?;
        let stuck = f.fenced_copy(0)?;
        // Neither in `with_bound` nor in an `enter` section: the callbacks take the state lock,
        // and an unbind (under the device lock) waits for the sections.
        pci::recover_frozen(&dev.pdev)?;
        assert_eq!(q.state(stuck), Ok(FenceState::Failed(EIO)));
        assert_eq!(q.wait_fence(stuck, DEFAULT_TIMEOUT), Err(EIO));
        assert_eq!(dev.counters.device_resets(), resets + 1);
        let next = f.fenced_copy(4096)?;
        assert_eq!(next, stuck + 1);
        assert_eq!(q.wait_fence(next, DEFAULT_TIMEOUT), Ok(()));
        assert!(copied(&f.dst, 4096, 4096, 4096, 0x72));
        // The driver's own queue (scrubs, MEMCPY) was programmed again too.
        let g = Fixture::new(3, 64, 8192, 0x73)?;
        drop(f);
        assert!(g.recopy(8192, |s, d, n| device()?.memcpy(s, d, n, DEFAULT_TIMEOUT))?);
        Ok(())
    }
}
