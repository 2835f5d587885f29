// SPDX-License-Identifier: GPL-2.0
//! Fault injection requests and statistics counters.
//!
//! Faults are requested through the control socket (`control.rs`) or the
//! in-band BAR2 window; both end up as a [`Fault`] applied by
//! [`crate::Device::inject`].

/// A fault to inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Fail the `n`-th next Tx descriptor consumed on (`engine`, `queue`)
    /// (n = 1: the very next one) with a data-read bad-address error (M2S cause bit 8).
    FailNth {
        /// Engine id.
        engine: u32,
        /// Queue id (0-15).
        queue: u32,
        /// 1-based descriptor count.
        n: u32,
    },
    /// Abort `engine` (state fields -> 2) as if an error had occurred (no cause bit).
    Abort {
        /// Engine id.
        engine: u32,
    },
    /// Do not process (`engine`, `queue`) for `ms` milliseconds from now.
    Stall {
        /// Engine id.
        engine: u32,
        /// Queue id (0-15).
        queue: u32,
        /// Milliseconds.
        ms: u32,
    },
    /// Slow every engine down: each packet's completion is delayed by
    /// (factor - 1) x max(bytes at 4 GB/s, 20 us), a nominal time (not the measured copy time,
    /// which a host hiccup would multiply). 0 and 1 switch it off.
    Slow {
        /// Slow-down factor.
        factor: u32,
    },
}

/// Per-engine statistics (all monotonic until cleared).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct CounterValues {
    /// Descriptors consumed (Tx + Rx).
    pub descriptors: u64,
    /// Packets completed.
    pub packets: u64,
    /// Payload bytes copied.
    pub bytes: u64,
    /// Errors raised.
    pub errors: u64,
}

impl CounterValues {
    /// Field-wise sum.
    pub fn sum(self, o: CounterValues) -> CounterValues {
        CounterValues {
            descriptors: self.descriptors + o.descriptors,
            packets: self.packets + o.packets,
            bytes: self.bytes + o.bytes,
            errors: self.errors + o.errors,
        }
    }
}
