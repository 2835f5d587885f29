// SPDX-License-Identifier: GPL-2.0

//! The device-memory cgroup controller (`CONFIG_CGROUP_DMEM`, `<linux/cgroup_dmem.h>`), which
//! Linux 7.3's Rust does not wrap: a device's HBM as a dmem region, and charges of ranges of it
//! to the allocating task's cgroup (`dmem.max`, `dmem.current`). C in `rust/kfac/dmem.c`.
//!
//! A kernel without the controller registers no region ([`DmemRegion::register`] returns
//! `None`): nothing is charged then.

use core::{ffi::c_void, ptr::NonNull};
use kernel::{error::to_result, prelude::*};

super::generated! { include!("dmem_generated.rs"); }

/// A registered dmem region (`struct dmem_cgroup_region`), unregistered on drop. Charges taken
/// from it ([`DmemCharge`]) hold their own references and may outlive it.
pub(crate) struct DmemRegion(NonNull<c_void>);

// SAFETY: the region is only passed to the dmem controller's functions, which lock internally
// and may be called from any task.
unsafe impl Send for DmemRegion {}
// SAFETY: as for `Send`: `try_charge` only reads the region pointer.
unsafe impl Sync for DmemRegion {}

impl DmemRegion {
    /// Registers region `name` (as `dmem.capacity` lists it) of `size` bytes; `None` when the
    /// kernel has no dmem controller.
    ///
    /// # Errors
    ///
    /// `ENOMEM`, or another error of `dmem_cgroup_register_region()`.
    pub(crate) fn register(size: u64, name: &CStr) -> Result<Option<Self>> {
        let mut region = core::ptr::null_mut();
        // SAFETY: `name` is a NUL-terminated string valid for the call (the controller copies
        // it); `region` is a valid out pointer.
        to_result(unsafe {
            ffi::neuron_udma_dmem_register(size, name.as_char_ptr(), &mut region)
        })?;
        Ok(NonNull::new(region).map(Self))
    }

    /// Charges `bytes` of this region to the current task's cgroup, given back when the
    /// returned charge is dropped.
    ///
    /// # Errors
    ///
    /// `EDQUOT` if the charge would take the cgroup, or one of its ancestors, past its
    /// `dmem.max` for this region; `ENOMEM`. Nothing is charged then.
    pub(crate) fn try_charge(&self, bytes: u64) -> Result<DmemCharge> {
        let mut pool = core::ptr::null_mut();
        // SAFETY: `self.0` is a registered region (unregistered only by `drop`); `pool` is a
        // valid out pointer.
        to_result(unsafe { ffi::neuron_udma_dmem_try_charge(self.0.as_ptr(), bytes, &mut pool) })?;
        Ok(DmemCharge {
            pool: NonNull::new(pool),
            bytes,
        })
    }
}

impl Drop for DmemRegion {
    fn drop(&mut self) {
        // SAFETY: `self.0` was registered by `register` and is unregistered once, here.
        unsafe { ffi::neuron_udma_dmem_unregister(self.0.as_ptr()) };
    }
}

/// Bytes of device memory and, unless the device has no region, their charge to a cgroup
/// (`struct dmem_cgroup_pool_state`), given back on drop. Holds a reference to the pool (and
/// through it to the region).
pub(crate) struct DmemCharge {
    /// The charged pool; `None` for bytes charged to nothing ([`Self::none`]).
    pool: Option<NonNull<c_void>>,
    bytes: u64,
}

// SAFETY: uncharging takes the pool's own locks and references; any task may do it.
unsafe impl Send for DmemCharge {}
// SAFETY: a shared `DmemCharge` offers nothing but its size.
unsafe impl Sync for DmemCharge {}

impl DmemCharge {
    /// `bytes` charged to no cgroup (a device without a dmem region).
    pub(crate) fn none(bytes: u64) -> Self {
        Self { pool: None, bytes }
    }

    /// Bytes charged.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for DmemCharge {
    fn drop(&mut self) {
        if let Some(pool) = self.pool {
            // SAFETY: `pool` and `bytes` are those of the successful charge, given back once,
            // here.
            unsafe { ffi::neuron_udma_dmem_uncharge(pool.as_ptr(), self.bytes) };
        }
    }
}
