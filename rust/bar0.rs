// SPDX-License-Identifier: GPL-2.0

//! BAR0 of a bound device: access to the engines' register blocks, the engine bring-up
//! (hardware.rst §3.6, once per engine since probe or the last device reset), the gate that
//! keeps every queue off the registers while the device is reset (`device/reset.rs`), and the
//! rate limit of the messages that engine errors print.
//!
//! Shared (reference counted) by the device and each of its queue channels, so that a channel
//! reaches its engine's registers without knowing the device.

use crate::{
    arch::Arch,
    engine::{self, EngineId, EngineIo},
    kfac::pci::Stop,
};
use kernel::{
    devres::DevresGuard,
    new_mutex, pci,
    prelude::*,
    sync::{
        aref::ARef,
        atomic::{Acquire, Atomic, Relaxed, Release},
        Mutex,
    },
    time::{Delta, Instant, Monotonic},
};

/// Error messages per [`LOG_WINDOW`]; the rest are dropped.
const LOG_BURST: u32 = 10;
/// Rate-limit window of the error messages.
const LOG_WINDOW: Delta = Delta::from_secs(5);

/// Keeps error messages that user space can provoke from flooding the log.
pub(crate) struct RateLimit {
    epoch: Instant<Monotonic>,
    /// Start of the current window, in milliseconds since `epoch`.
    window_start: Atomic<i64>,
    printed: Atomic<u32>,
}

impl RateLimit {
    fn new() -> Self {
        Self {
            epoch: Instant::<Monotonic>::now(),
            window_start: Atomic::new(0),
            printed: Atomic::new(0),
        }
    }

    /// Whether one more message may be printed now (races only blur the count).
    pub(crate) fn allow(&self) -> bool {
        let ms = self.epoch.elapsed().as_millis();
        let start = self.window_start.load(Relaxed);
        if ms - start >= LOG_WINDOW.as_millis() {
            self.window_start.store(ms, Relaxed);
            self.printed.store(0, Relaxed);
        }
        self.printed.fetch_add(1, Relaxed) < LOG_BURST
    }
}

/// The register BAR of one bound device.
#[pin_data]
pub(crate) struct Bar0 {
    /// The PCI device (for messages).
    pub(crate) pdev: ARef<pci::Device>,
    /// Per-generation data.
    pub(crate) arch: &'static Arch,
    /// The mapping, revoked by devres at unbind.
    bar: pci::DevresBar,
    /// Engines whose init sequence ran since probe or the last device reset (bit per engine id).
    #[pin]
    engines_init: Mutex<[u64; 3]>,
    /// Why the register gate is closed (`device/reset.rs`): no queue touches the registers
    /// while any is. Changed under the device's state lock.
    #[pin]
    stops: Mutex<Stops>,
    /// Non-zero while [`Self::stops`] has any: the lock-free check of every submission.
    closed: Atomic<u32>,
    /// Rate limit of the engine error messages of every queue of the device.
    pub(crate) log_limit: RateLimit,
}

impl Bar0 {
    /// Wraps the mapped BAR0 of `pdev`.
    pub(crate) fn new(
        pdev: ARef<pci::Device>,
        arch: &'static Arch,
        bar: pci::DevresBar,
    ) -> impl PinInit<Self, Error> {
        try_pin_init!(Self {
            pdev,
            arch,
            bar,
            engines_init <- new_mutex!([0; 3]),
            stops <- new_mutex!(Stops::default()),
            closed: Atomic::new(0),
            log_limit: RateLimit::new(),
        })
    }

