// SPDX-License-Identifier: GPL-2.0

//! sysfs files Linux 7.3's Rust cannot create (C in `rust/kfac/sysfs.c`): [`UsageAttrs`], the
//! read-only usage counters of a bound device, and the module parameters, registered in C
//! because 7.3's `module!` macro registers Rust parameters with perm 0 (never in sysfs):
//! [`dma_channels`], [`device_rings_by_engine`], [`max_buffers`].

use kernel::prelude::*;

super::generated! { include!("sysfs_generated.rs"); }

/// How many counters [`UsageAttrs::add`] publishes (`NEURON_UDMA_USAGE_NR`).
pub(crate) const USAGE_NR: usize = ffi::NEURON_UDMA_USAGE_NR as usize;

/// The sysfs group of a device's usage counters (`neuron_udma/` under the PCI device,
/// `Documentation/ABI/testing/sysfs-driver-neuron_udma`), removed on drop.
///
/// # Invariants
///
/// The group was created by `neuron_udma_usage_add` and not removed yet.
pub(crate) struct UsageAttrs(core::ptr::NonNull<ffi::neuron_udma_usage>);

// SAFETY: the group is an address; removing it works from any task.
unsafe impl Send for UsageAttrs {}
// SAFETY: no method takes `&self`.
unsafe impl Sync for UsageAttrs {}

impl UsageAttrs {
    /// Publishes the counters `vals` (in the order of `rust/kfac/sysfs.c`'s names) as read-only
    /// files of `dev`.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, or the error of `sysfs_create_group()`.
    ///
    /// # Safety
    ///
    /// Every pointer of `vals` stays valid (and aligned) until the returned value is dropped.
    pub(crate) unsafe fn add(
        dev: &kernel::device::Device<kernel::device::Bound>,
        vals: &[*const u64; USAGE_NR],
    ) -> Result<Self> {
        let raw = super::raw_device(dev);
        // SAFETY: `raw` is the bound device `dev`; `vals` holds the C side's count of pointers,
        // valid for as long as the group exists (per the contract).
        let p = unsafe { ffi::neuron_udma_usage_add(raw, vals.as_ptr()) };
        let p = kernel::error::from_err_ptr(p)?;
        // INVARIANT: created now.
        core::ptr::NonNull::new(p).map(Self).ok_or(ENOMEM)
    }
}

impl Drop for UsageAttrs {
    fn drop(&mut self) {
        // SAFETY: by the type invariant created and not removed; removed once, here.
        unsafe { ffi::neuron_udma_usage_remove(self.0.as_ptr()) };
    }
}

/// The `dma_channels` module parameter (dmaengine channels per device, as given at load; the
/// provider clamps it), read-only in `/sys/module/neuron_udma/parameters/`.
pub(crate) fn dma_channels() -> u32 {
    // SAFETY: reads an integer module parameter.
    unsafe { ffi::neuron_udma_dma_channels() }
}

/// The `device_ring_fill` module parameter: whether the descriptors of a queue whose rings are
/// in device memory are moved there by the engine (`engine`) rather than written through BAR4
/// (`bar4`); read when such a queue is created, writable at run time in
/// `/sys/module/neuron_udma/parameters/`.
pub(crate) fn device_rings_by_engine() -> bool {
    // SAFETY: reads a module parameter.
    unsafe { ffi::neuron_udma_device_rings_by_engine() }
}

/// The `max_buffers` module parameter: the most live buffers one open file may hold (1 to
/// 2^20, default 65536; `/sys/module/neuron_udma/parameters/max_buffers`, writable by root).
pub(crate) fn max_buffers() -> u32 {
    // SAFETY: reads an integer module parameter.
    unsafe { ffi::neuron_udma_max_buffers() }
}
