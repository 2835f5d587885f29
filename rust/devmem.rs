// SPDX-License-Identifier: GPL-2.0

//! Device memory (HBM) as the CPU reaches it: BAR4, the device-memory BAR (hardware.rst §1.2),
//! mapped at probe and revoked at unbind. The driver hands out device memory from HBM0 only,
//! whose device-fabric addresses equal their BAR4 offsets (hardware.rst §1.3), so a device address
//! of an allocation is its offset in this window.
//!
//! Users: a queue whose rings are in device memory (`devring.rs`) writes its descriptors and
//! completion slots, and polls its completion markers, through this window.

use kernel::{
    devres::DevresGuard,
    io::{Io, IoBackend, IoBase, Mmio, MmioBackend},
    pci,
    prelude::*,
    transmute::{AsBytes, FromBytes},
};

/// Bytes written at once when a range is scrubbed ([`DevMemIo::zero`]).
const ZERO_CHUNK: usize = 512;
/// The source of those writes.
static ZEROS: [u8; ZERO_CHUNK] = [0; ZERO_CHUNK];

/// The device-memory BAR of a bound device (BAR4), revoked by devres at unbind.
pub(crate) struct DevMem {
    bar: pci::DevresBar,
}

impl DevMem {
    /// Wraps the mapped BAR4.
    pub(crate) fn new(bar: pci::DevresBar) -> Self {
        Self { bar }
    }

    /// Access to device memory until the returned guard is dropped: an RCU read-side section
    /// (nothing may sleep while it is held).
    ///
    /// # Errors
    ///
    /// `ENODEV` once the device is unbound (the mapping is revoked).
    pub(crate) fn access(&self) -> Result<DevMemIo<'_>> {
        Ok(DevMemIo {
            bar: self.bar.try_access().ok_or(ENODEV)?,
        })
    }
}

/// Device memory of a bound device, accessible while this guard lives (an RCU read-side
/// section: the holder must not sleep).
pub(crate) struct DevMemIo<'a> {
    bar: DevresGuard<'a, pci::Bar<'static>>,
}

impl DevMemIo<'_> {
    /// An I/O view of the `n` values of `T` at device address `addr` (typed: descriptors,
    /// completion slots, bytes).
    ///
    /// # Errors
    ///
    /// `ERANGE` if the range does not lie inside BAR4 or is not aligned for `T`.
    pub(crate) fn slice<T: AsBytes + FromBytes>(
        &self,
        addr: u64,
        n: usize,
    ) -> Result<Mmio<'_, [T]>> {
        let bar: &pci::Bar<'_> = &self.bar;
        let off = usize::try_from(addr).map_err(|_| ERANGE)?;
        let len = n.checked_mul(core::mem::size_of::<T>()).ok_or(ERANGE)?;
        let end = off.checked_add(len).ok_or(ERANGE)?;
        if end > bar.size() || off % core::mem::align_of::<T>() != 0 {
            return Err(ERANGE);
        }
        let view = bar.as_view();
        let whole = MmioBackend::as_ptr(view);
        let sub = core::ptr::slice_from_raw_parts_mut(
            whole.cast::<u8>().wrapping_byte_add(off).cast::<T>(),
            n,
        );
        // SAFETY: `sub` covers `off..off + len`, which was checked to lie inside the BAR mapping
        // that `view` represents, and is aligned for `T` (BAR mappings are page aligned and `off`
        // is a multiple of `T`'s alignment), so it is a valid projection of `view`.
        Ok(unsafe { MmioBackend::project_view(view, sub) })
    }

    /// Writes `bytes` at device address `addr` (one `memcpy_toio()`).
    ///
    /// # Errors
    ///
    /// `ERANGE` if the range does not lie inside BAR4.
    pub(crate) fn write(&self, addr: u64, bytes: &[u8]) -> Result {
        self.slice::<u8>(addr, bytes.len())?.copy_from_slice(bytes);
        Ok(())
    }

    /// Writes zeros over `len` bytes at device address `addr`.
    ///
    /// # Errors
    ///
    /// `ERANGE` if the range does not lie inside BAR4; nothing is written then.
    pub(crate) fn zero(&self, addr: u64, len: u64) -> Result {
        let n = usize::try_from(len).map_err(|_| ERANGE)?;
        let whole = self.slice::<u8>(addr, n)?;
        let mut at = 0;
        while at < n {
            let k = (n - at).min(ZERO_CHUNK);
            // PANIC: `at + k <= n`, the view's length; `k <= ZERO_CHUNK`.
            kernel::io::io_project!(whole, [panic: at..at + k]).copy_from_slice(&ZEROS[..k]);
            at += k;
        }
        Ok(())
    }
}