    /// Access to the registers until the returned guard is dropped: an RCU read-side section
    /// (nothing may sleep while it is held).
    ///
    /// # Errors
    ///
    /// `EIO` while the device is reset ([`Self::begin_reset`]), `ENODEV` once the device is
    /// unbound (the mapping is revoked).
    pub(crate) fn access(&self) -> Result<Regs<'_>> {
        self.check()?;
        self.access_always()
    }

    /// [`Self::access`] also while the device is reset: for the reset itself, for a queue path
    /// that passed [`Self::check`] under its queue lock (a reset stops each queue under that
    /// lock after it closed the gate, so the path's register accesses come before the reset's),
    /// and for a pause (harmless at any time).
    ///
    /// # Errors
    ///
    /// `ENODEV` once the device is unbound (the mapping is revoked).
    pub(crate) fn access_always(&self) -> Result<Regs<'_>> {
        Ok(Regs {
            bar: self.bar.try_access().ok_or(ENODEV)?,
            arch: self.arch,
        })
    }

    /// Whether the engines may be used: `EIO` while the device is stopped (from
    /// [`Self::begin_reset`] until no stop is left, [`Self::end_reset`]).
    pub(crate) fn check(&self) -> Result {
        if self.closed.load(Acquire) != 0 {
            return Err(EIO);
        }
        Ok(())
    }

    /// Closes the gate for a device stop of kind `why`: [`Self::check`] and [`Self::access`]
    /// fail with `EIO` until no stop is left, and every engine runs its init sequence again
    /// before its next use. The caller then stops every queue under its queue lock. Called
    /// under the device's state lock.
    pub(crate) fn begin_reset(&self, why: Stop) {
        let mut s = self.stops.lock();
        match why {
            Stop::Reset => s.resets += 1,
            Stop::Error => s.error = true,
            Stop::Shutdown => s.shutdown = true,
        }
        // Ordered before the queue locks the caller takes next: a path that takes one after
        // them sees the gate closed.
        self.closed.store(1, Release);
        *self.engines_init.lock() = [0; 3];
    }

    /// Ends the stop of kind `why` (`Reset`: the PCI core's `reset_done`, which always follows a
    /// `reset_prepare`; `Error`: `resume`, which may never come after `error_detected`, so that
    /// kind is a flag, not a count). `f` runs before the gate opens, and only if this ends the
    /// last stop left: it programs the queues again; its error keeps the gate closed (and
    /// this stop pending). Returns `None` when no such stop was pending (nothing changes),
    /// else whether `f` ran and its outcome. Called under the device's state lock.
    pub(crate) fn end_reset(&self, why: Stop, f: impl FnOnce() -> Result) -> Option<Result<bool>> {
        let mut s = self.stops.lock();
        let mut left = *s;
        match why {
            Stop::Reset if left.resets > 0 => left.resets -= 1,
            Stop::Error if left.error => left.error = false,
            _ => return None,
        }
        if left.any() {
            *s = left;
            return Some(Ok(false));
        }
        if let Err(e) = f() {
            return Some(Err(e));
        }
        *s = left;
        self.closed.store(0, Release);
        Some(Ok(true))
    }

    /// Runs the engine init sequence (hardware.rst §3.6) on engine `id` unless it ran since
    /// probe or the last device reset; also while the device is reset, for the reset's own
    /// re-initialisation (the caller holds a queue lock or the device's state lock, under which
    /// [`Self::check`] was passed or the reset runs).
    ///
    /// # Errors
    ///
    /// `ENODEV` once the device is unbound, `ERANGE` if BAR0 does not hold the engine.
    pub(crate) fn ensure_engine(&self, id: EngineId) -> Result {
        let mut init = self.engines_init.lock();
        let eng = id.get();
        let (word, bit) = ((eng / 64) as usize, eng % 64);
        let first = init.iter().all(|w| *w == 0);
        if init.get(word).ok_or(EINVAL)? & (1 << bit) != 0 {
            return Ok(());
        }
        {
            let bar = self.bar.try_access().ok_or(ENODEV)?;
            engine::init_engine(self.arch, &bar, id, first)?;
        }
        init[word] |= 1 << bit;
        Ok(())
    }
}

/// The device stops not ended yet ([`Bar0::begin_reset`]).
#[derive(Clone, Copy, Default)]
struct Stops {
    /// Function-level resets begun (`reset_prepare`) and not done.
    resets: u32,
    /// PCI error recovery begun (`error_detected`) and not resumed.
    error: bool,
    /// The system shuts down: nothing ends it.
    shutdown: bool,
}

impl Stops {
    fn any(&self) -> bool {
        self.resets != 0 || self.error || self.shutdown
    }
}

/// The registers of a bound device, accessible while this guard lives (an RCU read-side
/// section: the holder must not sleep).
pub(crate) struct Regs<'a> {
    bar: DevresGuard<'a, pci::Bar<'static>>,
    arch: &'static Arch,
}

impl Regs<'_> {
    /// Engine `id`'s register block.
    ///
    /// # Errors
    ///
    /// `ERANGE` if BAR0 does not hold the engine (probe checked that it holds every one).
    pub(crate) fn engine(&self, id: EngineId) -> Result<EngineIo<'_>> {
        engine::engine_io(self.arch, &self.bar, id)
    }
}
